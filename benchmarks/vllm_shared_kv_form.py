"""Which form of the shared-KV feature the vLLM benchmark's profile prices, decided on calibration replays alone
(the rule in benchmarks/vllm_validation.py's docstring, stated before run 5's replays were taken):

- `rereads`: KV tokens of prefix-cache hits that another sequence of the same iteration reads too, every
  reader but the first (sim.core.step.StepPlan.shared_kv_tokens);
- `hits`: every KV token read in a prefix-cache hit, first reads included (StepPlan.hit_kv_tokens).

For each calibration scenario with shared prefixes (a "layout"), each form is fitted on all the other calibration
replays and its MAPE taken on the held-out layout's iterations; the form with the lower mean of those MAPEs wins,
a tie within TIE keeps `rereads`. A three-price fit (private KV, first read of a hit prefix, re-read) on the whole
pool is reported beside it as a diagnostic; it decides nothing.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from calibration import fit as fitmod
from calibration.engines.vllm_logs import iteration_rows
from calibration.logs import iteration_observation, merge_duplicates

FORMS = ("rereads", "hits")
TIE = 0.001   # 0.1 percentage point of MAPE


def observations(iterations: list[dict], shape_entries: int, form: str) -> list:
    """`capsim fit`'s observations of one replay's iterations with the shared-KV feature in `form`."""
    return [iteration_observation(*row) for row in iteration_rows(iterations, shape_entries, form)]


def _heldout_mape(train: list, test: list, shape_entries: int, form: str) -> float:
    lin = fitmod.fit_linear(merge_duplicates(train), shape_entries, form)
    return fitmod.Errors.of(fitmod.predictor(lin, None), test).mape


def _three_prices(hits: list, rereads: list) -> dict:
    """NNLS on relative error, as fit_linear, with the hit KV split into first reads and re-reads."""
    X = np.array([o.vector() for o in hits], dtype=float)
    r = np.array([o.shared_kv_tokens for o in rereads], dtype=float)
    X[:, 9] -= r                       # hits less re-reads: first reads
    X = np.column_stack([X, r])
    if all(o.completions == o.prefill_seqs for o in hits):
        X[:, 6] = 0.0
    t = np.array([o.time_s for o in hits], dtype=float)
    A = X / t[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    z, _ = nnls(A / scale, np.ones(len(t)), maxiter=50 * A.shape[1])
    coef = z / scale
    p = X @ coef
    return {"per_kv_token_s": float(coef[3]), "per_first_hit_read_s": float(coef[9]),
            "per_reread_s": float(coef[10]), "mape": float(np.mean(np.abs(p / t - 1.0)))}


def choose(calibration: list[tuple[str, list[dict]]], shape_entries: int) -> dict:
    """calibration: (scenario name, one replay's iterations with hit_keys) for every calibration replay.
    Returns the rule's numbers and the chosen form."""
    obs = {f: {} for f in FORMS}
    for name, its in calibration:
        for f in FORMS:
            obs[f].setdefault(name, []).extend(observations(its, shape_entries, f))
    names = list(obs["hits"])
    layouts = [n for n in names if any(o.shared_kv_tokens for o in obs["hits"][n])]
    if len(layouts) < 2:
        raise ValueError(f"the shared-KV form needs at least two calibration layouts with shared prefixes; "
                         f"got {layouts} among {names}")
    heldout = {f: {held: _heldout_mape([o for n in names if n != held for o in obs[f][n]], obs[f][held],
                                       shape_entries, f) for held in layouts} for f in FORMS}
    mean = {f: float(np.mean(list(heldout[f].values()))) for f in FORMS}
    chosen = "hits" if mean["hits"] < mean["rereads"] - TIE else "rereads"
    reread_share = {n: float(sum(o.shared_kv_tokens for o in obs["rereads"][n])
                             / max(1, sum(o.shared_kv_tokens for o in obs["hits"][n]))) for n in layouts}
    pool = {f: [o for n in names for o in obs[f][n]] for f in FORMS}
    return {"rule": "lower mean held-out MAPE over the shared-prefix calibration layouts, each fitted on all other "
                    f"calibration replays; a tie within {TIE * 100:.1f} percentage point keeps rereads",
            "layouts": layouts, "heldout_mape": heldout, "mean_heldout_mape": mean, "chosen": chosen,
            "reread_share_of_hit_reads": reread_share,
            "three_prices_diagnostic": _three_prices(pool["hits"], pool["rereads"])}


def lines(res: dict) -> list[str]:
    """The rule's outcome in words (results.md, the log)."""
    out = [f"shared-KV form: {res['chosen']} ({res['rule']})"]
    for f in FORMS:
        per = ", ".join(f"{n} {m:.2%}" for n, m in res["heldout_mape"][f].items())
        out.append(f"  {f}: mean held-out MAPE {res['mean_heldout_mape'][f]:.2%} ({per})")
    out.append("  re-reads / hit reads: " + ", ".join(f"{n} {s:.0%}" for n, s in res["reread_share_of_hit_reads"].items()))
    d = res["three_prices_diagnostic"]
    out.append(f"  three prices (diagnostic, whole pool): private {d['per_kv_token_s'] * 1e6:.3f} us, first hit read "
               f"{d['per_first_hit_read_s'] * 1e6:.3f} us, re-read {d['per_reread_s'] * 1e6:.3f} us per KV token "
               f"(MAPE {d['mape']:.2%})")
    return out
