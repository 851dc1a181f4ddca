"""Torch timing of the iteration shapes of a grid on one device; resumable; writes the fitted profile.

Per shape: prepare inputs and a KV cache outside the clock, warm up, then time `repeats` runs
(median and spread), rotating token ids and, when memory allows, between two KV cache copies so
that caches do not flatter the numbers. CUDA may replay decode shapes as CUDA graphs captured at
padded batch sizes (vLLM's capture sizes). A shape that runs out of memory is recorded and skipped.
Every finished point is appended to the raw CSV at once; a rerun skips the points already there.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from calibration import fit as fitmod
from calibration.model import ATTENTION, DTYPES, ReferenceModel
from calibration.points import PointsLock, append_point, read_points, repair_tail, start_points
from calibration.shapes import Shape, grid_shapes
from calibration.advice import loaded_machine_warning
from calibration.timing import (Clock, available_memory_bytes, check_device, device_name, driver_version, is_oom,
                                measure_ceilings, median_and_spread, synchronize, total_memory_bytes)
from sim.api import ModelSpec, check_out_file
from sim.api import FittedProfile, HardwareProfile, ModelProfile

# vLLM's default decode capture sizes: 1, 2, 4, then multiples of 8 up to 512
CAPTURE_SIZES = [1, 2, 4] + list(range(8, 513, 8))
# meta fields that must match for a run to resume from an existing points file
RESUME_KEYS = ("model", "device", "dtype", "cuda_graphs", "layers_timed", "layers_total", "seed", "clock")


@dataclass
class RunConfig:
    """One `capsim calibrate` run: the model, device, dtype, grid, output and timing settings."""

    model: ModelProfile
    device: str
    dtype: str
    grid: str
    out: Path
    layers: int | None = None
    hardware: HardwareProfile | None = None
    cuda_graphs: bool = False
    attention: str = "torch"               # "no-cudnn": SDPA without cuDNN's kernels (CUDA; model.ATTENTION)
    repeats: int | None = None
    max_repeats: int | None = None         # more repeats (up to this) while the times spread widely
    warmup: int | None = None
    seed: int = 0
    max_points: int | None = None          # measure at most this many new points, then stop (resume later)
    shapes: list[Shape] | None = None      # instead of the named grid (tests)
    matmul_n: int | None = None            # ceiling sizes (tests use small ones)
    copy_bytes: int | None = None
    threads: int | None = None             # torch CPU threads (default: torch's choice)
    clock: str = "wall"                    # "thread": CPU time of the one torch thread (shared CPUs)
    command: str | None = None             # the command line, for provenance
    stream: object = None                  # progress and messages (default: sys.stderr at run time)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.cuda_graphs and self.device != "cuda":
            raise ValueError("--cuda-graphs needs --device cuda")
        if self.attention not in ATTENTION:
            raise ValueError(f"--attention {self.attention!r}: expected one of {', '.join(ATTENTION)}")
        if self.attention != "torch" and self.device != "cuda":
            raise ValueError(f"--attention {self.attention} needs --device cuda (cuDNN attention is CUDA's)")
        self.out = Path(self.out)
        if self.stream is None:
            self.stream = sys.stderr
        if self.repeats is None:
            self.repeats = 3 if self.device == "cpu" else 5
        if self.warmup is None:
            self.warmup = 1 if self.device == "cpu" else 2
        if self.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if self.max_repeats is None:
            self.max_repeats = 3 * self.repeats
        self.max_repeats = max(self.max_repeats, self.repeats)

    @property
    def device_tag(self) -> str:
        if self.hardware is not None:
            return self.hardware.name
        if self.device == "cuda":
            name = torch.cuda.get_device_name().lower()
            return "cuda-" + "".join(c if c.isalnum() or c == "." else "-" for c in name).strip("-")
        return self.device

    def profile_path(self) -> Path:
        """The profile YAML this run writes: --out itself, or
        <device>__<model>__<dtype>[__graphs][__no-cudnn].yaml in it."""
        if self.out.suffix in (".yaml", ".yml"):
            return self.out
        stem = (f"{self.device_tag}__{self.model.name}__{self.dtype}" + ("__graphs" if self.cuda_graphs else "")
                + ("" if self.attention == "torch" else f"__{self.attention}"))
        return self.out / f"{stem}.yaml"


@dataclass
class RunResult:
    """What a calibration run produced: the files, the profile (None when stopped early) and counts."""

    profile_path: Path
    points_path: Path
    profile: FittedProfile | None       # None when stopped early (max_points) or nothing measured
    report: fitmod.FitReport | None
    measured_now: int
    skipped: int
    meta: dict
    remaining: int = 0


class Progress:
    """One line per point on stderr (rewritten in place on a terminal)."""

    def __init__(self, stream, total: int):
        self.stream, self.total, self.t0, self.done = stream, total, time.perf_counter(), 0
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def update(self, key: str, status: str, time_s: float | None) -> None:
        """Redraw the progress line after another measured point."""
        self.done += 1
        el = time.perf_counter() - self.t0
        eta = el / self.done * (self.total - self.done)
        what = f"{time_s * 1e3:10.2f} ms" if time_s is not None else f"{status:>13}"
        line = f"[{self.done:>4}/{self.total}] {key:<44} {what}  elapsed {el:6.0f} s  eta {eta:6.0f} s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Memory planning


def _layer_param_bytes(p: ModelProfile, elem: int) -> int:
    q, kv = p.num_attention_heads * p.head_dim, p.num_kv_heads * p.head_dim
    return elem * (p.hidden_size * (q + 2 * kv) + q * p.hidden_size + 3 * p.hidden_size * p.intermediate_size)


def _activation_bytes(p: ModelProfile, shape: Shape, elem: int) -> int:
    """Rough upper estimate of the transient memory of one forward (math attention keeps fp32 scores)."""
    T = shape.features["new_tokens"]
    q, kv = p.num_attention_heads * p.head_dim, p.num_kv_heads * p.head_dim
    per_token = (4 * p.hidden_size + q + 2 * kv + 3 * p.intermediate_size) * elem * 2
    scores = sum(g.count * p.num_attention_heads * g.new * (g.cached + g.new) * 4 * 2 for g in shape.groups)
    kv_expand = sum(g.count * p.num_attention_heads * (g.cached + g.new) * p.head_dim * elem * 2
                    for g in shape.groups if p.num_kv_heads != p.num_attention_heads)
    logits = shape.num_seqs * p.vocab_size * 4
    return int(1.2 * (T * per_token + scores + kv_expand + logits))


def plan_layers(p: ModelProfile, dtype: str, shapes: list[Shape], available: int | None) -> int:
    """All layers when weights + the largest shape's KV and activations fit in 90% of `available`;
    otherwise the most layers that do (at least 1): their time is then scaled to the whole model."""
    if available is None:
        return p.num_layers
    elem = DTYPES[dtype].itemsize
    per_layer = _layer_param_bytes(p, elem)
    kv_tok = 2 * p.num_kv_heads * p.head_dim * elem
    fixed = p.vocab_size * p.hidden_size * elem * (1 if p.tie_word_embeddings else 2)
    act = max((_activation_bytes(p, s, elem) for s in shapes), default=0)
    kv_max = max((s.kv_slots for s in shapes), default=0) * kv_tok
    budget = 0.9 * available - fixed - act
    fit = int(budget // (per_layer + kv_max)) if per_layer + kv_max > 0 else p.num_layers
    return max(1, min(p.num_layers, fit))


# ---------------------------------------------------------------------------------------------
# One point


class Runner:
    """Holds the model and measures shapes on it."""

    def __init__(self, cfg: RunConfig, layers_timed: int, roof: fitmod.Roofline):
        self.cfg, self.roof = cfg, roof
        self.device = cfg.device
        self.layers_total = cfg.model.num_layers
        self.layers_timed = layers_timed
        self.scale = self.layers_total / layers_timed
        self.model = ReferenceModel(cfg.model, cfg.dtype, cfg.device, layers_timed, seed=cfg.seed,
                                    attention=cfg.attention)
        self.model.eval()
        synchronize(self.device)
        self.weights_allocated = torch.cuda.memory_allocated() if self.device == "cuda" else None

    def _generator(self, i: int, device: str) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.cfg.seed * 1_000_003 + i)

    def precheck(self, shape: Shape) -> str | None:
        """On CPU an allocation past physical memory is not an exception but the OOM killer: refuse first."""
        if self.device != "cpu":
            return None
        avail = available_memory_bytes("cpu")
        if avail is None:
            return None
        elem = DTYPES[self.cfg.dtype].itemsize
        kv = shape.kv_slots * 2 * self.cfg.model.num_kv_heads * self.cfg.model.head_dim * elem * self.layers_timed
        need = kv + _activation_bytes(self.cfg.model, shape, elem)
        if need > 0.9 * avail:
            return f"needs about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available: not run"
        return None

    def _graphed(self, batch, cache, ids: list, n_ids: int, clock: Clock, split: bool):
        """Capture the decode step as CUDA graphs (the whole model, and its timed layers when only some
        run); return the timed replay `run(r) -> (total, layers)` and the graph pool's bytes."""
        model, dev = self.model, self.device
        static_ids = ids[0].clone()
        static_x = model.embed_tokens(static_ids)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(static_ids, batch, cache)
        torch.cuda.current_stream().wait_stream(side)
        synchronize(dev)
        reserved0 = torch.cuda.memory_reserved()
        g_full = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_full):
            model(static_ids, batch, cache)
        g_layers = None
        if split:
            g_layers = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g_layers):
                model.run_layers(static_x, batch, cache)
        synchronize(dev)
        graph_pool = torch.cuda.memory_reserved() - reserved0

        def run(r: int) -> tuple[float, float | None]:
            static_ids.copy_(ids[r % n_ids])
            clock.start()
            g_full.replay()
            total = clock.stop()[0]
            if g_layers is None:
                return total, None
            clock.start()
            g_layers.replay()
            return total, clock.stop()[0]
        return run, graph_pool

    def measure(self, shape: Shape, index: int) -> dict:
        """Time one shape: inputs and KV prepared outside the clock, warm-ups, then the timed repeats."""
        cfg, model, dev = self.cfg, self.model, self.device
        # Under CUDA graphs a decode batch runs padded to a capture size, and the features written are the
        # padded batch's (what ran): the simulator pads to step_time.graph_sizes before evaluating the profile.
        graphs = cfg.cuda_graphs and shape.kind == "decode" and shape.num_seqs <= CAPTURE_SIZES[-1]
        padded = next(s for s in CAPTURE_SIZES if s >= shape.num_seqs) if graphs else shape.num_seqs
        run_shape = shape.padded(padded) if graphs else shape
        gen_dev = self._generator(index, dev)
        gen_cpu = self._generator(index, "cpu")
        batch = model.prepare(run_shape)
        cache = model.new_cache(run_shape, gen_dev)
        kv_bytes = cache.nbytes
        avail = available_memory_bytes(dev)
        # a second KV copy (rotated between repeats) when it is small next to free memory
        caches = [cache]
        if not graphs and avail is not None and kv_bytes * 4 < avail and kv_bytes < (1 << 30):
            caches.append(model.new_cache(run_shape, gen_dev))
        n_ids = min(cfg.warmup + cfg.repeats, 8)
        ids = [model.token_ids(batch, gen_cpu) for _ in range(n_ids)]
        split = self.layers_timed < self.layers_total
        clock = Clock(dev, cfg.clock)
        walls: list[float] = []
        graph_pool = None
        if dev == "cuda":
            synchronize(dev)
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if dev == "cuda" else None

        if graphs:
            run, graph_pool = self._graphed(batch, cache, ids, n_ids, clock, split)
        else:
            def run(r: int) -> tuple[float, float | None]:
                c = caches[r % len(caches)]
                clock.start()
                model(ids[r % n_ids], batch, c, mark=clock.mark if split else None)
                seg = clock.stop()
                return (sum(seg), seg[1]) if split else (seg[0], None)

        for w in range(cfg.warmup):
            run(w)
        totals, layer_times = [], []

        def scaled() -> list[float]:
            return [t + lt * (self.scale - 1.0) for t, lt in zip(totals, layer_times)] if split else list(totals)

        r = 0
        while r < cfg.repeats or (r < cfg.max_repeats and _unsettled(scaled())):
            total, layers = run(cfg.warmup + r)
            walls.append(clock.last_wall_s)
            totals.append(total)
            if layers is not None:
                layer_times.append(layers)
            r += 1
        times = scaled()
        act_peak = None
        if dev == "cuda":
            synchronize(dev)
            act_peak = torch.cuda.max_memory_allocated() - base
        stats = median_and_spread(times)
        row = dict(key=shape.key, kind=shape.kind, status="ok", padded_seqs=padded, repeats=len(times),
                   host_load=_load1(), wall_s=statistics.median(walls) if cfg.clock != "wall" else None,
                   times_s=";".join(f"{t:.6g}" for t in times), layers_timed=self.layers_timed,
                   time_layers_s=statistics.median(layer_times) if layer_times else None,
                   kv_cache_bytes=kv_bytes, act_peak_bytes=act_peak, graph_pool_bytes=graph_pool,
                   note="cuda graph" if graphs else None, **run_shape.features, **stats)
        obs = fitmod.Observation.from_row(row)
        row.update(flops=self.roof.flops(obs), bytes_read=self.roof.bytes_read(obs),
                   mfu=self.roof.mfu(obs), mbu=self.roof.mbu(obs))
        return row


def _unsettled(times: list[float]) -> bool:
    """More repeats help: the middle half of the times spreads over more than 10% of the median."""
    if len(times) < 3:
        return True
    st = median_and_spread(times)
    return (st["time_p75_s"] - st["time_p25_s"]) > 0.1 * st["time_s"]


def _load1() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _clear(device: str, collect: bool = False) -> None:
    """Release memory between points (CPU tensors are freed by reference counting already)."""
    if collect or device != "cpu":
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()


# ---------------------------------------------------------------------------------------------
# The run


def roofline_for(cfg: RunConfig, meta: dict) -> tuple[fitmod.Roofline, str]:
    """Peak FLOP/s and bandwidth for MFU/MBU: the hardware profile's datasheet figures when given
    (and the dtype has a datasheet peak), otherwise the ceilings measured on this device."""
    spec = ModelSpec(cfg.model)
    hw = cfg.hardware
    peak = bw = None
    src = []
    if hw is not None and cfg.dtype in ("bf16", "fp16"):
        peak = hw.peak_flops_per_s(cfg.dtype)
        src.append(f"peak {peak / 1e12:g} TFLOP/s from hardware profile {hw.name}")
    if hw is not None:
        bw = hw.bandwidth_bytes_per_s
        src.append(f"bandwidth {bw / 1e9:g} GB/s from hardware profile {hw.name}")
    if peak is None and meta.get("matmul_tflops"):
        peak = float(meta["matmul_tflops"]) * 1e12
        src.append(f"peak {peak / 1e12:.4g} TFLOP/s = measured matmul ceiling (no datasheet peak)")
    if bw is None and meta.get("copy_gbs"):
        bw = float(meta["copy_gbs"]) * 1e9
        src.append(f"bandwidth {bw / 1e9:.4g} GB/s = measured copy ceiling (no datasheet figure)")
    return fitmod.Roofline(spec, cfg.dtype, peak, bw), "; ".join(src)


def _meta_for(cfg: RunConfig, layers_timed: int) -> dict:
    return dict(model=cfg.model.name, device=cfg.device, device_name=device_name(cfg.device), dtype=cfg.dtype,
                cuda_graphs=str(cfg.cuda_graphs).lower(), attention=cfg.attention, layers_timed=layers_timed,
                layers_total=cfg.model.num_layers, seed=cfg.seed, torch=torch.__version__,
                driver=driver_version(cfg.device), threads=torch.get_num_threads(),
                hardware=cfg.hardware.name if cfg.hardware else None, clock=cfg.clock, loadavg_start=_loadavg())


def _loadavg() -> str | None:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return None


def calibrate(cfg: RunConfig) -> RunResult:
    """Measure the grid (resuming from the points CSV), fit, write the profile. Raises ValueError on a
    bad configuration or when another run writes the same points; KeyboardInterrupt passes through
    after the finished points are on disk."""
    check_device(cfg.device)  # before anything asks the device its name (CPU-only torch: an AssertionError)
    check_out_file(cfg.profile_path(), force=True)  # a rerun resumes and rewrites it; the place must be writable
    with PointsLock(cfg.profile_path().with_suffix(".csv")):
        return _calibrate(cfg)


def _resume_or_start(cfg: RunConfig, shapes: list, pts_path: Path, out) -> tuple[dict, set]:
    """The points file's meta and finished keys: read back from an existing file of the same settings
    (refusing one of other settings), or a new run's meta with the device's measured ceilings."""
    if pts_path.exists():
        repair_tail(pts_path)
        existing = read_points(pts_path)
        meta = existing.meta
        layers_timed = cfg.layers or int(meta.get("layers_timed", cfg.model.num_layers))
        want = _meta_for(cfg, layers_timed)
        bad = [k for k in RESUME_KEYS if str(want[k]) != meta.get(k, "")]
        if (meta.get("attention") or "torch") != cfg.attention:   # files from before the key mean torch's choice
            bad.append("attention")
        if bad:
            diffs = ", ".join(f"{k}: file {(meta.get(k) or 'torch') if k == 'attention' else meta.get(k)!r}, "
                              f"now {str(want[k])!r}" for k in bad)
            raise ValueError(f"{pts_path}: points from a different run ({diffs}); a rerun resumes only the "
                             "same settings: use another --out (e.g. out/profiles/) or delete the file")
        done = existing.done_keys
        print(f"resuming: {len(done)} points already in {pts_path}", file=out)
    else:
        if cfg.layers:
            layers_timed = cfg.layers
        else:
            weights_free = available_memory_bytes(cfg.device)
            layers_timed = plan_layers(cfg.model, cfg.dtype, shapes, weights_free)
        if not 1 <= layers_timed <= cfg.model.num_layers:
            raise ValueError(f"--layers {layers_timed}: model {cfg.model.name} has {cfg.model.num_layers} layers")
        meta = _meta_for(cfg, layers_timed)
        print(f"measuring ceilings on {meta['device_name']} ...", file=out)
        warning = loaded_machine_warning(cfg.device, cfg.clock)
        if warning:
            print(warning, file=out)
        c = measure_ceilings(cfg.device, cfg.dtype, cfg.matmul_n, cfg.copy_bytes, clock=cfg.clock)
        meta.update(matmul_tflops=f"{c.matmul_tflops:.6g}", matmul_n=c.matmul_n, copy_gbs=f"{c.copy_gbs:.6g}",
                    copy_bytes=c.copy_bytes, total_memory_bytes=total_memory_bytes(cfg.device))
        meta = {k: ("" if v is None else str(v)) for k, v in meta.items()}
        done = set()
    return meta, done


def _calibrate(cfg: RunConfig) -> RunResult:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    Clock(cfg.device, cfg.clock)   # refuses a thread clock with several threads or off the CPU
    if cfg.device == "cpu":
        torch.set_flush_denormal(True)
    shapes = cfg.shapes if cfg.shapes is not None else grid_shapes(cfg.grid, cfg.device, cfg.model)
    prof_path = cfg.profile_path()
    pts_path = prof_path.with_suffix(".csv")
    out = cfg.stream

    meta, done = _resume_or_start(cfg, shapes, pts_path, out)
    roof, roof_src = roofline_for(cfg, meta)
    pending = [s for s in shapes if s.key not in done]
    skipped = len(shapes) - len(pending)
    if cfg.max_points is not None:
        pending = pending[:cfg.max_points]
    runner = Runner(cfg, int(meta["layers_timed"]), roof) if pending else None
    if not pts_path.exists():
        if runner is not None:
            # what the allocator holds after building the model (CUDA), else the parameter tensors
            meta["weights_bytes"] = str(runner.weights_allocated or runner.model.param_bytes)
        start_points(pts_path, meta)
    measured = 0
    if runner is not None:
        if runner.layers_timed < runner.layers_total:
            print(f"timing {runner.layers_timed} of {runner.layers_total} layers; times scaled to the whole model",
                  file=out)
        progress = Progress(out, len(pending))
        index = {s.key: i for i, s in enumerate(shapes)}
        with torch.inference_mode():
            for shape in pending:
                row = _one_point(runner, shape, index[shape.key])
                append_point(pts_path, row)
                measured += 1
                progress.update(shape.key, row["status"], row.get("time_s"))
        del runner
        _clear(cfg.device)

    points = read_points(pts_path)
    wanted = {s.key for s in shapes}
    ok = [r for r in points.ok_rows if r["key"] in wanted]   # in file (measurement) order, as `capsim fit` reads it
    remaining = [s for s in shapes if s.key not in {r["key"] for r in points.rows}]
    if remaining or len(ok) < 2:
        return RunResult(prof_path, pts_path, None, None, measured, skipped, points.meta, len(remaining))
    obs = [fitmod.Observation.from_row(r) for r in ok]
    report = fitmod.fit_observations(obs, roof)
    profile = _profile(cfg, points.meta, report, roof, roof_src, ok, pts_path)
    header = (f"Fitted by `{cfg.command or 'capsim calibrate'}` on {fitmod.today()}.\n"
              f"Raw points: {pts_path.name} (same folder). Schema: sim.io.profiles.FittedProfile.")
    fitmod.write_profile(profile, prof_path, header)
    return RunResult(prof_path, pts_path, profile, report, measured, skipped, points.meta)


def _one_point(runner: Runner, shape: Shape, index: int) -> dict:
    base = dict(key=shape.key, kind=shape.kind, layers_timed=runner.layers_timed, **shape.features)
    why = runner.precheck(shape)
    if why:
        return dict(base, status="oom", note=why)
    try:
        return runner.measure(shape, index)
    except Exception as exc:  # noqa: BLE001 - only out-of-memory is recoverable; re-raised otherwise
        if not is_oom(exc):
            raise
        _clear(runner.device, collect=True)
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return dict(base, status="oom", note=f"out of memory: {msg}")
    finally:
        _clear(runner.device)


def _profile(cfg: RunConfig, meta: dict, report: fitmod.FitReport, roof: fitmod.Roofline, roof_src: str,
             rows: list[dict], pts_path: Path) -> FittedProfile:
    layers_timed = int(meta["layers_timed"])
    mfus = [r["mfu"] for r in rows if r.get("mfu") is not None]
    mbus = [r["mbu"] for r in rows if r.get("mbu") is not None]
    dec = [r for r in rows if r["kind"] == "decode"]
    pre = [r for r in rows if r["kind"] == "prefill"]
    notes = [
        f"Reference model: {cfg.model.name} architecture, seeded random weights in {cfg.dtype}, "
        f"torch threads: {meta.get('threads')}; timing "
        + ("CUDA events" if cfg.device == "cuda" else "perf_counter" if cfg.clock == "wall" else
           "the torch thread's CPU time (time.thread_time: time other processes held the core left out; "
           "wall_s in the CSV has the wall times)")
        + f"{' with CUDA-graph replay of decode at padded batch sizes' if cfg.cuda_graphs else ''}"
        + ("; attention: torch's SDPA choice" if cfg.attention == "torch" else
           "; attention: SDPA without cuDNN's kernels (flash, memory-efficient, math)") + "; "
        f"warm-up {cfg.warmup}, median of {cfg.repeats} repeats per point (up to {cfg.max_repeats} while the "
        "interquartile range exceeds 10% of the median); token ids (and KV copies where memory allows) rotated "
        "between repeats.",
        f"Measured ceilings ({cfg.dtype}): matmul {float(meta['matmul_tflops']):.4g} TFLOP/s "
        f"({meta.get('matmul_n')}^3), copy {float(meta['copy_gbs']):.4g} GB/s (read + write, "
        f"{int(meta.get('copy_bytes', 0)) / 2**20:.0f} MiB)"
        + (f"; datasheet: {cfg.hardware.bf16_dense_tflops.value:g} TFLOP/s dense BF16, "
           f"{cfg.hardware.memory_bandwidth_gbs.value:g} GB/s" if cfg.hardware
           else "; no datasheet (no hardware profile)")
        + ".",
        f"MFU/MBU use: {roof_src}. Efficiency model peak_tflops is that peak.",
        f"Load average (1, 5, 15 min) when the run started: {meta.get('loadavg_start') or 'n/a'}; "
        f"at the fit: {_loadavg() or 'n/a'} (other processes on the device make times noisier).",
        f"MFU: prefill {_range(r['mfu'] for r in pre)}, all points {_range(mfus)}; "
        f"MBU: decode {_range(r['mbu'] for r in dec)}, all points {_range(mbus)}.",
        "Held-out: a quarter of each kind (prefill, decode, mixed), picked by a hash of the shape among points "
        "inside the range of the rest; fitted on the rest. " + " ".join(line + "." for line in report.lines()),
    ]
    if layers_timed < cfg.model.num_layers:
        notes.append(f"Only {layers_timed} of {cfg.model.num_layers} layers fitted in memory and were timed; "
                     "each time is (whole run) + (layer segment) x (layers/timed - 1).")
    if cfg.device == "cuda":
        peaks = [r["act_peak_bytes"] for r in rows if r.get("act_peak_bytes") is not None]
        pools = [r["graph_pool_bytes"] for r in rows if r.get("graph_pool_bytes") is not None]
        notes.append(f"Memory (CUDA): weights {int(meta.get('weights_bytes') or 0) / 2**30:.2f} GiB; "
                     f"activation peak above weights + KV up to {max(peaks, default=0) / 2**30:.2f} GiB; "
                     f"graph pools up to {max(pools, default=0) / 2**30:.3f} GiB per captured shape "
                     "(per-shape values in the points CSV). KV budget as vLLM derives it: "
                     "utilization x total - weights - activation peak - graph pools.")
    return fitmod.build_profile(
        model=cfg.model.name, hardware=cfg.hardware.name if cfg.hardware else None, dtype=cfg.dtype,
        cuda_graphs=cfg.cuda_graphs, layers_timed=layers_timed if layers_timed < cfg.model.num_layers else None,
        linear=report.linear, efficiency=report.efficiency, valid_range=report.valid_range, fit=report.summary(),
        provenance=fitmod.provenance(
            source="capsim calibrate (calibration/harness.py): reference transformer timed in torch",
            date=fitmod.today(), device_name=meta.get("device_name"), torch_version=meta.get("torch"),
            driver_version=meta.get("driver") or None, git_commit=fitmod.git_commit(),
            grid=f"{cfg.grid} ({cfg.device} grid, {len(rows)} points measured)" if cfg.shapes is None
            else f"custom ({len(rows)} points)",
            points_csv=pts_path.name, notes="\n".join(notes)))


def _range(values) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    return f"{min(v):.1%}-{max(v):.1%} (median {statistics.median(v):.1%})"
