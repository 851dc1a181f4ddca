"""Where a whole `capsim run` spends its time: py-spy (a sampling profiler, unbiased and light) over
the process, summarised as docs/benchmarks/profile-*.txt.

    python benchmarks/spy_profile.py --requests 100000 --out docs/benchmarks/profile-poisson100k-<commit>.txt

runs bench_sim.py's Poisson scenario (case b) cut to --requests requests at --rate (default: the rate
bench_sim.py derived, 21.61 req/s) with `kv.prefix_index: foresight` (as the comparison with 507ae7a
runs), the way a user does (`python -m capsim.cli run SCENARIO --out DIR --progress`), and writes the
shares of the samples: inclusive for the main phases, own time of the top functions, own time by
area of the code. Needs py-spy on PATH (`pip install py-spy`); it is a benchmark tool, not a
dependency of capsim.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_sim  # noqa: E402  (the benchmark's own scenario)

PHASES = ("_find_and_load", "Environment.run", "replica_loop", "arrivals", "Scheduler.plan", "Scheduler.commit",
          "Scheduler.fast_forward", "summarise", "Result.write")
WHOLE = [  # phases counted whole: every sample under them, whatever its innermost frame
    ("Result.write", "writing requests.csv and iterations.csv (Result.write: csvout.py, tables.py, numpy)"),
    ("summarise", "summary (sim/core/result.py, tables.py, numpy)"),
    ("_find_and_load", "imports"),
]
AREAS = [  # (label, test on (function, file path)); the first that matches a sample's innermost frame
    ("scheduler: plan, commit, fast-forward (sim/core/schedulers, step.py)",
     lambda f, p: "/schedulers/" in p or p.endswith("core/step.py")),
    ("KV block pool (sim/core/kv.py, kv_count.py)", lambda f, p: p.endswith(("core/kv.py", "core/kv_count.py"))),
    ("recorder and timeline (sim/core/metrics.py)", lambda f, p: p.endswith("metrics.py")),
    ("front end, router, Request objects (frontend.py, cluster.py, workload.py, request.py, dataclass __init__)",
     lambda f, p: p.endswith(("frontend.py", "cluster.py", "workload.py", "request.py")) or p == "<string>"),
    ("engine loop and arrivals (sim/core/engine.py)", lambda f, p: p.endswith("core/engine.py")),
    ("SimPy internals", lambda f, p: "/simpy/" in p),
    ("step-time model (sim/models)", lambda f, p: "/sim/models/" in p),
]
FRAME = re.compile(r"(.*) \((.*):(\d+)\)")


def _frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for f in stack.split(";"):
        m = FRAME.match(f)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def summarise(raw: Path, commit: str, what: str, top: int = 25) -> str:
    """The text of the profile file from py-spy's raw (collapsed stacks) output."""
    own, incl, area, total = collections.Counter(), collections.Counter(), collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames, n = _frames(stack), int(n)
        total += n
        if not frames:
            continue
        fn, path = frames[-1]
        own[fn] += n
        names = {f for f, _ in frames}
        whole = next((label for phase, label in WHOLE if phase in names), None)
        area[whole or next((label for label, test in AREAS if test(fn, path)), "other (numpy, builtins)")] += n
        for name in {f for f, _ in frames}:
            incl[name] += n
    pct = lambda n: f"{100 * n / max(total, 1):6.1f}%"  # noqa: E731
    lines = ["py-spy record --format raw (sampling, wall clock of the one thread) of",
             f"  python -m capsim.cli run <{what}> --out DIR --progress",
             f"at commit {commit}; share of {total} samples", "", "inclusive (a function and what it calls):"]
    lines += [f"  {pct(incl[p])}  {p}" for p in PHASES]
    lines += ["", f"own time, top {top}:"] + [f"  {pct(n)}  {f}" for f, n in own.most_common(top)]
    lines += ["", "own time by area (a sample counts where its innermost frame is; writing, summary and imports whole):"]
    lines += [f"  {pct(n)}  {a}" for a, n in area.most_common()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000, help="requests of the Poisson case (default 100,000)")
    ap.add_argument("--rate", type=float, default=21.61, help="arrival rate, req/s (default 21.61, bench_sim's)")
    ap.add_argument("--prefix-index", default="foresight", choices=["foresight", "all"])
    ap.add_argument("--samples-per-s", type=int, default=250)
    ap.add_argument("--out", required=True, help="the profile text file to write")
    args = ap.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("spy_profile: py-spy not found on PATH (pip install py-spy)")
    sc = bench_sim.synthetic_scenario(args.requests, args.rate)
    sc["kv"]["prefix_index"] = args.prefix_index
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    with tempfile.TemporaryDirectory() as tmp:
        scenario, raw = Path(tmp) / "scenario.yaml", Path(tmp) / "spy.raw"
        scenario.write_text(yaml.safe_dump(sc))
        print(f"spy_profile: {args.requests:,} Poisson requests at {args.rate} req/s ...", file=sys.stderr)
        subprocess.run(["py-spy", "record", "-r", str(args.samples_per_s), "-f", "raw", "-o", str(raw), "--",
                        sys.executable, "-m", "capsim.cli", "run", str(scenario), "--out", str(Path(tmp) / "out"),
                        "--progress"], cwd=HERE.parent, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        what = (f"bench_sim.py's Poisson scenario cut to {args.requests:,} requests at {args.rate} req/s, "
                f"kv.prefix_index {args.prefix_index}")
        Path(args.out).write_text(summarise(raw, commit, what))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
