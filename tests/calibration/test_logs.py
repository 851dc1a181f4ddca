"""`capsim fit`: engine-log import (column mapping, derived pairs), splitwise-sim's table, refits of points."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from calibration import fit as fitmod
from calibration.logs import FitLogConfig, fit_log, iteration_observation
from calibration.shapes import grid_shapes
from sim.io.profiles import load_fitted, load_hardware, load_model

from .same_fit import assert_same_fit
from .test_fit import TRUE

REPO = Path(__file__).resolve().parents[2]
LLAMA2_70B = REPO / "profiles" / "models" / "llama-2-70b.yaml"


def _write_log(path: Path, rng_seed: int = 0, noise: float = 0.005) -> None:
    """An engine log with its own column names (ms durations), from the true linear model."""
    rng = np.random.default_rng(rng_seed)
    model = fitmod.LinearModel(TRUE)
    rows = []
    for s in grid_shapes("standard", "cuda", load_model("qwen3-8b")):
        f = s.features
        o = iteration_observation(f["prefill_tokens"], f["prefill_seqs"], f["prefill_cached_tokens"], f["decode_seqs"],
                                  f["decode_kv_tokens"], 1.0)
        t = model.step_s(o.plan()) * float(np.exp(rng.normal(0, noise)))
        for _ in range(2):   # engines log repeated shapes: merged by median before fitting
            rows.append({"iter_ms": t * 1e3, "n_prefill": f["prefill_tokens"], "prefill_reqs": f["prefill_seqs"],
                         "prefix_hit": f["prefill_cached_tokens"], "n_decode": f["decode_seqs"],
                         "decode_ctx": f["decode_kv_tokens"], "engine": "vllm"})
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


MAPPING = {"duration_ms": "iter_ms", "prefill_tokens": "n_prefill", "prefill_seqs": "prefill_reqs",
           "prefill_cached_tokens": "prefix_hit", "decode_seqs": "n_decode", "decode_context_tokens": "decode_ctx"}


def test_iteration_log_with_mapped_columns(tmp_path):
    log = tmp_path / "engine.csv"
    _write_log(log)
    # no peaks given: the synthetic times are faster than any real card reading Qwen3-8B's weights, which
    # the datasheet check (MFU or MBU > 100%) would drop
    res = fit_log(FitLogConfig(log=log, model=load_model("qwen3-8b"), out=tmp_path / "p.yaml", columns=MAPPING,
                               where={"engine": "vllm"}))
    prof = load_fitted(tmp_path / "p.yaml")
    assert prof == res.profile and prof.hardware is None and prof.efficiency is None
    got = prof.linear.model_dump()
    for name in ("constant_s", "per_new_token_s", "per_pair_s", "per_kv_token_s"):
        assert got[name] == pytest.approx(getattr(TRUE, name), rel=0.05), name
    # a decode row has sequences = decode sequences: their split is weakly determined, their sum is not
    per_decode = got["per_sequence_s"] + got["per_decode_sequence_s"]
    assert per_decode == pytest.approx(TRUE.per_sequence_s + TRUE.per_decode_sequence_s, rel=0.05)
    assert prof.fit.mape < 0.01
    assert any("distinct shapes" in line for line in res.extra)
    assert prof.fit.n_points == len(grid_shapes("standard", "cuda", load_model("qwen3-8b")))


def test_iteration_log_errors_name_the_problem(tmp_path):
    log = tmp_path / "engine.csv"
    _write_log(log)
    cfg = dict(log=log, model=load_model("qwen3-8b"), out=tmp_path / "p.yaml")
    with pytest.raises(ValueError, match="needs a duration_ms or duration_s column .*--columns duration_ms=NAME"):
        fit_log(FitLogConfig(**cfg))
    with pytest.raises(ValueError, match=r"--columns: unknown column\(s\) \['latency'\]"):
        fit_log(FitLogConfig(**cfg, columns={"latency": "iter_ms"}))
    with pytest.raises(ValueError, match="--where gpu: no such column"):
        fit_log(FitLogConfig(**cfg, columns=MAPPING, where={"gpu": "h100"}))


def test_unusable_logs_are_named_not_tracebacks(tmp_path):
    """A folder, a non-UTF-8 file, and a log whose efficiency fit cannot time its own held-out points (too few
    distinct prefill sizes: the MFU line extrapolates to zero) each give a ValueError naming the problem."""
    cfg = dict(model=load_model("qwen2.5-0.5b"), out=tmp_path / "p.yaml")
    with pytest.raises(ValueError, match="is a folder, expected an engine log file"):
        fit_log(FitLogConfig(log=tmp_path, **cfg))
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"iter_ms,kind\n1.0,decode\n2.0,d\xe9code\n")
    with pytest.raises(ValueError, match=f"{bad}: line 3: not UTF-8 text"):
        fit_log(FitLogConfig(log=bad, **cfg))
    example = (REPO / "docs" / "examples" / "engine_log.csv").read_text().splitlines()
    plain = tmp_path / "plain.csv"
    plain.write_text("\n".join(line for line in example if not line.startswith("#")) + "\n")
    columns = {"duration_ms": "iter_ms", "prefill_tokens": "num_prefill_tokens", "prefill_seqs": "num_prefill_seqs",
               "prefill_cached_tokens": "num_cached_tokens", "decode_seqs": "num_decodes"}
    with pytest.raises(ValueError, match="the fitted efficiency model cannot time every measured point .*prefill MFU "
                                         "extrapolated to 0"):
        fit_log(FitLogConfig(log=plain, columns=columns, hardware=load_hardware("h100-sxm"), **cfg))


def test_derived_pairs_follow_the_simulator():
    # 2 prefill sequences of 512 after 1024 cached, 3 decodes holding 300 tokens in all
    o = iteration_observation(1024, 2, 2048, 3, 300, 0.1)
    assert o.pairs == 2 * (512 * 1024 + 512 * 513 // 2) + 300 + 3
    assert o.new_tokens == 1027 and o.kv_tokens_read == 2348 and o.num_seqs == 5 and o.kind == "mixed"
    # explicit pairs win; the decode part (context + 1 per sequence) is taken out of them
    assert iteration_observation(1024, 2, 2048, 3, 300, 0.1, pairs=10_000).prefill_pairs == 10_000 - 303
    with pytest.raises(ValueError, match="pairs 10 < decode pairs 303"):
        iteration_observation(1024, 2, 2048, 3, 300, 0.1, pairs=10)


def test_splitwise_needs_one_group(shared_data, tmp_path):
    with pytest.raises(ValueError, match=r"select one group with --where \(found 12: model=bloom-176b"):
        fit_log(FitLogConfig(log=shared_data / "profiling/splitwise_sim/perf_model.csv", fmt="splitwise",
                             model=load_model(LLAMA2_70B), out=tmp_path / "p.yaml"))


def test_splitwise_drops_impossible_rows_and_fits(shared_data, tmp_path):
    res = fit_log(FitLogConfig(log=shared_data / "profiling/splitwise_sim/perf_model.csv", fmt="splitwise",
                               model=load_model(LLAMA2_70B), out=tmp_path / "p.yaml", dtype="fp16",
                               where={"model": "llama2-70b", "hardware": "a100-80gb", "tensor_parallel": "2"},
                               hardware=load_hardware("a100-80g-sxm")))
    assert any("dropped 1 iteration(s)" in line and "64 seqs x 512 tokens" in line for line in res.extra)
    assert res.report.n_points == 31
    assert res.report.errors["efficiency/heldout"].mape < 0.10
    assert res.profile.efficiency.peak_tflops == pytest.approx(2 * 312)
    assert res.profile.valid_range.max_batch == 64


@pytest.mark.parametrize("hw,card", [("a100-80gb", "a100-80g-sxm"), ("h100-80gb", "h100-sxm")])
def test_shipped_splitwise_profiles_are_reproducible(shared_data, tmp_path, hw, card):
    shipped = load_fitted(REPO / "profiles" / "fitted" / f"{card}__llama-2-70b__fp16__splitwise-tp8.yaml")
    res = fit_log(FitLogConfig(log=shared_data / "profiling/splitwise_sim/perf_model.csv", fmt="splitwise",
                               model=load_model(LLAMA2_70B), out=tmp_path / "p.yaml", dtype="fp16",
                               where={"model": "llama2-70b", "hardware": hw, "tensor_parallel": "8"},
                               hardware=load_hardware(card)))
    assert_same_fit(res.profile, shipped)


def test_refit_a_points_file(tiny_run, tmp_path):
    cfg, run = tiny_run
    res = fit_log(FitLogConfig(log=run.points_path, model=cfg.model, out=tmp_path / "again.yaml", dtype="fp32"))
    assert res.profile.linear == run.profile.linear
    assert res.profile.efficiency == run.profile.efficiency
    assert res.profile.fit == run.profile.fit
