"""Device clocks, ceiling measurements (matmul FLOP/s, copy bandwidth) and device facts, in torch.

CPU: perf_counter around synchronous work. CUDA: events on the current stream, read after
synchronising the end event. MPS: synchronise before each clock read. A clock splits one run into
segments with `mark()` so that a run of a layer subset can be scaled to the whole model.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch

from calibration.model import DTYPES


def check_device(device: str) -> None:
    """Raise ValueError naming the problem when `device` is not usable here."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch reports no CUDA device (torch.cuda.is_available() is False; "
                         f"torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("--device mps: torch reports no MPS device (torch.backends.mps.is_available() is False)")
    if device not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {device!r}: expected cpu, cuda or mps")


def synchronize(device: str) -> None:
    """Wait for the device's queued work (CUDA or MPS) before reading a clock."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


CLOCKS = ("wall", "thread")


class Clock:
    """start(), mark()..., stop() -> durations of the segments in seconds; `last_wall_s` is the
    wall time of the last start..stop.

    clock "thread" (CPU, one torch thread): CPU time of the calling thread (time.thread_time), which
    leaves out the time other processes hold the core; the work runs in the calling thread when torch
    has one thread. On a quiet machine it equals wall time for this CPU-bound work.
    """

    def __init__(self, device: str, clock: str = "wall"):
        if clock not in CLOCKS:
            raise ValueError(f"--clock {clock!r}: expected one of {', '.join(CLOCKS)}")
        if clock == "thread" and (device != "cpu" or torch.get_num_threads() != 1):
            raise ValueError("--clock thread measures one thread's CPU time: it needs --device cpu and --threads 1")
        self.device, self.clock = device, clock
        self._t: list = []
        self._w0 = 0.0
        self.last_wall_s = 0.0

    def _now(self):
        if self.device == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        if self.device == "mps":
            torch.mps.synchronize()
        return time.thread_time() if self.clock == "thread" else time.perf_counter()

    def start(self) -> None:
        """Start a timed region."""
        self._w0 = time.perf_counter()
        self._t = [self._now()]

    def mark(self) -> None:
        """Record an intermediate instant of the timed region."""
        self._t.append(self._now())

    def stop(self) -> list[float]:
        """End the region; the intervals between the instants, in seconds."""
        self._t.append(self._now())
        t = self._t
        if self.device == "cuda":
            t[-1].synchronize()
            self.last_wall_s = time.perf_counter() - self._w0
            return [a.elapsed_time(b) / 1e3 for a, b in zip(t, t[1:])]
        self.last_wall_s = time.perf_counter() - self._w0
        return [b - a for a, b in zip(t, t[1:])]


# ---------------------------------------------------------------------------------------------
# Ceilings


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of this device: best matmul FLOP/s and copy bandwidth."""
    matmul_tflops: float      # best of repeats, square matmul in the profile dtype
    matmul_n: int
    copy_gbs: float           # best of repeats, (read + write bytes) / time
    copy_bytes: int


def _best_time(fn, device: str, repeats: int, clock_kind: str = "wall") -> float:
    clock = Clock(device, clock_kind)
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        clock.start()
        fn()
        times.append(clock.stop()[0])
    return min(times)


def measure_ceilings(device: str, dtype: str, matmul_n: int | None = None, copy_bytes: int | None = None,
                     repeats: int = 5, clock: str = "wall") -> Ceilings:
    """Large dense matmul FLOP/s and device copy bandwidth (read + write), best of `repeats`."""
    td = DTYPES[dtype]
    if matmul_n is None:
        matmul_n = 8192 if device != "cpu" else 2048
    if copy_bytes is None:
        copy_bytes = (1 << 30) if device != "cpu" else (256 << 20)
    with torch.inference_mode():
        a = torch.randn(matmul_n, matmul_n, device=device).to(td)
        b = torch.randn(matmul_n, matmul_n, device=device).to(td)
        t = _best_time(lambda: torch.mm(a, b), device, repeats, clock)
        tflops = 2.0 * matmul_n ** 3 / t / 1e12
        del a, b
        n = copy_bytes // 4
        src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
        dst = torch.empty_like(src)
        t = _best_time(lambda: dst.copy_(src), device, repeats, clock)
        gbs = 2.0 * n * 4 / t / 1e9
        del src, dst
    return Ceilings(tflops, matmul_n, gbs, n * 4)


# ---------------------------------------------------------------------------------------------
# Device facts


def device_name(device: str) -> str:
    """The device's name as the driver reports it (the CPU model on CPU)."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "mps":
        return f"Apple {platform.machine()} (MPS), macOS {platform.mac_ver()[0]}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})"


def driver_version(device: str) -> str | None:
    """The driver / runtime version string of the device (None on CPU)."""
    if device == "cuda":
        cuda = f"CUDA runtime {torch.version.cuda}" if torch.version.cuda else f"HIP {torch.version.hip}"
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            drv = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            drv = None
        return f"driver {drv}, {cuda}" if drv else cuda
    if device == "mps":
        return f"macOS {platform.mac_ver()[0]}"
    return None


def available_memory_bytes(device: str) -> int | None:
    """Free memory the next allocation can use (CPU: MemAvailable; CUDA: cudaMemGetInfo)."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    if device == "mps":
        try:
            return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
        except AttributeError:
            return None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def total_memory_bytes(device: str) -> int | None:
    """The device's memory in bytes (None when unknown)."""
    if device == "cuda":
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    if device == "mps":
        try:
            return int(torch.mps.recommended_max_memory())
        except AttributeError:
            return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def is_oom(exc: BaseException) -> bool:
    """Out of memory on any backend (CUDA raises OutOfMemoryError; MPS and CPU a RuntimeError)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def median_and_spread(times: list[float]) -> dict[str, float]:
    """Median, min, max and quartiles of repeated timings."""
    s = sorted(times)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) >= 2 else [s[0]] * 3
    return dict(time_s=statistics.median(s), time_min_s=s[0], time_max_s=s[-1], time_p25_s=q[0], time_p75_s=q[2])
