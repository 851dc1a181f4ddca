#!/usr/bin/env python
"""What kv.prefix_index costs in simulator time: bench_sim.py's Azure case under each policy.

    python benchmarks/prefix_index_cost.py [--repeat 3] [--chunked] [--eager]

Runs case (a) of benchmarks/bench_sim.py (the Azure LLM inference 2023 conversation trace, 19,366
requests, prefix caching on) once per policy and repeat, each run in a fresh process, and prints CPU
seconds (min and median), wall seconds and the evictions and prefix hits of the run. Policies:
foresight (only blocks a later request will match) and all (every full block cached, LRU, vLLM's
policy and the default). --eager adds `all` with sim.core.kv.LAZY_PRIVATE off (every full block
hashed as it fills): same results, the cost of doing it plainly. Run by hand (under nice), never by
the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import bench_sim as b
if sys.argv[4] == "eager":
    import sim.core.kv as kv
    kv.LAZY_PRIVATE = False
sc = b.azure_scenario(sys.argv[2], chunked=sys.argv[5] == "chunked")
sc["kv"]["prefix_index"] = sys.argv[3]
r = b.measured_run(sc)
s = r["summary"]
print(json.dumps({"cpu_s": r["cpu_s"], "wall_s": r["wall_s"], "requests": r["requests"],
                  "evictions": s.get("evictions"), "hit_tokens": s.get("prefix_hit_tokens")}))
'''


def run(trace: Path, policy: str, mode: str, variant: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(trace), policy, mode, variant],
                         capture_output=True, text=True, cwd=REPO)
    if out.returncode:
        raise SystemExit(f"prefix_index_cost: the {policy} run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data",
                    help="folder holding traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
    ap.add_argument("--repeat", type=int, default=3, help="runs per policy, alternating (default 3)")
    ap.add_argument("--chunked", action="store_true", help="bench_sim's chunked-prefill variant of the case")
    ap.add_argument("--eager", action="store_true", help="also all with every block hashed as it fills")
    args = ap.parse_args(argv)
    trace = args.data_dir / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    if not trace.is_file():
        print(f"prefix_index_cost: the Azure conversation trace is missing: {trace}", file=sys.stderr)
        return 2
    variant = "chunked" if args.chunked else "continuous"
    modes = [("foresight", "lazy"), ("all", "lazy")] + ([("all", "eager")] if args.eager else [])
    runs: dict[tuple, list[dict]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for m in modes:
            r = run(trace, *m, variant)
            runs[m].append(r)
            print(f"  run {i + 1}: {m[0]:<9} {m[1]:<5} {r['cpu_s']:6.2f} CPU-s {r['wall_s']:6.2f} s wall",
                  file=sys.stderr, flush=True)
    print(f"Azure conversation trace ({variant}), {args.repeat} run(s) per policy:")
    print(f"{'policy':<18}{'requests':>10}{'CPU-s min':>11}{'median':>9}{'wall min':>10}{'evictions':>12}{'hit tokens':>12}")
    for (pol, mode), rs in runs.items():
        cpu = [r["cpu_s"] for r in rs]
        print(f"{pol + ('' if mode == 'lazy' else ' (eager)'):<18}{rs[0]['requests']:>10,}{min(cpu):>11.2f}"
              f"{statistics.median(cpu):>9.2f}{min(r['wall_s'] for r in rs):>10.2f}{rs[0]['evictions']:>12,}"
              f"{rs[0]['hit_tokens']:>12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
