"""The error arithmetic of `capsim validate` (no torch): relative errors per metric and per request,
intervals, and which source of uncertainty is the widest."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
STATS = ("mean", "median", "p90", "p99")
SCALARS = ("makespan_s", "output_throughput_tok_s", "request_throughput_rps")
PER_REQUEST = ("ttft_s", "tpot_s", "e2e_s")
# the targets on CPU: |relative error| of the median
TARGETS = {"e2e_s": 0.05, "itl_s": 0.05, "ttft_s": 0.10}
KINDS = ("decode", "prefill", "mixed")


# ---------------------------------------------------------------------------------------------
# Error arithmetic (no torch)


def rel_error(simulated, measured) -> float | None:
    """(simulated - measured) / measured; None when either is missing or measured is 0."""
    if simulated is None or measured is None:
        return None
    s, m = float(simulated), float(measured)
    if not (math.isfinite(s) and math.isfinite(m)) or m == 0:
        return None
    return (s - m) / m


def compare_summaries(simulated: dict, measured: dict) -> dict:
    """Per metric and statistic: simulated, measured and their relative error."""
    out: dict = {}
    for key in LATENCIES:
        out[key] = {st: {"simulated": simulated[key][st], "measured": measured[key][st],
                         "rel_error": rel_error(simulated[key][st], measured[key][st])} for st in STATS}
    for key in SCALARS:
        out[key] = {"simulated": simulated[key], "measured": measured[key],
                    "rel_error": rel_error(simulated[key], measured[key])}
    return out


def per_request_errors(simulated: pd.DataFrame, measured: pd.DataFrame) -> dict:
    """Requests finished in both runs, paired by id: |relative error| per request (median, mean, p90)
    and the signed median."""
    cols = ["id", *PER_REQUEST]
    a = simulated.loc[simulated["status"] == "finished", cols]
    b = measured.loc[measured["status"] == "finished", cols]
    j = a.merge(b, on="id", suffixes=("_sim", "_real"))
    out = {"paired_requests": int(len(j))}
    for key in PER_REQUEST:
        s, m = j[f"{key}_sim"].to_numpy(float), j[f"{key}_real"].to_numpy(float)
        ok = np.isfinite(s) & np.isfinite(m) & (m > 0)
        r = (s[ok] - m[ok]) / m[ok]
        out[key] = ({"median_abs_rel_error": float(np.median(np.abs(r))), "mean_abs_rel_error": float(np.abs(r).mean()),
                     "p90_abs_rel_error": float(np.percentile(np.abs(r), 90)), "median_rel_error": float(np.median(r)),
                     "n": int(ok.sum())} if ok.any() else None)
    return out


def interval(values: list[float | None], lo: float = 5, hi: float = 95) -> list[float] | None:
    """The lo-hi percentile interval of the finite values (None when there are none)."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return None
    return [float(np.percentile(v, lo)), float(np.percentile(v, hi))]


def _metric_values(summary: dict) -> dict[str, float | None]:
    """Flat 'ttft_s.median' -> value of the metrics compared."""
    out = {f"{k}.{st}": summary[k][st] for k in LATENCIES for st in STATS}
    out.update({k: summary[k] for k in SCALARS})
    return out


def uncertainty_block(central: dict, measured: dict, workload: list[dict], model: list[dict],
                      replays: list[dict] | None = None) -> dict:
    """Intervals (5th-95th percentile) of every compared metric over the workload replications and the
    model draws, their widths relative to the central prediction, and which one is wider (`dominant`).
    With several replays of the same point, the measured values' range too (`measurement`: the
    replay's own run-to-run noise, relative to the first replay) and the widest of the three."""
    c, m = _metric_values(central), _metric_values(measured)
    wl = [_metric_values(s) for s in workload]
    md = [_metric_values(s) for s in model]
    rp = [_metric_values(s) for s in replays] if replays and len(replays) > 1 else []
    per: dict = {}
    votes = {"workload": 0, "model": 0}
    votes_all = {"workload": 0, "model": 0, "measurement": 0}
    for key, value in c.items():
        meas = m.get(key)
        iw = interval([x[key] for x in wl]) if wl else None
        im = interval([x[key] for x in md]) if md else None
        ir = interval([x[key] for x in rp], 0, 100) if rp else None

        def width(iv, ref):
            return None if iv is None or not ref else (iv[1] - iv[0]) / abs(ref)

        ww, wm, wr = width(iw, value), width(im, value), width(ir, meas)
        dom = widest = None
        headline = key.endswith(".median") or key in SCALARS
        if ww is not None and wm is not None:
            dom = "workload" if ww >= wm else "model"
            if headline:
                votes[dom] += 1
            widths = {"workload": ww, "model": wm}
            if wr is not None:
                widths["measurement"] = wr
            widest = max(widths, key=widths.get)
            if headline:
                votes_all[widest] += 1
        inside = {name: (None if iv is None or meas is None else bool(iv[0] <= meas <= iv[1]))
                  for name, iv in (("workload", iw), ("model", im))}
        per[key] = {"simulated": value, "measured": meas, "workload_interval": iw, "model_interval": im,
                    "workload_rel_width": ww, "model_rel_width": wm, "dominant": dom, "measured_inside": inside}
        if rp:
            per[key].update(measured_replays=[x[key] for x in rp], measurement_interval=ir,
                            measurement_rel_width=wr, widest=widest)
    overall = None if not (votes["workload"] or votes["model"]) else max(votes, key=votes.get)
    out = {"metrics": per, "dominant": overall, "votes_on_medians_and_totals": votes}
    if rp:
        out.update(replays=len(rp), widest=max(votes_all, key=votes_all.get), votes_widest=votes_all)
    return out
