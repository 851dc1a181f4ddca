"""Why a replay on CUDA runs slower the first time it meets an iteration shape (a diagnostic, by hand).

The H200 validation (docs/validation.md, "On an H200") replayed the same 48 requests at 1 then 4 req/s in
one process; identical per-request decode shapes took about twice as long in the first replay. This
times the reference model's pieces on shapes seen for the first time and again, one layer of the
model's architecture:

- a decode step of one sequence at each context length L (a new attention shape per L);
- the same steps again (every shape now seen);
- a projection (F.linear) at each token count M, first and second time;
- a prefill chunk after a cached prefix (masked attention) at each chunk length, first and second time.

It also says which SDPA backends are enabled and whether the flash backend alone runs the decode and
the masked-chunk attention (meaningful under `--attention torch` only: `no-cudnn` sets its own list). Prints one line per measurement; `--out` writes the same as CSV.

    python benchmarks/device/first_shapes.py --model qwen3-8b --out first_shapes.csv
    python benchmarks/device/first_shapes.py --model qwen3-8b --attention no-cudnn --out first_shapes.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from calibration.model import ReferenceModel
from calibration.shapes import Shape
from calibration.timing import synchronize
from sim.api import load_model


def _time(fn, device: str) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def _forward(model: ReferenceModel, shape: Shape):
    batch = model.prepare(shape)
    cache = model.new_cache(shape)
    ids = torch.zeros(batch.tokens, dtype=torch.long, device=model.device)
    return lambda: model(ids, batch, cache)


def _passes(name: str, sizes: list[int], make, device: str, rows: list[dict]) -> None:
    """Time make(size)() for every size, twice over; the first pass meets each shape for the first time."""
    for rnd in ("first", "second"):
        times = []
        for s in sizes:
            fn = make(s)
            times.append(_time(fn, device))
        rows.append(dict(what=name, round=rnd, n=len(times), median_ms=statistics.median(times) * 1e3,
                         mean_ms=statistics.fmean(times) * 1e3, max_ms=max(times) * 1e3))
        print(f"{name:<28} {rnd:<6} n={len(times):>4} median {rows[-1]['median_ms']:8.3f} ms  "
              f"mean {rows[-1]['mean_ms']:8.3f} ms  max {rows[-1]['max_ms']:8.3f} ms", flush=True)


def _flash_only(model: ReferenceModel, shape: Shape) -> str:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fn = _forward(model, shape)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            fn()
        synchronize(model.device.type)
        return "runs"
    except RuntimeError as exc:
        return "refused: " + str(exc).splitlines()[0][:160]


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; print them and optionally write a CSV."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--count", type=int, default=120, help="shapes per measurement")
    ap.add_argument("--attention", choices=("torch", "no-cudnn"), default="torch",
                    help="the reference model's attention kernels (calibration.model.ATTENTION)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    model = ReferenceModel(load_model(a.model), a.dtype, a.device, num_layers=1, attention=a.attention).eval()
    dev = a.device
    rows: list[dict] = []
    if dev == "cuda":
        b = torch.backends.cuda
        print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: flash {b.flash_sdp_enabled()}, "
              f"mem_efficient {b.mem_efficient_sdp_enabled()}, math {b.math_sdp_enabled()}, "
              f"cudnn {b.cudnn_sdp_enabled()}", flush=True)
    with torch.inference_mode():
        for _ in range(3):
            _forward(model, Shape.of((1, 1, 999)))()
        base = 1000
        lengths = list(range(base, base + a.count))
        _passes("decode 1 seq, context L", lengths, lambda L: _forward(model, Shape.of((1, 1, L))), dev, rows)
        h = model.profile.hidden_size
        w = torch.randn(h, h, dtype=model.dtype, device=dev)
        xs = {m: torch.randn(m, h, dtype=model.dtype, device=dev) for m in range(1, a.count + 1)}
        _passes("linear, M tokens", list(xs), lambda m: (lambda: F.linear(xs[m], w)), dev, rows)
        chunks = list(range(200, 200 + a.count))
        _passes("chunk of n after 512", chunks, lambda n: _forward(model, Shape.of((1, n, 512))), dev, rows)
        if dev == "cuda" and a.attention == "torch":   # under no-cudnn the model's own kernel list overrides it
            for label, shape in (("decode", Shape.of((1, 1, 1000))), ("chunk after prefix", Shape.of((1, 64, 512))),
                                 ("prefill from 0", Shape.of((1, 64, 0)))):
                verdict = _flash_only(model, shape)
                print(f"flash backend alone, {label}: {verdict}", flush=True)
                rows.append(dict(what=f"flash only: {label}", round=verdict))
    if a.out:
        with open(a.out, "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=["what", "round", "n", "median_ms", "mean_ms", "max_ms"])
            wr.writeheader()
            wr.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
