"""validate-published: replay every expressible row of a published-results file and report the error.

`validate_published(path, ...)` returns the report object `capsim validate-published --json` prints:
`rows` (id, measured and predicted ttft_ms / tpot_ms, or `skipped` with the reason), `summary` (per
system, backend, mode and metric: n, median and p90 absolute relative error) and `engines` (the
default settings each engine was simulated with).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from sim.io.errors import ConfigError
from sim.published.engines import ENGINES
from sim.published.predict import build_case, error_summary, simulate_case
from sim.published.rows import BACKENDS, read_published


def select_rows(rows: list, backend: str | None, system: str | None, mode: str | None) -> list:
    """Rows matching the filters (None = any)."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    return [r for r in rows if (backend is None or r.backend == backend) and (system is None or r.system == system)
            and (mode is None or r.mode == mode)]


def _record(row, result: dict) -> dict:
    rec = {"id": row.id, "line": row.line, "system": row.system, "backend": row.backend, "mode": row.mode,
           "model": row.model_path, "precision": row.precision or None, "isl": row.isl, "osl": row.osl,
           "concurrency": row.concurrency, "tp": row.tp,
           "measured": {"ttft_ms": row.ttft_ms, "tpot_ms": row.tpot_ms}}
    if "skipped" in result:
        rec["skipped"] = result["skipped"]
    else:
        rec["predicted"] = {"ttft_ms": result["ttft_ms"], "tpot_ms": result["tpot_ms"]}
        rec["error"] = {m: (result[m] - getattr(row, m)) / getattr(row, m) for m in ("ttft_ms", "tpot_ms")}
    return rec


def validate_published(path: str | Path, backend: str | None = None, system: str | None = None,
                       mode: str | None = None, workers: int | None = 1, progress: bool = False,
                       per_user: int | None = None, start: str = "staggered", stream=None) -> dict:
    """Simulate the selected rows (fanned out over Dask workers when workers > 1) and build the report."""
    from sim.planning.sweep import ProgressBar, Runner
    rows = select_rows(read_published(path), backend, system, mode)
    cases = [build_case(r, per_user, start) for r in rows]
    todo = [i for i, c in enumerate(cases) if c.scenario is not None]
    results: dict[int, dict] = {i: {"skipped": c.skipped} for i, c in enumerate(cases) if c.scenario is None}
    bar = ProgressBar(len(todo), "rows", stream or sys.stderr, enabled=progress)
    with Runner(workers=workers, max_parallel=len(todo) or 1) as runner:
        for done, (k, res) in enumerate(runner.imap(simulate_case, [cases[i] for i in todo]), start=1):
            results[todo[k]] = res
            bar.update(done)
    bar.close()
    records = [_record(r, results[i]) for i, r in enumerate(rows)]
    used = sorted({r.backend for r in rows})
    return {"file": str(path), "requests_per_user": per_user or "1 + ceil(16384 / osl), 3 to 6", "start": start,
            "engines": {b: ENGINES[b].describe() for b in used},
            "rows": records, "summary": error_summary(records)}


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def print_report(report: dict, file=None) -> None:
    """Per-row table (predicted vs measured), skipped rows with reasons, then the error summary."""
    file = file or sys.stdout
    print(f"{'id':<58}{'TTFT ms':>10}{'pred':>10}{'err':>9}{'TPOT ms':>10}{'pred':>9}{'err':>9}", file=file)
    skipped = 0
    for r in report["rows"]:
        m = r["measured"]
        if "skipped" in r:
            skipped += 1
            continue
        p, e = r["predicted"], r["error"]
        print(f"{r['id'][:57]:<58}{m['ttft_ms']:>10.1f}{p['ttft_ms']:>10.1f}{_pct(e['ttft_ms']):>9}"
              f"{m['tpot_ms']:>10.2f}{p['tpot_ms']:>9.2f}{_pct(e['tpot_ms']):>9}", file=file)
    if skipped:
        reasons: dict[str, int] = {}
        for r in report["rows"]:
            if "skipped" in r:
                reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
        print(f"\n{skipped} of {len(report['rows'])} rows skipped:", file=file)
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {n:>5}  {why}", file=file)
    print("\nengine settings simulated (defaults, not fitted):", file=file)
    for text in report["engines"].values():
        print(f"  {text}", file=file)
    print(f"\n{'system':<12}{'backend':<9}{'mode':<8}{'metric':<9}{'n':>6}{'median |err|':>14}{'p90 |err|':>11}",
          file=file)
    for s in report["summary"]:
        print(f"{s['system']:<12}{s['backend']:<9}{s['mode']:<8}{s['metric']:<9}{s['n']:>6}"
              f"{s['median_abs_error'] * 100:>13.1f}%{s['p90_abs_error'] * 100:>10.1f}%", file=file)


ROW_COLUMNS = ("id", "line", "system", "backend", "mode", "model", "precision", "isl", "osl", "concurrency", "tp",
               "measured_ttft_ms", "predicted_ttft_ms", "measured_tpot_ms", "predicted_tpot_ms", "skipped")


def write_report(report: dict, out_dir: str | Path) -> list[Path]:
    """report.json, rows.csv and summary.csv under out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    with (out / "rows.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(ROW_COLUMNS)
        for r in report["rows"]:
            p = r.get("predicted", {})
            w.writerow([r["id"], r["line"], r["system"], r["backend"], r["mode"], r["model"], r["precision"] or "",
                        r["isl"], r["osl"], r["concurrency"], r["tp"], r["measured"]["ttft_ms"], p.get("ttft_ms", ""),
                        r["measured"]["tpot_ms"], p.get("tpot_ms", ""), r.get("skipped", "")])
    with (out / "summary.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["system", "backend", "mode", "metric", "n", "median_abs_error", "p90_abs_error"])
        w.writeheader()
        w.writerows(report["summary"])
    return [out / "report.json", out / "rows.csv", out / "summary.csv"]
