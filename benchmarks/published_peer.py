"""capsim and AIConfigurator side by side on the same published rows (a benchmark, not a test).

    capsim validate-published ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv --mode agg \\
        --out results/published
    /work/venvs/aic/bin/python benchmarks/aiconfigurator_peer.py \\
        ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv --ids results/published/report.json \\
        --out results/published/aic.csv
    python benchmarks/published_peer.py results/published/report.json results/published/aic.csv \\
        --fig docs/figures/fidelity-published.png --md results/published/peer.md

Reads capsim's report.json and the peer's per-row CSV and prints, per (system, backend, mode, metric), the
rows both predicted and each tool's median and p90 absolute relative error; the figure plots predicted vs
measured TTFT and TPOT per card for both. Rows named in --in-sample (ids of rows some constant was fitted
on) are reported apart.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

HOST_OVERHEAD_FIT = ("trtllm", "meta-llama/Llama-3.1-8B-Instruct", "h100_sxm")
"""The ops model's default host overhead (0.228 ms per iteration, sim/io/ops_schema.py) was fitted on the
silicon sample's TRT-LLM H100 Llama-3.1-8B agg rows (benchmarks/ops_fidelity.py): those rows are
in-sample for capsim and are reported as their own group."""


def load(report_path: str, aic_path: str) -> list[dict]:
    """Rows predicted by both tools: measured, capsim and AIConfigurator TTFT/TPOT."""
    report = json.loads(Path(report_path).read_text())
    with open(aic_path, newline="") as fh:
        aic = {r["id"]: r for r in csv.DictReader(fh) if r["aic_ttft_ms"]}
    out = []
    for r in report["rows"]:
        if "predicted" not in r or r["id"] not in aic:
            continue
        a = aic[r["id"]]
        fit = (r["backend"], r["model"], r["system"]) == HOST_OVERHEAD_FIT
        out.append({"id": r["id"], "system": r["system"], "backend": r["backend"], "mode": r["mode"],
                    "group": "fit set (host overhead)" if fit else "held out",
                    "measured": r["measured"], "capsim": r["predicted"],
                    "aic": {"ttft_ms": float(a["aic_ttft_ms"]), "tpot_ms": float(a["aic_tpot_ms"])}})
    return out


def table(rows: list[dict]) -> list[dict]:
    """Per (system, backend, mode, group, metric): n and both tools' median / p90 |relative error|."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for r in rows:
        for m in ("ttft_ms", "tpot_ms"):
            meas = r["measured"][m]
            key = (r["system"], r["backend"], r["mode"], r["group"], m)
            pair = (abs(r["capsim"][m] / meas - 1), abs(r["aic"][m] / meas - 1))
            groups.setdefault(key, []).append(pair)
            groups.setdefault(("~all", "all", r["mode"], "all rows", m), []).append(pair)
            if r["group"] == "held out":
                groups.setdefault(("~all", "all", r["mode"], "held out", m), []).append(pair)
    out = []
    for key, errs in sorted(groups.items()):
        e = np.asarray(errs)
        out.append(dict(zip(("system", "backend", "mode", "group", "metric"), key), n=len(e),
                        capsim_median=float(np.median(e[:, 0])), capsim_p90=float(np.percentile(e[:, 0], 90)),
                        aic_median=float(np.median(e[:, 1])), aic_p90=float(np.percentile(e[:, 1], 90))))
    return out


def markdown(summary: list[dict]) -> str:
    """The side-by-side table as Markdown."""
    lines = ["| card | engine | rows | metric | n | capsim median | capsim p90 | AIConfigurator median | AIConfigurator p90 |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['system'].lstrip('~')} | {s['backend']} | {s['group']} | {s['metric'][:-3].upper()} | {s['n']} | "
                     f"{s['capsim_median']:.1%} | {s['capsim_p90']:.1%} | {s['aic_median']:.1%} | {s['aic_p90']:.1%} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: str) -> None:
    """Predicted vs measured TTFT and TPOT, one column per card, capsim and AIConfigurator."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cards = sorted({r["system"] for r in rows})
    fig, axes = plt.subplots(2, len(cards), figsize=(5.2 * len(cards), 9.5), squeeze=False)
    for j, card in enumerate(cards):
        sub = [r for r in rows if r["system"] == card]
        for i, m in enumerate(("ttft_ms", "tpot_ms")):
            ax = axes[i][j]
            meas = np.array([r["measured"][m] for r in sub])
            for tool, marker, color in (("aic", "x", "tab:orange"), ("capsim", "o", "tab:blue")):
                pred = np.array([r[tool][m] for r in sub])
                label = "AIConfigurator 0.12.0" if tool == "aic" else "capsim"
                ax.scatter(meas, pred, s=14, marker=marker, alpha=0.6, color=color, label=label,
                           facecolors="none" if marker == "o" else None)
            _style_axes(ax, meas, m, f"{card}: {m[:-3].upper()} ({len(sub)} rows; band = +-15%)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _style_axes(ax, meas, metric: str, title: str) -> None:
    """A predicted-vs-measured panel: the diagonal, the +-15% band, log axes, labels, title, legend."""
    lo, hi = meas.min() / 2, meas.max() * 2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.85", zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"measured {metric[:-3].upper()} (ms)")
    ax.set_ylabel(f"predicted {metric[:-3].upper()} (ms)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)


def figure_before_after(before: str, after: str, path: str) -> None:
    """Predicted vs measured TTFT and TPOT of two capsim reports (e.g. staggered before, cold now), one marker
    colour per engine, on the rows both predicted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [{r["id"]: r for r in json.loads(Path(f).read_text())["rows"] if "predicted" in r} for f in (before, after)]
    ids = sorted(set(runs[0]) & set(runs[1]))
    colors = {"vllm": "tab:blue", "sglang": "tab:green", "trtllm": "tab:red"}
    fig, axes = plt.subplots(2, 2, figsize=(10.5, 9.5), squeeze=False)
    for j, (label, run) in enumerate((("before", runs[0]), ("now", runs[1]))):
        for i, m in enumerate(("ttft_ms", "tpot_ms")):
            ax = axes[i][j]
            meas = np.array([run[k]["measured"][m] for k in ids])
            for backend, color in colors.items():
                sel = [k for k in ids if run[k]["backend"] == backend]
                e = np.median([abs(run[k]["error"][m]) for k in sel]) if sel else float("nan")
                ax.scatter([run[k]["measured"][m] for k in sel], [run[k]["predicted"][m] for k in sel], s=10,
                           alpha=0.5, color=color, label=f"{backend} ({len(sel)} rows, median |err| {e:.0%})")
            _style_axes(ax, meas, m,
                        f"{label} ({Path(before if j == 0 else after).parent.name}): {m[:-3].upper()}, band +-15%")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def collection(source: str) -> str:
    """Which benchmark collection of the silicon sample a row comes from (its silicon_data_source)."""
    if "aic-auto-gap-analysis" in source:
        return "gap-analysis"
    return "db-dump" if source.startswith("db-dump") else source.split(";")[0].replace("source_file=", "")


def start_mode_held_out(staggered: str, burst: str, sample: str, aic_path: str) -> list[dict]:
    """The load generator's phase is not in the file: per benchmark collection, pick the start mode
    (staggered or burst) with the lower median |TTFT error| on the rows with an even line number, then
    report both metrics on the odd ones (never on the rows that chose)."""
    with open(sample, newline="") as fh:
        coll = {r["id"]: collection(r["silicon_data_source"]) for r in csv.DictReader(fh)}
    runs = {}
    for name, path in (("staggered", staggered), ("burst", burst)):
        runs[name] = {r["id"]: r for r in json.loads(Path(path).read_text())["rows"] if "predicted" in r}
    with open(aic_path, newline="") as fh:
        aic = {r["id"]: r for r in csv.DictReader(fh) if r["aic_ttft_ms"]}
    ids = sorted(set(runs["staggered"]) & set(runs["burst"]) & set(aic))
    out, every = [], {"ttft_ms": [], "tpot_ms": [], "aic_ttft_ms": [], "aic_tpot_ms": []}
    for c in sorted({coll[i] for i in ids}):
        for backend in sorted({runs["burst"][i]["backend"] for i in ids if coll[i] == c}):
            mine = [i for i in ids if coll[i] == c and runs["burst"][i]["backend"] == backend]
            fit = [i for i in mine if runs["burst"][i]["line"] % 2 == 0]
            test = [i for i in mine if runs["burst"][i]["line"] % 2 == 1]
            if not fit or not test:
                continue
            score = {m: np.median([abs(runs[m][i]["error"]["ttft_ms"]) for i in fit]) for m in runs}
            best = min(score, key=score.get)
            row = {"collection": c, "backend": backend, "chosen": best, "n_fit": len(fit), "n_test": len(test)}
            for metric in ("ttft_ms", "tpot_ms"):
                mine_err = [abs(runs[best][i]["error"][metric]) for i in test]
                peer_err = [abs(float(aic[i]["aic_" + metric]) / runs[best][i]["measured"][metric] - 1) for i in test]
                row[metric], row["aic_" + metric] = float(np.median(mine_err)), float(np.median(peer_err))
                every[metric] += mine_err
                every["aic_" + metric] += peer_err
            out.append(row)
    n = len(every["ttft_ms"])
    out.append({"collection": "all", "backend": "all", "chosen": "per collection", "n_fit": len(ids) - n,
                "n_test": n, **{k: float(np.median(v)) for k, v in every.items()}})
    return out


ROUND_CHOICES = ((1, "cohort"), (2, "spread"), (3, "spread"), (5, "spread"), (10, "spread"), (20, "spread"),
                 (1000, "spread"))
"""What `rounds_held_out` chooses among: every wave a repeat of the first (cohort), or N rounds of which the
first is a burst and the rest the steady state (N = 1000: the steady state alone)."""


def _held_out_inputs(report: str, sample: str, aic_path: str | None, key: str) -> tuple[dict, dict, dict]:
    """(id -> collection, id -> report row holding `key`, id -> the peer's CSV row) for the held-out choices."""
    with open(sample, newline="") as fh:
        coll = {r["id"]: collection(r["silicon_data_source"]) for r in csv.DictReader(fh)}
    rows = {r["id"]: r for r in json.loads(Path(report).read_text())["rows"] if key in r}
    aic = {}
    if aic_path:
        with open(aic_path, newline="") as fh:
            aic = {r["id"]: r for r in csv.DictReader(fh) if r["aic_ttft_ms"]}
    return coll, rows, aic


def _halves(ids, rows: dict, coll: dict):
    """Per (collection, engine): its rows with an even line number (to choose on) and with an odd one (to report)."""
    for c in sorted({coll[i] for i in ids}):
        for backend in sorted({rows[i]["backend"] for i in ids if coll[i] == c}):
            mine = [i for i in ids if coll[i] == c and rows[i]["backend"] == backend]
            fit = [i for i in mine if rows[i]["line"] % 2 == 0]
            test = [i for i in mine if rows[i]["line"] % 2 == 1]
            if fit and test:
                yield c, backend, fit, test


def rounds_held_out(report: str, sample: str, aic_path: str) -> list[dict]:
    """The benchmark's length and the engine's cohort regime are not in the file: per (collection, engine),
    choose them among ROUND_CHOICES on the rows with an even line number from the two parts a cold-start
    report keeps per row (`components`), then report both metrics on the odd rows only."""
    from sim.published.predict import combine_cold
    coll, rows, aic = _held_out_inputs(report, sample, aic_path, "components")
    ids = sorted(set(rows) & set(aic)) if aic_path else sorted(rows)

    def err(i, choice, metric):
        n, regime = choice
        pred = combine_cold(rows[i]["components"]["first_wave"], rows[i]["components"]["steady"], n, regime)
        pred["ttft_ms"] += rows[i].get("frontend_ms", 0.0)   # the components are the simulated engine's
        return abs(pred[metric] / rows[i]["measured"][metric] - 1)

    out, every = [], {"ttft_ms": [], "tpot_ms": [], "aic_ttft_ms": [], "aic_tpot_ms": []}
    for c, backend, fit, test in _halves(ids, rows, coll):
        best = min(ROUND_CHOICES, key=lambda ch: np.median([err(i, ch, "ttft_ms") for i in fit]))
        row = {"collection": c, "backend": backend, "chosen": best, "n_fit": len(fit), "n_test": len(test)}
        for metric in ("ttft_ms", "tpot_ms"):
            mine_err = [err(i, best, metric) for i in test]
            peer_err = [abs(float(aic[i]["aic_" + metric]) / rows[i]["measured"][metric] - 1)
                        for i in test if i in aic]
            row[metric] = float(np.median(mine_err))
            row["aic_" + metric] = float(np.median(peer_err)) if peer_err else float("nan")
            every[metric] += mine_err
            every["aic_" + metric] += peer_err
        out.append(row)
    n = len(every["ttft_ms"])
    out.append({"collection": "all", "backend": "all", "chosen": "per collection", "n_fit": len(ids) - n,
                "n_test": n, **{k: float(np.median(v)) if v else float("nan") for k, v in every.items()}})
    return out


OFFSETS_MS = tuple(range(0, 401, 5))
"""What `offset_held_out` chooses among: a constant added to every predicted TTFT of a (collection, engine)."""


def offset_held_out(report: str, sample: str, aic_path: str | None) -> list[dict]:
    """How much of the TTFT error is one constant per benchmark setup: per (collection, engine), choose the
    offset among OFFSETS_MS (added to every predicted TTFT: client, HTTP, tokenizer and front-end time the row
    does not state) with the lowest median |TTFT error| on the rows with an even line number, and report the
    odd rows only, without and with it. An analysis of the residual, not a change to capsim's predictions."""
    coll, rows, aic = _held_out_inputs(report, sample, aic_path, "predicted")

    def err(i, c):
        return abs((rows[i]["predicted"]["ttft_ms"] + c) / rows[i]["measured"]["ttft_ms"] - 1)

    out, before, after, peer = [], [], [], []
    for c, backend, fit, test in _halves(sorted(rows), rows, coll):
        best = min(OFFSETS_MS, key=lambda o: (np.median([err(i, o) for i in fit]), o))
        mine_peer = [abs(float(aic[i]["aic_ttft_ms"]) / rows[i]["measured"]["ttft_ms"] - 1) for i in test if i in aic]
        row = {"collection": c, "backend": backend, "offset_ms": best, "n_fit": len(fit), "n_test": len(test),
               "before": float(np.median([err(i, 0) for i in test])),
               "after": float(np.median([err(i, best) for i in test])),
               "aic": float(np.median(mine_peer)) if mine_peer else float("nan")}
        before += [err(i, 0) for i in test]
        after += [err(i, best) for i in test]
        peer += mine_peer
        out.append(row)
    out.append({"collection": "all", "backend": "all", "offset_ms": "per collection", "n_fit": len(rows) - len(before),
                "n_test": len(before), "before": float(np.median(before)), "after": float(np.median(after)),
                "aic": float(np.median(peer)) if peer else float("nan")})
    return out


FRONTEND_BASE_MS = tuple(range(0, 301, 5))
FRONTEND_PER_USER_MS = (0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2)
"""What `frontend_fit` chooses among: a front-end time of base + per_user x concurrency (ms) per engine."""


def _frontend_err(r: dict, pair) -> float:
    """|TTFT error| of row `r` with the front end `pair` (base, per user ms) in place of the one its run added (the
    row's frontend_ms)."""
    added = pair[0] + pair[1] * r["concurrency"]
    return abs((r["predicted"]["ttft_ms"] - r.get("frontend_ms", 0.0) + added) / r["measured"]["ttft_ms"] - 1)


def _best_frontend(rows: list[dict]) -> tuple:
    """The (base, per user) pair of FRONTEND_BASE_MS x FRONTEND_PER_USER_MS with the lowest median |TTFT error| on
    `rows` (ties: the smaller pair)."""
    pairs = [(a, b) for a in FRONTEND_BASE_MS for b in FRONTEND_PER_USER_MS]
    return min(pairs, key=lambda p: (np.median([_frontend_err(r, p) for r in rows]), p))


def _median_err(rows: list[dict], pair) -> float:
    return float(np.median([_frontend_err(r, pair) for r in rows]))


def frontend_fit(report: str) -> list[dict]:
    """The engines' front-end time (client, HTTP, API server, tokenizer) that the engine model does not produce:
    per engine, the (base, per-user) pair among FRONTEND_BASE_MS x FRONTEND_PER_USER_MS whose base + per_user x
    concurrency, added to every predicted TTFT, gives the lowest median |TTFT error| on the agg rows with an even
    line number of REPORT (any run: the front end it added, each row's frontend_ms, is taken off first); reported on
    the odd rows, per card, without and with it. An engine's rows whose launch has postprocess workers (a report
    row's launch.postprocess_workers, sim.published.launches) get a pair of their own (`launch`: postprocess_workers;
    the others `server`).
    What sim.published.engines' `frontend_ms` and `frontend_postprocess_ms` hold."""
    rows = [r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r and r["mode"] == "agg"]
    kind = lambda r: "postprocess_workers" if r.get("launch", {}).get("postprocess_workers") else "server"  # noqa: E731
    out = []
    for backend, launch in sorted({(r["backend"], kind(r)) for r in rows}):
        mine = [r for r in rows if r["backend"] == backend and kind(r) == launch]
        fit = [r for r in mine if r["line"] % 2 == 0]
        test = [r for r in mine if r["line"] % 2 == 1]
        if not fit or not test:
            continue
        best = _best_frontend(fit)
        for system in [None, *sorted({r["system"] for r in test})]:
            part = [r for r in test if system in (None, r["system"])]
            out.append({"backend": backend, "launch": launch, "system": system or "all", "base_ms": best[0],
                        "per_user_ms": best[1],
                        "n_fit": len(fit), "n_test": len(part),
                        "before": _median_err(part, (0, 0)), "after": _median_err(part, best)})
    return out


def frontend_by_version(report: str, sample: str) -> list[dict]:
    """Would a front end per engine *version* (a planner knows it) beat one per engine? Per engine and released
    version (major.minor of the sample's backend_version; empty and nightly versions are left out), two tests of
    the pair `_best_frontend` chooses:
    - even / odd lines: chosen on the version's even agg lines, reported on its odd ones, against the engine's pair
      (`frontend_fit` on all of the engine's even lines);
    - leave one collection out (versions measured in two or more collections): chosen on the version's other
      collections, reported on the one left out. A benchmark collection has a front end of its own (its client,
      its server), so only this test says whether the pair carries over to a setup it has not seen."""
    import re
    rows = [r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r and r["mode"] == "agg"]
    with open(sample, newline="") as fh:
        src = {r["id"]: r for r in csv.DictReader(fh)}
    engine_pair = {r["backend"]: (r["base_ms"], r["per_user_ms"]) for r in frontend_fit(report)
                   if r["system"] == "all" and r["launch"] == "server"}
    for r in rows:
        m = re.match(r"\d+\.\d+", src[r["id"]].get("backend_version") or "")
        r["_version"], r["_collection"] = m and m.group(0), collection(src[r["id"]]["silicon_data_source"])
    out = []
    for backend, version in sorted({(r["backend"], r["_version"]) for r in rows if r["_version"]}):
        mine = [r for r in rows if (r["backend"], r["_version"]) == (backend, version)]
        fit, test = [r for r in mine if r["line"] % 2 == 0], [r for r in mine if r["line"] % 2 == 1]
        if not fit or not test or backend not in engine_pair:
            continue
        engine, best = engine_pair[backend], _best_frontend(fit)
        row = {"backend": backend, "version": version, "pair": best, "n_fit": len(fit), "n_test": len(test),
               "engine": _median_err(test, engine), "version_pair": _median_err(test, best), "left_out": []}
        for coll in sorted({r["_collection"] for r in mine}) if len({r["_collection"] for r in mine}) > 1 else []:
            held = [r for r in mine if r["_collection"] == coll]
            chosen = _best_frontend([r for r in mine if r["_collection"] != coll])
            row["left_out"].append({"collection": coll, "n": len(held), "pair": chosen,
                                    "engine": _median_err(held, engine), "version_pair": _median_err(held, chosen)})
        out.append(row)
    return out


JOINT_ROUNDS = (4, 5, 6, 8, 10, 12, 15, 20)
"""What `rounds_with_frontend` chooses N among (requests per user, the first wave a burst)."""


def _joint_best(first, steady, users, meas, mask, rounds) -> tuple:
    """(N, base, per user) of `rounds` x the front-end grids with the lowest median |TTFT error| on `mask`."""
    best = None
    for n in rounds:
        engine = (first + (n - 1) * steady) / n
        for base in FRONTEND_BASE_MS:
            for per_user in FRONTEND_PER_USER_MS:
                err = float(np.median(np.abs((engine + base + per_user * users)[mask] / meas[mask] - 1)))
                if best is None or err < best[0]:
                    best = (err, n, base, per_user)
    return best[1:]


def rounds_with_frontend(report: str, sample: str, backend: str = "vllm") -> list[dict]:
    """Would choosing the benchmark's length N (requests per user; ROUNDS = 10 is stated from AIConfigurator's
    description) together with the front end beat N = 10 with the front end alone? On the engine's cold-start agg
    rows (`components`), for N fixed at 10 and for N among JOINT_ROUNDS: chosen on the even lines, reported on the
    odd ones; and chosen on all collections but one, reported on the one left out (each collection in turn)."""
    rows = [r for r in json.loads(Path(report).read_text())["rows"]
            if r.get("components") and r["mode"] == "agg" and r["backend"] == backend]
    with open(sample, newline="") as fh:
        coll = {r["id"]: collection(r["silicon_data_source"]) for r in csv.DictReader(fh)}
    first, steady, users, meas, line = (np.array(v, dtype=float) for v in zip(*[
        (r["components"]["first_wave"]["ttft_ms"], r["components"]["steady"]["ttft_ms"], r["concurrency"],
         r["measured"]["ttft_ms"], r["line"]) for r in rows]))
    colls = np.array([coll[r["id"]] for r in rows])
    out = []
    tests = [("odd lines", line % 2 == 0, line % 2 == 1)]
    tests += [(f"left out: {c}", colls != c, colls == c) for c in sorted(set(colls))]
    for label, rounds in (("N = 10", (10,)), ("N chosen", JOINT_ROUNDS)):
        held = np.zeros(len(rows))
        for name, fit, test in tests:
            n, base, per_user = _joint_best(first, steady, users, meas, fit, rounds)
            err = np.abs(((first + (n - 1) * steady) / n + base + per_user * users) / meas - 1)
            if name != "odd lines":
                held[test] = err[test]
            out.append({"rule": label, "test": name, "n": int(test.sum()), "chosen": (n, base, per_user),
                        "median": float(np.median(err[test]))})
        out.append({"rule": label, "test": "every collection left out in turn", "n": len(rows), "chosen": None,
                    "median": float(np.median(held))})
    return out


def _print_rounds_with_frontend(report: str, sample: str) -> None:
    print("\n| rule | test | rows | chosen (N, base ms, ms per user) | median TTFT error |\n|---|---|---:|---|---:|")
    for r in rounds_with_frontend(report, sample):
        print(f"| {r['rule']} | {r['test']} | {r['n']} | {r['chosen'] or ''} | {r['median']:.1%} |")


def _print_frontend_by_version(report: str, sample: str) -> None:
    print("\n| engine | version | test | rows | pair chosen (ms, ms per user) | engine's pair | version's pair |\n"
          "|---|---|---|---:|---|---:|---:|")
    for v in frontend_by_version(report, sample):
        print(f"| {v['backend']} | {v['version']} | odd lines | {v['n_test']} | {v['pair']} | {v['engine']:.1%} | "
              f"{v['version_pair']:.1%} |")
        for c in v["left_out"]:
            print(f"| | | left out: {c['collection']} | {c['n']} | {c['pair']} | {c['engine']:.1%} | "
                  f"{c['version_pair']:.1%} |")


def _print_frontend(report: str) -> None:
    print("\n| engine | launch | card | base (ms) | per user (ms) | fit rows (even) | held-out rows (odd) | capsim TTFT | "
          "with the front end |\n|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in frontend_fit(report):
        print(f"| {r['backend']} | {r['launch']} | {r['system']} | {r['base_ms']} | {r['per_user_ms']} | {r['n_fit']} | "
              f"{r['n_test']} | {r['before']:.1%} | {r['after']:.1%} |")


def groups(report: str, aic_path: str | None) -> list[dict]:
    """Per (card, engine, model, precision) of REPORT's agg rows: capsim's median |TTFT| and |TPOT error| over all
    its rows and, with the peer's CSV, both tools' over the rows both predict; then the totals over all rows and
    over the odd lines alone (held out from every choice made on even lines)."""
    rows = [r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r and r["mode"] == "agg"]
    aic = {}
    if aic_path:
        with open(aic_path, newline="") as fh:
            aic = {r["id"]: r for r in csv.DictReader(fh) if r["aic_ttft_ms"]}

    def med(part, who, m):
        if not part:
            return None
        if who == "aic":
            return float(np.median([abs(float(aic[r["id"]]["aic_" + m]) / r["measured"][m] - 1) for r in part]))
        return float(np.median([abs(r["predicted"][m] / r["measured"][m] - 1) for r in part]))

    keyed: dict[tuple, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["system"], r["backend"], r["model"].split("/")[-1], r["precision"] or "")):
        keyed.setdefault((r["system"], r["backend"], r["model"].split("/")[-1], r["precision"] or "bf16"), []).append(r)
    keyed[("all", "", "", "")] = rows
    keyed[("odd lines", "", "", "")] = [r for r in rows if r["line"] % 2 == 1]
    out = []
    for key, part in keyed.items():
        both = [r for r in part if r["id"] in aic]
        out.append(dict(zip(("system", "backend", "model", "precision"), key), n=len(part), n_both=len(both),
                        **{f"{who}_{m}{'_both' if who == 'capsim' else ''}": med(sel, who, m)
                           for who, sel in (("capsim", both), ("aic", both)) for m in ("ttft_ms", "tpot_ms")},
                        capsim_ttft_ms=med(part, "capsim", "ttft_ms"), capsim_tpot_ms=med(part, "capsim", "tpot_ms")))
    return out


def _print_groups(report: str, aic_path: str | None) -> None:
    def pct(x):
        return "-" if x is None else f"{x:.1%}"
    print("\n| system | engine | model | precision | rows | capsim TTFT | capsim TPOT | rows both | capsim TTFT / TPOT "
          "on them | AIConfigurator TTFT / TPOT |\n|---|---|---|---|---:|---:|---:|---:|---|---|")
    for g in groups(report, aic_path):
        print(f"| {g['system']} | {g['backend']} | {g['model']} | {g['precision']} | {g['n']} | "
              f"{pct(g['capsim_ttft_ms'])} | {pct(g['capsim_tpot_ms'])} | {g['n_both']} | "
              f"{pct(g['capsim_ttft_ms_both'])} / {pct(g['capsim_tpot_ms_both'])} | "
              f"{pct(g['aic_ttft_ms'])} / {pct(g['aic_tpot_ms'])} |")


def _print_offsets(report: str, sample: str, aic: str | None) -> None:
    _print_held_out("| collection | engine | TTFT offset chosen on even lines (ms) | fit rows | held-out rows | "
                    "capsim TTFT | with the offset | AIConfigurator TTFT |\n|---|---|---:|---:|---:|---:|---:|---:|",
                    offset_held_out(report, sample, aic),
                    lambda r: [r["offset_ms"], r["n_fit"], r["n_test"], f"{r['before']:.1%}", f"{r['after']:.1%}",
                               f"{r['aic']:.1%}"])


def _print_held_out(header: str, rows: list[dict], cells) -> None:
    """A held-out table: the header, then per row its collection, engine and `cells(row)`."""
    print("\n" + header)
    for r in rows:
        print("| " + " | ".join(str(x) for x in [r["collection"], r["backend"], *cells(r)]) + " |")


def _choice(chosen) -> str:
    if isinstance(chosen, str):
        return chosen
    n, regime = chosen
    return "cohort (every wave a burst)" if regime == "cohort" else (
        "steady state alone" if n >= 1000 else f"{n} rounds, first a burst")


def _print_rounds(report: str, sample: str, aic: str | None) -> None:
    _print_held_out("| collection | engine | chosen on even lines | fit rows | held-out rows | capsim TTFT | "
                    "AIConfigurator TTFT | capsim TPOT | AIConfigurator TPOT |\n|---|---|---|---:|---:|---:|---:|---:|---:|",
                    rounds_held_out(report, sample, aic),
                    lambda r: [_choice(r["chosen"]), r["n_fit"], r["n_test"], f"{r['ttft_ms']:.1%}",
                               f"{r['aic_ttft_ms']:.1%}", f"{r['tpot_ms']:.1%}", f"{r['aic_tpot_ms']:.1%}"])


ANALYSES = (
    ("--rounds-held-out", "REPORT is a --start cold run: choose the benchmark length and cohort regime per collection "
                          "on even lines, report on odd lines (needs --sample)"),
    ("--offset-held-out", "choose a constant TTFT offset per collection and engine on even lines, report odd lines "
                          "without and with it: how much of the TTFT error is one constant per setup (needs --sample)"),
    ("--frontend-fit", "choose each engine's front-end time (base + per user x concurrency) on even agg lines of "
                       "REPORT, report odd lines without and with it"),
    ("--frontend-by-version", "a front end per engine version instead of per engine: chosen on even lines / on the "
                              "other collections, reported on odd lines / the collection left out (needs --sample)"),
    ("--rounds-with-frontend", "vLLM: the benchmark's length N chosen with the front end against N = 10, on odd lines "
                               "and each collection left out (needs --sample)"),
    ("--groups", "per card, engine, model and precision: capsim's median errors and, with the peer's CSV, both tools' "
                 "on the rows both predict; totals over all rows and the odd lines"),
)
"""The analyses main() runs on request (on / off flags), each with its help text."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="capsim validate-published --out DIR: DIR/report.json")
    ap.add_argument("aic", nargs="?", help="benchmarks/aiconfigurator_peer.py output CSV (without it: capsim only, "
                                           "--rounds-held-out)")
    ap.add_argument("--fig", help="write the predicted-vs-measured figure here (PNG)")
    ap.add_argument("--md", help="write the Markdown table here")
    ap.add_argument("--burst", help="a second report.json run with --start burst: choose the start mode per "
                                    "collection on even lines, report on odd lines")
    ap.add_argument("--before", help="without the peer: another capsim report.json; --fig then plots it beside "
                                     "REPORT (before / now)")
    for flag, text in ANALYSES:
        ap.add_argument(flag, action="store_true", help=text)
    ap.add_argument("--sample", help="the silicon sample CSV (its silicon_data_source names the collection)")
    args = ap.parse_args(argv)
    if args.frontend_fit:
        _print_frontend(args.report)
    if args.frontend_by_version:
        if not args.sample:
            print("--frontend-by-version needs --sample (the silicon sample CSV: versions and collections)",
                  file=sys.stderr)
            return 2
        _print_frontend_by_version(args.report, args.sample)
    if args.rounds_with_frontend:
        if not args.sample:
            print("--rounds-with-frontend needs --sample (the silicon sample CSV: collections)", file=sys.stderr)
            return 2
        _print_rounds_with_frontend(args.report, args.sample)
    if args.groups:
        _print_groups(args.report, args.aic)
    if args.aic is None:
        if args.frontend_fit or args.groups or args.frontend_by_version or args.rounds_with_frontend:
            return 0
        if not (((args.rounds_held_out or args.offset_held_out) and args.sample) or (args.before and args.fig)):
            print("without the peer's CSV: --rounds-held-out or --offset-held-out with --sample, or --before REPORT "
                  "--fig PNG", file=sys.stderr)
            return 2
        if args.rounds_held_out and args.sample:
            _print_rounds(args.report, args.sample, None)
        if args.offset_held_out and args.sample:
            _print_offsets(args.report, args.sample, None)
        if args.before and args.fig:
            figure_before_after(args.before, args.report, args.fig)
        return 0
    rows = load(args.report, args.aic)
    if not rows:
        print("no row was predicted by both tools", file=sys.stderr)
        return 1
    text = markdown(table(rows))
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.fig:
        figure(rows, args.fig)
    if args.rounds_held_out and args.sample:
        _print_rounds(args.report, args.sample, args.aic)
    if args.offset_held_out and args.sample:
        _print_offsets(args.report, args.sample, args.aic)
    if args.burst and args.sample:
        print("\n| collection | engine | start mode (chosen on even lines) | fit rows | held-out rows | "
              "capsim TTFT | AIConfigurator TTFT | capsim TPOT | AIConfigurator TPOT |\n"
              "|---|---|---|---:|---:|---:|---:|---:|---:|")
        for r in start_mode_held_out(args.report, args.burst, args.sample, args.aic):
            print(f"| {r['collection']} | {r['backend']} | {r['chosen']} | {r['n_fit']} | {r['n_test']} | "
                  f"{r['ttft_ms']:.1%} | {r['aic_ttft_ms']:.1%} | {r['tpot_ms']:.1%} | {r['aic_tpot_ms']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
