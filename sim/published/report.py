"""validate-published: replay every expressible row of a published-results file and report the error.

`validate_published(path, ...)` returns the report object `capsim validate-published --json` prints:
`rows` (id, measured and predicted ttft_ms / tpot_ms, or `skipped` with the reason; `derived.e2e_ms`, below),
`summary` (per system, backend, mode and metric: n, median and p90 absolute relative error) and `engines` (the
default settings each engine was simulated with).

`e2e_ms` is derived, for the measurement and the prediction alike, as ttft_ms + (osl - 1) x tpot_ms: a request's
mean latency when every request makes exactly `osl` tokens, as these benchmarks run. In a closed loop of
`concurrency` users its error is the error of the request rate the deployment serves (rate = concurrency / E2E),
which is what a capacity plan rests on; TTFT is the small part of it that the rate leaves over (docs/fidelity.md,
"What a row's error means").
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from sim.io.errors import ConfigError
from sim.published.client import client_for
from sim.published.engines import ENGINES
from sim.published.launches import launch_of
from sim.published.predict import DISAGG_ROUNDS, ROUNDS, build_case, error_summary, simulate_case
from sim.published.rows import BACKENDS, read_published


def select_rows(rows: list, backend: str | None, system: str | None, mode: str | None) -> list:
    """Rows matching the filters (None = any)."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    out = [r for r in rows if (backend is None or r.backend == backend) and (system is None or r.system == system)
           and (mode is None or r.mode == mode)]
    if rows and not out:
        asked = ", ".join(f"--{k} {v}" for k, v in (("backend", backend), ("system", system), ("mode", mode)) if v)
        have = "; ".join(f"{k}: {', '.join(sorted({getattr(r, k) for r in rows}))}" for k in ("backend", "system", "mode"))
        raise ConfigError(f"{asked}: no row matches (the file has {have})")
    return out


def _record(row, result: dict) -> dict:
    rec = {"id": row.id, "line": row.line, "system": row.system, "backend": row.backend, "mode": row.mode,
           "model": row.model_path, "precision": row.precision or None, "isl": row.isl, "osl": row.osl,
           "concurrency": row.concurrency, "tp": row.tp,
           "measured": {"ttft_ms": row.ttft_ms, "tpot_ms": row.tpot_ms}}
    if row.note:
        rec["note"] = row.note
    if launch := launch_of(row):  # what its launch script sets that the replay follows (sim.published.launches)
        rec["launch"] = launch
    if "skipped" in result:
        rec["skipped"] = result["skipped"]
    else:
        rec["predicted"] = {"ttft_ms": result["ttft_ms"], "tpot_ms": result["tpot_ms"]}
        rec["error"] = {m: (result[m] - getattr(row, m)) / getattr(row, m) for m in ("ttft_ms", "tpot_ms")}
        rec["derived"] = {"e2e_ms": _e2e(row.osl, row.ttft_ms, row.tpot_ms, result["ttft_ms"], result["tpot_ms"])}
        if "components" in result:
            rec["components"] = result["components"]
        if "frontend_ms" in result:  # included in predicted ttft_ms; the components are the simulated engine's
            rec["frontend_ms"] = result["frontend_ms"]
        if "frontend_hops" in result:  # frontend_ms counts the front end this many times (vLLM's disaggregated rows)
            rec["frontend_hops"] = result["frontend_hops"]
    return rec


E2E_RULE = "ttft_ms + (osl - 1) x tpot_ms, measured and predicted alike (every request makes osl tokens)"


def _e2e(osl: int, ttft: float, tpot: float, ttft_pred: float, tpot_pred: float) -> dict:
    """Measured and predicted mean E2E of a row whose requests all make `osl` tokens, and the error."""
    measured, predicted = ttft + (osl - 1) * tpot, ttft_pred + (osl - 1) * tpot_pred
    return {"measured": measured, "predicted": predicted, "error": (predicted - measured) / measured}


def _header(path: str | Path) -> list[str]:
    try:
        with Path(path).open(newline="", encoding="utf-8-sig") as fh:
            return next(csv.reader(fh), [])
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: line 1: not a UTF-8 text file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None


def _fan_out(fn, tasks: list, workers: int | None, progress: bool, stream) -> list:
    from sim.planning.sweep import ProgressBar, Runner
    todo = [i for i, t in enumerate(tasks) if t is not None]
    out: list = [None] * len(tasks)
    bar = ProgressBar(len(todo), "rows", stream or sys.stderr, enabled=progress)
    with Runner(workers=workers, max_parallel=len(todo) or 1) as runner:
        for done, (k, res) in enumerate(runner.imap(fn, [tasks[i] for i in todo]), start=1):
            out[todo[k]] = res
            bar.update(done)
    bar.close()
    return out


def validate_published(path: str | Path, backend: str | None = None, system: str | None = None,
                       mode: str | None = None, workers: int | None = 1, progress: bool = False,
                       per_user: int | None = None, start: str = "cold", mixed: str = "one_pass",
                       stream=None, rounds: int | str | None = None, moe_kernels: str = "engine",
                       moe_routing: str = "engine", all_reduce: str = "engine",
                       engine_config: str = "engine", host_overhead_s: float | None = None,
                       shared_experts_overlap: str | int = "engine", frontend="engine",
                       pool_batch: str = "engine", async_scheduling: str = "engine", first_token: str = "engine",
                       phases: str = "engine", seed: int = 0, host_per_sequence_s: float | None = None,
                       kv_cache: str = "engine", prefill_batches: str = "engine",
                       prefill_response: str = "engine", mla_kernels: str = "engine",
                       frontend_users: str = "engine", attention_dp_routing: str = "engine",
                       attention_dp_pools: str = "both", client: str = "auto", handshake: str = "engine") -> dict:
    """Simulate the selected rows (fanned out over Dask workers when workers > 1) and build the report.
    A file with a `total_output_tokens_per_s` column is TensorRT-LLM's max-throughput table."""
    from sim.published.throughput import is_throughput_file
    if is_throughput_file(_header(path)):
        return _validate_throughput(path, backend, system, mode, workers, progress, stream)
    rows = select_rows(read_published(path), backend, system, mode)
    _check_client_shape(rows, client, per_user, start, rounds)
    cases = [build_case(r, per_user, start, mixed, rounds, moe_kernels, moe_routing, all_reduce, engine_config,
                        host_overhead_s, shared_experts_overlap, frontend, pool_batch, async_scheduling, first_token,
                        phases, seed, host_per_sequence_s, kv_cache, prefill_batches, prefill_response, mla_kernels,
                        frontend_users, attention_dp_routing, attention_dp_pools, client, handshake)
             for r in rows]
    results = _fan_out(simulate_case, [c if c.scenario is not None else None for c in cases], workers, progress,
                       stream)
    records = [_record(r, results[i] if cases[i].scenario is not None else {"skipped": cases[i].skipped})
               for i, r in enumerate(rows)]
    used = sorted({r.backend for r in rows})
    return {"file": str(path), "client": {m: client_for(m, client) for m in ("agg", "disagg")},
            "requests_per_user": per_user or "1 + ceil(16384 / osl), 3 to 6", "start": start,
            "rounds": (rounds or ROUNDS) if start == "cold" else None,
            "disagg_rounds": (rounds or DISAGG_ROUNDS) if start == "cold" else None, "mixed": mixed,
            "moe_kernels": moe_kernels, "moe_routing": moe_routing, "mla_kernels": mla_kernels, "all_reduce": all_reduce,
            "engine_config": engine_config, "host_overhead_s": host_overhead_s,
            "host_per_sequence_s": "engine" if host_per_sequence_s is None else host_per_sequence_s,
            "kv_cache": kv_cache, "prefill_batches": prefill_batches,
            "shared_experts_overlap": shared_experts_overlap,
            "frontend_ms": frontend if isinstance(frontend, str) else list(frontend), "pool_batch": pool_batch,
            "frontend_users": frontend_users, "attention_dp_routing": attention_dp_routing,
            "attention_dp_pools": attention_dp_pools, "handshake": handshake,
            "async_scheduling": async_scheduling, "first_token": first_token, "prefill_response": prefill_response,
            "phases": phases, "seed": seed,
            "engines": {b: ENGINES[b].describe(_described_config(engine_config, [r for r in rows if r.backend == b]))
                        for b in used},
            "derived": {"e2e_ms": E2E_RULE}, "rows": records, "summary": error_summary(records)}


def _check_client_shape(rows, client: str, per_user, start: str, rounds) -> None:
    """The options that shape the fixed client (start, rounds, requests per user) are refused where a selected row
    replays as SA-Bench, which fixes all three, rather than silently ignored there."""
    shaped = [name for name, given in (("start", start != "cold"), ("rounds", rounds is not None),
                                       ("requests per user", per_user is not None)) if given]
    kinds = sorted({r.mode for r in rows if client_for(r.mode, client) == "sa_bench"})
    if shaped and kinds:
        raise ConfigError(f"{', '.join(shaped)}: these shape the fixed client, but the selected {' and '.join(kinds)} "
                          f"rows replay as sa_bench (client {client}), which sends 10 requests per user, all users at "
                          "once: choose client fixed, or select other rows")


def _described_config(engine_config: str, rows) -> str | None:
    """The limits an engine's rows ran under: the asked ones, else the engine's choice for agg rows; disaggregated
    pools keep the launch defaults unless asked (sim.published.predict.build_case)."""
    if engine_config != "engine":
        return engine_config
    return None if any(r.mode != "disagg" for r in rows) else "defaults"


def _validate_throughput(path, backend, system, mode, workers, progress, stream) -> dict:
    from sim.published.throughput import read_throughput, simulate_throughput, throughput_case
    rows = [r for r in read_throughput(path) if backend in (None, "trtllm") and system in (None, r.gpu)
            and mode in (None, "max_throughput")]
    items = [(r, *throughput_case(r)) for r in rows]
    results = _fan_out(simulate_throughput, [it if it[1] is not None else None for it in items], workers, progress,
                       stream)
    records = []
    for (row, scenario, why), res in zip(items, results):
        rec = {"id": row.id, "line": row.line, "system": row.gpu, "backend": "trtllm", "mode": "max_throughput",
               "model": row.checkpoint, "precision": row.precision, "isl": row.isl, "osl": row.osl,
               "concurrency": None, "tp": row.tp, "measured": {"output_tok_s": row.tok_s}}
        res = res if scenario is not None else {"skipped": why}
        if "skipped" in res:
            rec["skipped"] = res["skipped"]
        else:
            rec["predicted"] = {"output_tok_s": res["output_tok_s"]}
            rec["error"] = {"output_tok_s": res["output_tok_s"] / row.tok_s - 1}
        records.append(rec)
    return {"file": str(path), "engines": {"trtllm": ENGINES["trtllm"].describe("defaults") + "; every request at once, "
                                           "output tokens / makespan"},
            "rows": records, "summary": error_summary(records)}


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def print_report(report: dict, file=None) -> None:
    """Per-row table (predicted vs measured), skipped rows with reasons, then the error summary."""
    file = file or sys.stdout
    predicted = [r for r in report["rows"] if "predicted" in r]
    metrics = list(predicted[0]["measured"]) if predicted else []
    derived = list(dict.fromkeys(m for r in predicted for m in r.get("derived", {})))
    print(f"{'id':<58}" + "".join(f"{m:>12}{'pred':>11}{'err':>9}" for m in metrics + derived), file=file)
    for r in predicted:
        cells = [f"{r['measured'][m]:>12.2f}{r['predicted'][m]:>11.2f}{_pct(r['error'][m]):>9}" for m in metrics]
        for m in derived:
            d = r.get("derived", {}).get(m)
            cells.append(f"{'-':>12}{'-':>11}{'-':>9}" if d is None else
                         f"{d['measured']:>12.2f}{d['predicted']:>11.2f}{_pct(d['error']):>9}")
        print(f"{r['id'][:57]:<58}" + "".join(cells), file=file)
    reasons: dict[str, int] = {}
    for r in report["rows"]:
        if "skipped" in r:
            reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
    if reasons:
        print(f"\n{sum(reasons.values())} of {len(report['rows'])} rows skipped:", file=file)
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {n:>5}  {why}", file=file)
    noted = sum(1 for r in report["rows"] if "note" in r)
    if noted:
        print(f"\n{noted} row(s) disagree with themselves (the client's concurrency, or a tp_size beyond one node); "
              "each row's `note` in --json / report.json says what was read", file=file)
    print("\nengine settings simulated (each choice and fit: docs/fidelity.md):", file=file)
    for text in report["engines"].values():
        print(f"  {text}", file=file)
    print(f"\n{'system':<38}{'backend':<9}{'mode':<16}{'metric':<14}{'n':>6}{'median |err|':>14}{'p90 |err|':>11}",
          file=file)
    for s in report["summary"]:
        print(f"{s['system']:<38}{s['backend']:<9}{s['mode']:<16}{s['metric']:<14}{s['n']:>6}"
              f"{s['median_abs_error'] * 100:>13.1f}%{s['p90_abs_error'] * 100:>10.1f}%", file=file)
    for metric, rule in report.get("derived", {}).items():
        print(f"{metric} is derived: {rule}", file=file)


def write_report(report: dict, out_dir: str | Path) -> list[Path]:
    """report.json, rows.csv (one line per row and metric) and summary.csv under out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    with (out / "rows.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "line", "system", "backend", "mode", "model", "precision", "isl", "osl", "concurrency",
                    "tp", "metric", "measured", "predicted", "skipped"])
        for r in report["rows"]:
            values = [(m, v, r.get("predicted", {}).get(m, "")) for m, v in r["measured"].items()]
            values += [(m, d["measured"], d["predicted"]) for m, d in r.get("derived", {}).items()]
            for m, measured, predicted in values:
                w.writerow([r["id"], r["line"], r["system"], r["backend"], r["mode"], r["model"],
                            r["precision"] or "", r["isl"], r["osl"], r["concurrency"] or "", r["tp"], m, measured,
                            predicted, r.get("skipped", "")])
    with (out / "summary.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["system", "backend", "mode", "metric", "n", "median_abs_error", "p90_abs_error"])
        w.writeheader()
        w.writerows(report["summary"])
    return [out / "report.json", out / "rows.csv", out / "summary.csv"]
