"""How much the first iteration of a new batch token count costs on vLLM's CPU build (run by hand).

    python benchmarks/vllm_shape_probe.py [--engine-python PATH] [--reps 6]

For each prompt length it sends one request at a time (`--reps` times, different token ids, 2 output
tokens) to an in-process vLLM engine built as the replay driver builds it (benchmarks/vllm/light.yaml's
settings, thread clock) and prints the engine thread's CPU time of each request's first step (the
whole prompt in one iteration). The first request of a length pays for building the GEMM kernels of that
token count (vLLM 0.32's CPU linear layers keep a oneDNN primitive per batch token count, 32 per layer);
its repeats do not. This is the cost the profile's `shape_cache` terms model (docs/validation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LENGTHS = (240, 201, 199, 173, 64, 77, 131, 240)


def probe(spec_path: str, reps: int) -> None:
    """Inside the engine's interpreter: time each request's first step."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.path.insert(0, str(REPO / "calibration" / "engines"))
    import torch
    import vllm_driver as D
    from vllm import SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    model_dir = Path(tempfile.mkdtemp(prefix="capsim-vllm-probe-"))
    (model_dir / "config.json").write_text(json.dumps(spec["hf_config"]))
    torch.set_num_threads(1)
    engine = D.build_engine(spec, model_dir)
    D.warm_up(engine, 2, spec["hf_config"]["vocab_size"])
    k = 0
    for n in LENGTHS:
        firsts = []
        for _ in range(reps):
            k += 1
            ids = [(131 * k + 7 * j) % 32000 + 100 for j in range(n)]
            engine.add_request(f"p{k}", {"prompt_token_ids": ids},
                               SamplingParams(max_tokens=2, ignore_eos=True, detokenize=False))
            steps = []
            while engine.has_unfinished_requests():
                c0 = time.thread_time()
                engine.step()
                steps.append((time.thread_time() - c0) * 1e3)
            firsts.append(steps[0])
        print(f"prompt {n:4d} tokens: first step of each request, ms: " + " ".join(f"{x:.1f}" for x in firsts),
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine-python")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--engine-spec", help=argparse.SUPPRESS)   # internal: run inside the engine's interpreter
    args = ap.parse_args(argv)
    if args.engine_spec:
        probe(args.engine_spec, args.reps)
        return 0
    sys.path.insert(0, str(REPO))
    from calibration.engines.vllm_replay import build_spec, engine_python
    from sim.api import load_scenario
    sc, base = load_scenario(REPO / "benchmarks" / "vllm" / "light.yaml", [])
    spec, _ = build_spec(sc, base, "thread")
    spec["engine"]["max_model_len"] = max(int(spec["engine"]["max_model_len"]), 1024)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        out = subprocess.run([str(engine_python(args.engine_python)), __file__, "--engine-spec", str(path),
                              "--reps", str(args.reps)], env=env, capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("prompt")]
    print("\n".join(lines) if lines else out.stderr[-3000:])
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
