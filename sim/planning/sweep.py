"""Parameter sweeps: the cross product of `--grid` axes, run in-process or fanned out over Dask.

    capsim sweep SCENARIO --grid key=v1,v2 [--grid ...] [--set ...] --out DIR [--workers N | --dask ADDRESS]

Every point is the scenario with the `--set` overrides and then the point's grid overrides applied
(values parsed as YAML, like `--set`), validated like `capsim run` would. A point is identified by
a stable key (the JSON of its overrides), so the results do not depend on which worker ran what or
in which order points finished: each point is an independent, seeded simulation.

Files in DIR:
  sweep.json   what was swept: the scenario (path and SHA-256 of its bytes), --set, the grid
  points.jsonl one JSON record per finished point, appended and flushed as each completes; a
               killed sweep run again with the same DIR skips every point already there
  results.csv  one row per point in grid order: `point`, one column per axis, every summary metric
               (nested keys flattened: ttft_s.p99 -> ttft_s_p99); results.parquet too with pyarrow
  sweep_<axis>.png  goodput and latency percentiles against each swept key

Dask is imported only when a sweep fans out (`import sim` stays light).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml

from sim.io.errors import ConfigError
from sim.io.notices import once_per_process
from sim.io.outputs import check_out_dir
from sim.planning.sweep_manifest import check_manifest as _check_manifest
from sim.planning.sweep_manifest import manifest as _manifest

Override = tuple[str, Any]


# ---- grid -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Axis:
    """One axis of a sweep grid: a dotted scenario key and the values it takes."""
    key: str
    values: tuple

    def label(self, value: Any) -> str:
        """"key=value" for one point of this axis."""
        return f"{self.key}={display_value(value)}"


def display_value(value: Any) -> Any:
    """A cell value: scalars as they are, mappings and lists as compact JSON."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return value


def parse_axis(text: str, flag: str = "--grid") -> Axis:
    """'scheduler.max_num_seqs=16,32,64' -> Axis('scheduler.max_num_seqs', (16, 32, 64)).

    The values are read as one YAML flow sequence, so each is parsed like a `--set` value and a
    mapping or list value keeps its commas: `slo={ttft_s: 1, e2e_s: 9},{ttft_s: 2, e2e_s: 9}`.
    """
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r}: expected dotted.key=v1,v2,...")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{flag} {text!r}: expected dotted.key=v1,v2,...")
    if not raw.strip() or (not re.search(r"[\[\]{}\"']", raw) and re.search(r"(^|,)\s*(,|$)", raw)):
        raise ConfigError(f"{flag} {text!r}: give at least one value, none empty")
    try:
        values = yaml.safe_load(f"[{raw}]")
    except yaml.YAMLError:
        raise ConfigError(f"{flag} {text!r}: values are not valid YAML (comma-separated, as for --set)") from None
    if not values or any(v is None for v in values):
        raise ConfigError(f"{flag} {text!r}: give at least one value, none empty")
    seen = set()
    for v in values:
        k = display_value(v)
        if k in seen:
            raise ConfigError(f"{flag} {key}: value {k!r} given twice")
        seen.add(k)
    return Axis(key, tuple(values))


def parse_axes(texts: Iterable[str | Axis], flag: str = "--grid") -> list[Axis]:
    """Parse every --grid/--search text into an Axis, refusing a key given twice."""
    axes = [t if isinstance(t, Axis) else parse_axis(t, flag) for t in texts]
    keys = [a.key for a in axes]
    for k in keys:
        if keys.count(k) > 1:
            raise ConfigError(f"{flag} {k}: axis given twice (list all its values in one {flag})")
    return axes


def grid_points(axes: list[Axis]) -> list[list[Override]]:
    """The cross product in grid order: the first axis varies slowest."""
    return [list(zip([a.key for a in axes], combo)) for combo in itertools.product(*[a.values for a in axes])]


def point_key(overrides: list[Override]) -> str:
    """A stable identity for a point: the JSON of its overrides, in order."""
    return json.dumps([[k, v] for k, v in overrides], sort_keys=True, default=str, separators=(",", ":"))


def flatten(summary: dict, prefix: str = "") -> dict:
    """{'ttft_s': {'p99': x}} -> {'ttft_s_p99': x}; lists become JSON text."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{name}_"))
        elif isinstance(v, (list, tuple)):
            out[name] = json.dumps(v)
        else:
            out[name] = v
    return out


# ---- one simulation, anywhere ------------------------------------------------------------------

@dataclass(frozen=True)
class Base:
    """What every worker needs to rebuild the scenario exactly: the parsed file, where it lives
    (relative trace / profile paths resolve against base_dir) and the --set overrides."""

    data: dict
    source: str
    base_dir: str
    overrides: tuple = ()

    @classmethod
    def load(cls, path: str | Path, overrides: Iterable[str] = ()) -> "Base":
        """The scenario file as a plain mapping with --set overrides applied (validated per point later)."""
        from sim.io.config import parse_override
        from sim.io.schema import read_yaml_mapping
        path = Path(path)
        data = read_yaml_mapping(path)
        return cls(data, str(path), str(path.resolve().parent), tuple(parse_override(t) for t in overrides))

    def scenario(self, extra: Iterable[Override] = ()):
        """The validated Scenario of this base with `extra` overrides on top."""
        from sim.io.config import Scenario, set_dotted
        from sim.io.schema import validate_mapping
        data = copy.deepcopy(self.data)
        for key, value in [*self.overrides, *extra]:
            set_dotted(data, key, copy.deepcopy(value), self.source)
        return validate_mapping(Scenario, data, self.source)

    def simulate(self, extra: Iterable[Override] = ()):
        """Run this base with `extra` overrides and return its Result."""
        from sim.core.simulation import Simulation
        with once_per_process(str(self.source)):  # its models' warnings once per process, not once per run
            return Simulation(self.scenario(extra), Path(self.base_dir)).run()


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ConfigError):
        return "; ".join(exc.lines)
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}"


def run_point(base: Base, task: dict) -> dict:
    """A sweep point on a worker: simulate, return the JSON record (never raises)."""
    record = {"key": task["key"], "overrides": [[k, v] for k, v in task["overrides"]], "summary": None, "error": None}
    start = time.perf_counter()
    try:
        record["summary"] = flatten(base.simulate(task["overrides"]).summary)
    except Exception as exc:  # noqa: BLE001 - one bad point must not sink the sweep
        record["error"] = _error_text(exc)
    record["wall_s"] = round(time.perf_counter() - start, 3)
    return record


# ---- where the work runs ----------------------------------------------------------------------

def _stop_profiler(dask_worker=None) -> None:
    """Stop a Dask worker's statistical profiler: it samples the running task's stack every 10 ms,
    costs CPU time in a CPU-bound simulation, and keeps frames alive (it once exposed a numpy view
    into a growing array.array log in sim.core.metrics, since fixed)."""
    if dask_worker is None:
        return
    for name in ("profile", "profile-cycle"):
        pc = dask_worker.periodic_callbacks.get(name)
        if pc is not None:
            pc.stop()


class Runner:
    """Runs `fn(shared, task)` for many tasks: in-process (workers=1), on a Dask LocalCluster of
    `workers` processes (default: one per core, no more than the tasks need), or on an existing
    Dask cluster (`address`, e.g. tcp://scheduler:8786). `imap` yields (index, result) as tasks
    complete; results do not depend on where they ran.

    The cluster starts on first use and stops on close (use it as a context manager).
    """

    def __init__(self, workers: int | None = None, address: str | None = None, max_parallel: int | None = None,
                 stream=None):
        if workers is not None and workers < 1:
            raise ConfigError(f"--workers: expected a positive number, got {workers}")
        if workers is not None and address:
            raise ConfigError("give either --workers or --dask, not both")
        self.address = address
        n = workers if workers is not None else (os.cpu_count() or 1)
        self.workers = max(1, min(n, max_parallel)) if max_parallel else n
        self.stream = stream
        self._client = self._cluster = None
        self._scattered: dict[int, Any] = {}

    @property
    def distributed(self) -> bool:
        return bool(self.address) or self.workers > 1

    def describe(self) -> str:
        """Where the work runs, in words (in-process, a LocalCluster, or a cluster's address)."""
        if self.address:
            return f"Dask cluster at {self.address}"
        return f"Dask LocalCluster of {self.workers} worker processes" if self.workers > 1 else "in-process"

    def _client_now(self):
        if self._client is None:
            import logging

            import dask
            from dask.distributed import Client, LocalCluster
            if self.address:
                try:
                    self._client = Client(self.address, timeout="20s")
                except OSError as exc:
                    raise ConfigError(f"--dask {self.address}: cannot reach the Dask scheduler ({exc})") from None
            else:
                # no statistical profiler on the workers: see _stop_profiler
                # Ctrl-C is the parent's to handle: workers ignore SIGINT (sim.planning.worker_signals)
                # instead of each printing a KeyboardInterrupt traceback
                with dask.config.set({"distributed.worker.profile.enabled": False,
                                      "distributed.worker.preload": ["sim.planning.worker_signals"]}):
                    self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                                 host="127.0.0.1", dashboard_address=None,
                                                 silence_logs=logging.ERROR)
                self._client = Client(self._cluster)
            self._client.run(_stop_profiler)
        return self._client

    def imap(self, fn: Callable, tasks: list, shared: Any = None) -> Iterator[tuple[int, Any]]:
        """Run fn(shared, task) for every task and yield (index, result) as each one finishes."""
        if not tasks:
            return
        if not self.distributed:
            for i, t in enumerate(tasks):
                yield i, fn(shared, t)
            return
        from dask.distributed import as_completed
        client = self._client_now()
        handle = self._scattered.get(id(shared))
        if handle is None:
            handle = client.scatter(shared, broadcast=True) if shared is not None else None
            self._scattered[id(shared)] = handle
        futures = [client.submit(fn, handle, t, pure=False) for t in tasks]
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in as_completed(futures):
                yield index[fut.key], fut.result()
        finally:
            client.cancel([f for f in futures if not f.done()])

    def map(self, fn: Callable, tasks: list, shared: Any = None) -> list:
        """Run fn(shared, task) for every task and return the results in task order."""
        out = [None] * len(tasks)
        for i, r in self.imap(fn, tasks, shared):
            out[i] = r
        return out

    def close(self) -> None:
        """Close the Dask client (and the LocalCluster it started)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
        self._scattered.clear()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is KeyboardInterrupt:  # Ctrl-C: the cluster's connections break as it stops; say nothing
            import logging
            for name in ("distributed", "tornado"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
        self.close()


class ProgressBar:
    """`[######......] 12/40 points (30%) 8.2 s` on stderr, redrawn on each update."""

    def __init__(self, total: int, unit: str = "points", stream=None, width: int = 28, enabled: bool = True):
        self.total, self.unit, self.width, self.enabled = total, unit, width, enabled
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.done = 0

    def update(self, done: int, note: str = "") -> None:
        """Redraw the bar at `done` points, with an optional note."""
        self.done = done
        if not self.enabled:
            return
        frac = done / self.total if self.total else 1.0
        fill = int(round(frac * self.width))
        text = (f"\r[{'#' * fill}{'.' * (self.width - fill)}] {done}/{self.total} {self.unit} "
                f"({frac * 100:.0f}%) {time.perf_counter() - self.start:.1f} s{note}")
        self.stream.write(text)
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line on the stream."""
        if self.enabled and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()


# ---- the sweep --------------------------------------------------------------------------------

@dataclass
class SweepOutcome:
    """What a sweep did: its table, how many points ran now or were resumed, failures, files written."""
    out_dir: Path
    rows: Any                      # pandas DataFrame, one row per point in grid order
    total: int
    computed: int                  # points simulated by this call
    skipped: int                   # points found done in points.jsonl
    failed: list[dict] = field(default_factory=list)   # records with an error
    files: list[Path] = field(default_factory=list)


def read_points(path: Path) -> dict[str, dict]:
    """Records of points.jsonl by key (the last one wins); a torn last line is ignored."""
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "key" in rec:
            done[rec["key"]] = rec
    return done


def _validate_points(base: Base, axes: list[Axis], points: list[list[Override]]) -> None:
    """Every point must be a valid scenario, and build what its run builds (trace, layout, KV budget, profile: as
    `capsim validate-scenario` checks), before any work starts; report all bad ones at once."""
    from sim.core.simulation import Simulation
    failed: dict[int, list[str]] = {}
    for i, ov in enumerate(points):
        try:
            Simulation(base.scenario(ov), Path(base.base_dir)).check()
        except ConfigError as exc:
            failed[i] = exc.lines
    if len(points) > 1 and len(failed) == len(points) and all(v == failed[0] for v in failed.values()):
        raise ConfigError([f"every point: {line}" for line in failed[0]])  # the base scenario itself is broken
    lines: list[str] = []
    for i, errs in failed.items():
        where = ", ".join(f"{k}={display_value(v)}" for k, v in points[i])
        lines.extend(f"point {i} ({where}): {line}" for line in errs)
    if lines:
        raise ConfigError(lines)


def results_frame(axes: list[Axis], points: list[list[Override]], records: dict[str, dict]):
    """One row per grid point, in grid order: the axes' values and the flattened summary."""
    import pandas as pd
    rows = []
    for i, ov in enumerate(points):
        rec = records.get(point_key(ov))
        if rec is None:
            continue
        row: dict[str, Any] = {"point": i}
        row.update({k: display_value(v) for k, v in ov})
        if rec.get("error"):
            row["error"] = rec["error"]
        else:
            row.update(rec["summary"])
        rows.append(row)
    frame = pd.DataFrame(rows)
    if "error" in frame.columns:  # keep the error column last
        frame = frame[[c for c in frame.columns if c != "error"] + ["error"]]
    return frame


_NOTED: dict[str, bool] = {}


def write_tables(frame, out: Path, stem: str = "results") -> list[Path]:
    """Write the table as CSV, and as Parquet when pyarrow is installed."""
    files = [out / f"{stem}.csv"]
    frame.to_csv(files[0], index=False)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        if not _NOTED.get("parquet"):  # said once per process
            _NOTED["parquet"] = True
            print("note: no .parquet tables written: pyarrow is not installed (pip install pyarrow); the .csv "
                  "files hold the same tables", file=sys.stderr)
        return files
    pq = out / f"{stem}.parquet"
    table = frame.copy()
    for c in table.columns:  # parquet wants one type per column
        if table[c].dtype == object:
            table[c] = table[c].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    table.to_parquet(pq, index=False)
    return files + [pq]


def run_sweep(scenario: str | Path, grid: Iterable[str | Axis], out_dir: str | Path, overrides: Iterable[str] = (),
              workers: int | None = None, address: str | None = None, progress: bool = True, fresh: bool = False,
              plots: bool = True, stream=None, force: bool = False) -> SweepOutcome:
    """Run every point of the grid not already in OUT/points.jsonl; write results.csv and plots."""
    axes = parse_axes(grid)
    if not axes:
        raise ConfigError("sweep: give at least one --grid key=v1,v2,...")
    base = Base.load(scenario, overrides)
    points = grid_points(axes)
    _validate_points(base, axes, points)
    out = Path(out_dir)
    # resuming into a sweep's own folder is no overwrite; any other folder with files needs --force
    check_out_dir(out, force or (out / "sweep.json").is_file())
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    jsonl, manifest_path = out / "points.jsonl", out / "sweep.json"
    manifest = _manifest(scenario, base, axes, len(points))
    if fresh:
        jsonl.unlink(missing_ok=True)
    else:
        _check_manifest(manifest_path, manifest)
    manifest_path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")

    records = {k: r for k, r in read_points(jsonl).items() if not r.get("error")}
    keys = [point_key(ov) for ov in points]
    todo = [i for i, k in enumerate(keys) if k not in records]
    skipped = len(points) - len(todo)
    tasks = [{"key": keys[i], "overrides": points[i]} for i in todo]
    runner = Runner(workers, address, max_parallel=len(tasks))
    if progress:
        (stream or sys.stderr).write(f"sweep: {len(tasks)} of {len(points)} points to run"
                                     f"{f', {skipped} already in {jsonl}' if skipped else ''}; "
                                     f"{runner.describe() if tasks else 'nothing to run'}\n")
    bar = ProgressBar(len(points), "points", stream, enabled=progress)
    bar.update(skipped)
    computed = 0
    failed: list[dict] = []
    try:
        with runner, open(jsonl, "a") as fh:
            if fh.tell() and not jsonl.read_bytes().endswith(b"\n"):
                fh.write("\n")  # a killed writer may have left a torn line
            for _, rec in runner.imap(run_point, tasks, base):
                line = json.dumps(rec, default=str)
                fh.write(line + "\n")
                fh.flush()
                rec = json.loads(line)  # the same values whether computed now or read back later
                computed += 1
                if rec.get("error"):
                    failed.append(rec)
                records[rec["key"]] = rec
                bar.update(skipped + computed)
    finally:
        bar.close()
        frame = results_frame(axes, points, records)
        files = [manifest_path, jsonl]
        if len(frame):
            files += write_tables(frame, out)
    if plots and len(frame) and "goodput_rps" in frame.columns:
        files += plot_sweep(frame, axes, out)
    return SweepOutcome(out, frame, len(points), computed, skipped, failed, files)


# ---- plots ------------------------------------------------------------------------------------

def slug(text: str) -> str:
    """`text` made safe as a file name."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


PANELS = (("goodput_rps", "goodput (req/s)", (("goodput_rps", "-"),)),
          ("ttft", "TTFT (s)", (("ttft_s_median", "-"), ("ttft_s_p99", "--"))),
          ("tpot", "TPOT (s)", (("tpot_s_median", "-"), ("tpot_s_p99", "--"))),
          ("e2e", "E2E (s)", (("e2e_s_median", "-"), ("e2e_s_p99", "--"))))


def plot_sweep(frame, axes: list[Axis], out: Path, max_lines: int = 12) -> list[Path]:
    """One figure per axis: goodput and median / p99 latencies against it, a line per setting of
    the other axes (solid median, dashed p99)."""
    from matplotlib.figure import Figure
    files = []
    ok = frame[frame["error"].isna()] if "error" in frame.columns else frame
    for axis in axes:
        others = [a.key for a in axes if a.key != axis.key]
        values = [display_value(v) for v in axis.values]
        numeric = _numeric(axis.values)
        xpos = {v: (v if numeric else i) for i, v in enumerate(values)}
        fig = Figure(figsize=(11, 7.5), layout="constrained")
        grid = fig.subplots(2, 2)
        groups = list(ok.groupby(others, sort=False, dropna=False)) if others else [((), ok)]
        for g, (gkey, sub) in enumerate(groups[:max_lines]):
            gkey = gkey if isinstance(gkey, tuple) else (gkey,)
            label = ", ".join(f"{k}={v}" for k, v in zip(others, gkey)) or None
            sub = sub.set_index(axis.key).reindex(values)
            x = [xpos[v] for v in values]
            color = f"C{g % 10}"
            for ax, (_, title, series) in zip(grid.flat, PANELS):
                for col, style in series:
                    if col in sub.columns:
                        y = [float("nan") if v is None else float(v) for v in sub[col].tolist()]
                        ax.plot(x, y, style, marker="o", color=color, label=label if style == "-" else None)
        for ax, (_, title, series) in zip(grid.flat, PANELS):
            ax.set_xlabel(axis.key)
            ax.set_ylabel(title)
            ax.grid(True, alpha=0.3)
            if not numeric:
                ax.set_xticks(range(len(values)), [str(v) for v in values])
            if len(series) > 1:
                ax.set_title("solid: median, dashed: p99", fontsize=9)
        if others and len(groups) > 1:
            grid.flat[0].legend(fontsize=7)
        fig.suptitle(f"sweep over {axis.key}")
        path = out / f"sweep_{slug(axis.key)}.png"
        fig.savefig(path, dpi=110)
        files.append(path)
    return files


def print_results(outcome: SweepOutcome, axes: list[Axis], file=None) -> None:
    """The sweep's table on `file` (stdout by default), the key metrics per point."""
    file = file or sys.stdout
    frame = outcome.rows
    if not len(frame):
        return
    cols = [("goodput_rps", "goodput", "{:.3f}"), ("slo_attainment", "attain", "{:.3f}"),
            ("ttft_s_p99", "TTFT p99", "{:.3f}"), ("tpot_s_p99", "TPOT p99", "{:.4f}"),
            ("e2e_s_p99", "E2E p99", "{:.2f}")]
    widths = [max(len(a.key), *(len(str(display_value(v))) for v in a.values)) for a in axes]
    head = "point  " + "  ".join(f"{a.key:<{w}}" for a, w in zip(axes, widths)) + "".join(f"{c[1]:>10}" for c in cols)
    print(head, file=file)
    for _, row in frame.iterrows():
        cells = "  ".join(f"{str(row[a.key]):<{w}}" for a, w in zip(axes, widths))
        if isinstance(row.get("error"), str):
            print(f"{row['point']:<5}  {cells}  error: {row['error'].splitlines()[0]}", file=file)
            continue
        vals = ""
        for key, _, fmt in cols:
            v = row.get(key)
            vals += f"{'-' if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v):>10}"
        print(f"{row['point']:<5}  {cells}{vals}", file=file)
