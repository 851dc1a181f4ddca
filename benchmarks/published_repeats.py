"""How well the published measurements agree with themselves: the floor under any predictor's error.

    python benchmarks/published_repeats.py ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv \
        [--backend vllm] [--system b200_sxm] [--report DIR/report.json ...]

Reads the rows with capsim's own reader (sim/published/rows.py: the client concurrency as the replay takes it)
of one serving mode (`--mode agg`, the default, or `disagg`: a run is then also its two pools' workers and
layouts, and a row that leaves a pool's worker count empty is left out) and prints three Markdown tables:

- **Repeats**: rows that describe the same run (engine and version, card, model, precision, ISL, OSL,
  concurrency, tp / pp / attention-DP / MoE-TP / EP) but carry different measurements. Per such configuration:
  its rows, their measurement dates (the `measured=` of `silicon_data_source`, where stated) and the spread
  max / min - 1 of TTFT and TPOT; then the median and p90 of that spread over every repeated configuration.
  A row copied into two collections with the same numbers (TTFT and TPOT within 0.1%) is one measurement, not a
  repeat (counted once).
- **Same numbers, different runs**: rows whose TTFT and TPOT agree within 0.1% on the same card, model,
  precision, ISL and OSL but whose layout or concurrency differ: one measurement filed under two descriptions,
  at most one of which is the run.
- With `--report` (`capsim validate-published ... --out DIR`'s report.json, several allowed): capsim's signed
  TTFT and TPOT error on every row of a repeated configuration, beside the row's date, so a miss can be set
  against how far the data disagree.
- With `--across-versions`, a fourth: the same run (everything above but the engine's version) measured under two
  versions of the engine. Per engine, card, model, precision, ISL and pair of versions: the configurations both
  measured, the median TTFT and TPOT of the later version over the earlier one and the median TTFT difference; with
  `--report`, capsim's signed median TTFT / TPOT error on each version's rows of those configurations. capsim's
  kernel tables are of one version per engine, so what the version alone moves is beyond it.

Nothing is fitted or changed; docs/fidelity.md, "How well the data agree with themselves".
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.io.errors import ConfigError  # noqa: E402
from sim.published.engines import release_number  # noqa: E402
from sim.published.rows import read_published  # noqa: E402

MEASURED = re.compile(r"measured=(\d{4}-\d\d-\d\d)")


def dates_by_line(path: Path) -> dict[int, str]:
    """The `measured=` date of each record's silicon_data_source by the line it starts on, as sim/published/rows.py
    numbers rows ('' when it states none)."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        out, start = {}, 2
        for rec in reader:
            found = MEASURED.search(rec.get("silicon_data_source") or "")
            out[start] = found.group(1) if found else ""
            start = reader.line_num + 1
    return out


def run_key(r) -> tuple:
    """What a row says was run (a disaggregated row's pools included); two rows with the same key and different
    numbers are repeats."""
    return (r.mode, r.backend, r.backend_version, r.system, r.model_path, r.precision, r.gemm_quant_mode, r.isl,
            r.osl, r.concurrency, r.tp, r.pp, r.attention_dp, r.moe_tp, r.moe_ep, r.prefill, r.decode)


def version_key(r) -> tuple:
    """run_key without the engine's version: the same run under another version of the engine."""
    return tuple(v for i, v in enumerate(run_key(r)) if i != 2)


def version_order(version: str) -> tuple:
    """Releases in numeric order (a release's suffixes, rc6.post2 before rc6.post3, by name), then what is not a
    release number (a nightly build) by name."""
    number = release_number(version)
    return (0, number, version) if number is not None else (1, (), version)


def same_numbers(a, b, tol: float = 1e-3) -> bool:
    """One measurement: TTFT and TPOT agree to 0.1% (a copy rounded to two decimals still matches)."""
    return abs(a.ttft_ms / b.ttft_ms - 1) < tol and abs(a.tpot_ms / b.tpot_ms - 1) < tol


def _distinct(rows: list) -> list[list]:
    """Rows clustered by same_numbers, in file order."""
    clusters: list[list] = []
    for r in rows:
        for c in clusters:
            if same_numbers(r, c[0]):
                c.append(r)
                break
        else:
            clusters.append([r])
    return clusters


def repeats(rows: list) -> dict[tuple, list]:
    """Configurations measured more than once (distinct numbers), each with one row per distinct measurement."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        groups[run_key(r)].append(r)
    out = {k: [c[0] for c in _distinct(v)] for k, v in groups.items()}
    return {k: v for k, v in out.items() if len(v) > 1}


def across_versions(rows: list) -> dict[tuple, dict[tuple[str, str], list[tuple[list, list]]]]:
    """Runs measured under more than one version of their engine. Keyed by (engine, card, model, precision, ISL,
    OSL), then by a pair of versions (earlier, later): per configuration both measured, the earlier version's
    distinct measurements and the later one's. One measurement filed under two version names (the same numbers)
    is not a second version's run and is left out."""
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[version_key(r)][r.backend_version].append(r)
    out: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for by_version in groups.values():
        versions = sorted(by_version, key=version_order)
        for i, a in enumerate(versions):
            for b in versions[i + 1:]:
                early, later = [c[0] for c in _distinct(by_version[a])], [c[0] for c in _distinct(by_version[b])]
                if all(same_numbers(x, y) for x in early for y in later):
                    continue
                r0 = early[0]
                key = (r0.backend, r0.system, r0.model_path, r0.precision, r0.isl, r0.osl)
                out[key][(a, b)].append((early, later))
    return out


def relabelled(rows: list) -> list[list]:
    """Sets of rows with the same numbers on the same card, model and lengths but different run descriptions
    (one row per description)."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        groups[(r.system, r.model_path, r.precision, r.isl, r.osl)].append(r)
    out = []
    for v in groups.values():
        for cluster in _distinct(v):
            by_run = {}
            for r in cluster:
                by_run.setdefault(run_key(r), r)
            if len(by_run) > 1:
                out.append(list(by_run.values()))
    return out


def spread(values: list[float]) -> float:
    """max / min - 1."""
    return max(values) / min(values) - 1


def _shape(tp, pp, dp, moe_tp, ep) -> str:
    text = f"tp{tp}"
    for name, size in (("pp", pp), ("dp", dp), ("moe_tp", moe_tp), ("ep", ep)):
        if size and size > 1:
            text += f" {name}{size}"
    return text


def layout(r) -> str:
    """'tp4 ep4', or for a disaggregated row its pools: '1 x tp4 : 4 x tp4'."""
    if r.prefill is not None and r.decode is not None:
        return " : ".join(f"{p.workers} x {_shape(p.tp, p.pp, p.attention_dp, p.moe_tp, p.moe_ep)}"
                          for p in (r.prefill, r.decode))
    return _shape(r.tp, r.pp, r.attention_dp, r.moe_tp, r.moe_ep)


def errors_by_line(reports: list[Path]) -> dict[int, tuple[float, float]]:
    """Signed (TTFT, TPOT) error per line from validate-published reports."""
    out = {}
    for path in reports:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            sys.exit(f"published_repeats: {path}: cannot read a validate-published report ({exc})")
        rows = report.get("rows") if isinstance(report, dict) else None
        if not isinstance(rows, list):
            sys.exit(f"published_repeats: {path}: no 'rows' list; expected a validate-published report.json")
        for row in rows:
            if isinstance(row, dict) and "predicted" in row:
                try:
                    p, m = row["predicted"], row["measured"]
                    out[int(row["line"])] = (p["ttft_ms"] / m["ttft_ms"] - 1, p["tpot_ms"] / m["tpot_ms"] - 1)
                except (KeyError, TypeError, ValueError, ZeroDivisionError):
                    sys.exit(f"published_repeats: {path}: a predicted row without line, or TTFT / TPOT measured and "
                             f"predicted: {row}")
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def print_repeats(groups: dict[tuple, list], dates: dict[int, str], errs: dict) -> None:
    print("| engine | card | model | precision | ISL / OSL | users | layout | rows (line: date, TTFT ms / TPOT ms"
          + (", capsim TTFT / TPOT error" if errs else "") + ") | TTFT spread | TPOT spread |")
    print("|---|---|---|---|---|---:|---|---|---:|---:|")
    for key in sorted(groups, key=lambda k: tuple(map(str, k))):
        rs = sorted(groups[key], key=lambda r: (dates.get(r.line, ""), r.line))
        cells = []
        for r in rs:
            cell = f"{r.line}: {dates.get(r.line) or 'no date'}, {r.ttft_ms:.1f} / {r.tpot_ms:.2f}"
            if r.line in errs:
                cell += f" ({_pct(errs[r.line][0])} / {_pct(errs[r.line][1])})"
            cells.append(cell)
        r0 = rs[0]
        print(f"| {r0.backend} {r0.backend_version}{'' if r0.mode == 'agg' else ' ' + r0.mode} | {r0.system} | {r0.model_path.split('/')[-1]} | {r0.precision} | "
              f"{r0.isl} / {r0.osl} | {r0.concurrency} | {layout(r0)} | {'; '.join(cells)} | "
              f"{spread([r.ttft_ms for r in rs]) * 100:.0f}% | {spread([r.tpot_ms for r in rs]) * 100:.0f}% |")


def print_summary(groups: dict[tuple, list]) -> None:
    ttft = np.array([spread([r.ttft_ms for r in rs]) for rs in groups.values()])
    tpot = np.array([spread([r.tpot_ms for r in rs]) for rs in groups.values()])
    print(f"\n{len(groups)} configurations measured more than once ({sum(map(len, groups.values()))} distinct "
          "measurements); spread max / min - 1, median / p90:")
    if len(groups):
        print(f"TTFT {np.median(ttft) * 100:.1f}% / {np.percentile(ttft, 90) * 100:.1f}%, "
              f"TPOT {np.median(tpot) * 100:.1f}% / {np.percentile(tpot, 90) * 100:.1f}%")


def print_relabelled(sets: list[list], dates: dict[int, str]) -> None:
    print(f"\n{len(sets)} measurements filed under more than one description of the run:\n")
    print("| card | model | ISL / OSL | TTFT ms / TPOT ms | rows (line: date, users, layout) |")
    print("|---|---|---|---|---|")
    for rs in sorted(sets, key=lambda s: min(r.line for r in s)):
        r0 = rs[0]
        cells = "; ".join(f"{r.line}: {dates.get(r.line) or 'no date'}, {r.concurrency} users, {layout(r)}"
                          for r in sorted(rs, key=lambda r: r.line))
        print(f"| {r0.system} | {r0.model_path.split('/')[-1]} | {r0.isl} / {r0.osl} | "
              f"{r0.ttft_ms:.1f} / {r0.tpot_ms:.2f} | {cells} |")


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def _signed(rows: list, errs: dict, which: int) -> str:
    found = [errs[r.line][which] for r in rows if r.line in errs]
    return _pct(_median(found)) if found else "-"


def print_versions(pairs: dict, errs: dict) -> None:
    """The same runs under two versions of their engine (across_versions), one line per card, model, lengths and
    pair of versions, then the medians over every configuration measured under two versions."""
    if not pairs:
        print("\nno run measured under two versions of its engine")
        return
    print("\n| engine | card | model | precision | ISL / OSL | versions (earlier -> later) | configurations | "
          "TTFT later / earlier | TTFT later - earlier | TPOT later / earlier |"
          + (" capsim TTFT / TPOT, earlier | capsim TTFT / TPOT, later |" if errs else ""))
    print("|---|---|---|---|---|---|---:|---:|---:|---:|" + ("---|---|" if errs else ""))
    all_ttft, all_tpot = [], []
    for key in sorted(pairs, key=lambda k: tuple(map(str, k))):
        for (a, b), configs in sorted(pairs[key].items(), key=lambda kv: (version_order(kv[0][0]),
                                                                          version_order(kv[0][1]))):
            mean = lambda rs, f: _median([f(r) for r in rs])  # noqa: E731 - one measurement per version and run
            ttft = [mean(later, lambda r: r.ttft_ms) / mean(early, lambda r: r.ttft_ms) for early, later in configs]
            diff = [mean(later, lambda r: r.ttft_ms) - mean(early, lambda r: r.ttft_ms) for early, later in configs]
            tpot = [mean(later, lambda r: r.tpot_ms) / mean(early, lambda r: r.tpot_ms) for early, later in configs]
            all_ttft += ttft
            all_tpot += tpot
            engine, card, model, precision, isl, osl = key
            line = (f"| {engine} | {card} | {model.split('/')[-1]} | {precision} | {isl} / {osl} | {a} -> {b} | "
                    f"{len(configs)} | {_median(ttft):.2f} | {_median(diff):+.1f} ms | {_median(tpot):.2f} |")
            if errs:
                early = [r for e, _ in configs for r in e]
                later = [r for _, lt in configs for r in lt]
                line += (f" {_signed(early, errs, 0)} / {_signed(early, errs, 1)} |"
                         f" {_signed(later, errs, 0)} / {_signed(later, errs, 1)} |")
            print(line)
    if all_ttft:
        dev = lambda xs: _median([abs(x - 1) for x in xs])  # noqa: E731
        print(f"\n{len(all_ttft)} runs measured under two versions of their engine (one line per pair of versions): "
              f"the version alone moves TTFT by {dev(all_ttft) * 100:.1f}% and TPOT by {dev(all_tpot) * 100:.1f}% "
              "(median |later / earlier - 1|)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, help="CSV in the schema of aiconfigurator's silicon_sample.csv")
    ap.add_argument("--backend", help="only rows of this engine")
    ap.add_argument("--mode", choices=("agg", "disagg"), default="agg", help="serving mode of the rows (default agg)")
    ap.add_argument("--system", action="append", default=[], help="only rows of this card (repeatable)")
    ap.add_argument("--report", action="append", default=[], type=Path,
                    help="a validate-published report.json whose errors to show beside the repeats (repeatable)")
    ap.add_argument("--across-versions", action="store_true",
                    help="also list the runs measured under two versions of their engine (the same run otherwise)")
    args = ap.parse_args(argv)
    try:
        published = read_published(args.file)
    except ConfigError as exc:
        sys.exit(f"published_repeats: {exc}")
    # a disaggregated row without its pools' worker counts does not say which run it was: never a repeat
    rows = [r for r in published if r.mode == args.mode
            and (r.mode == "agg" or (r.prefill.workers is not None and r.decode.workers is not None))
            and (not args.backend or r.backend == args.backend) and (not args.system or r.system in args.system)]
    dates = dates_by_line(args.file)
    groups = repeats(rows)
    print_repeats(groups, dates, errors_by_line(args.report))
    print_summary(groups)
    print_relabelled(relabelled(rows), dates)
    if args.across_versions:
        print_versions(across_versions(rows), errors_by_line(args.report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
