"""sim.figures: each figure's data against the reference chapter where it has numbers, and
`capsim figures` writing every PNG with its data.

The chapter's numbers (reference sections 3-9, as in tests/chapter8) are each
computed here through the project's code (memory model, roofline, simulator, plans), never copied
into a figure's data.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim import figures as F
from capsim.cli import main

MiB, GiB = 2**20, 2**30


# ---- 01 memory fit ------------------------------------------------------------------------------

def test_memory_fit_table_reproduces_sections_3_and_10():
    t = F.memory_fit_table("12GiB").set_index("model")
    q = t.loc["qwen3-8b"]
    assert q["kv_bytes_per_token"] == 147456                                   # 144 KiB
    assert q["kv_bytes_per_request_short"] == 324 * MiB and q["requests_fit_short"] == 37
    assert q["kv_bytes_per_request_long"] == 1188 * MiB and q["requests_fit_long"] == 10
    # section 10: 12 / 56 / 320 KiB per token; Llama-3-70B 327,680 B
    assert [t.loc[m, "kv_bytes_per_token"] / 2**10 for m in ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b")] == [12, 56, 320]
    assert t.loc["llama-3-70b", "kv_bytes_per_token"] == 327680
    assert set(t.index) >= {"qwen3-8b", "llama-3.1-8b", "deepseek-v3"} and t["kv_bytes_per_token"].is_monotonic_increasing
    # what-if: q8_0 KV is 34/64 of BF16 (section 7)
    q8 = F.memory_fit_table("12GiB", kv_format="q8_0", models=["qwen3-8b"]).iloc[0]
    assert q8["kv_bytes_per_token"] == 147456 * 34 / 64
    assert F.plot_memory_fit(t.reset_index()).axes


def test_reads_per_token_is_figure_8_3():
    r = F.reads_per_token("qwen3-8b", contexts=(2048, 8192), batches=(1, 16, 64))
    at = r.set_index(["context_tokens", "batch"])
    assert r.groupby("context_tokens")["b_kv"].first().to_dict() == {2048: 51, 8192: 13}
    assert round(at.loc[(2048, 1), "bytes_per_output_token"] / GiB, 2) == 14.38
    assert round(at.loc[(2048, 64), "bytes_per_output_token"] / GiB, 2) == 0.50
    assert round(at.loc[(2048, 16), "weight_bytes_per_output_token"] / GiB, 2) == 0.88
    assert round(at.loc[(2048, 64), "weight_bytes_per_output_token"] / GiB, 2) == 0.22
    assert round(at.loc[(2048, 64), "kv_bytes_per_output_token"] / GiB, 2) == 0.28
    # section 4's table: 15.44 / 19.97 / 34.46 GB read per iteration at batch 1 / 16 / 64
    assert [round(at.loc[(2048, b), "bytes_per_iteration"] / 1e9, 2) for b in (1, 16, 64)] == [15.44, 19.97, 34.46]
    assert F.plot_reads_per_token(r).axes


# ---- 02 schedulers -------------------------------------------------------------------------------

# reference section 5: output times per request (ms), makespan and longest output interval
OUTPUTS = {
    "fixed": {0: [163.33, 189.62, 215.88, 242.13, 268.39, 294.65, 320.90, 347.16], 1: [163.33, 189.62],
              2: [791.65, 817.96], 3: [791.65, 817.96, 844.21, 870.47]},
    "continuous": {0: [163.33, 189.62, 565.59, 591.90, 686.71, 713.00, 739.30, 765.59], 1: [163.33, 189.62],
                   2: [565.59, 591.90], 3: [686.71, 713.00, 739.30, 765.59]},
    "chunked": {0: [163.33, 189.62, 284.43, 391.82, 511.80, 644.36, 670.67, 765.48], 1: [163.33, 189.62],
                2: [644.36, 670.67], 3: [765.48, 791.74, 817.99, 844.25]},
}
SUMMARY = {"fixed": (870.47, 26.31), "continuous": (765.59, 375.97), "chunked": (844.25, 132.56)}


@pytest.fixture(scope="module")
def gantt():
    return F.scheduler_gantt(F.POLICIES)


@pytest.mark.parametrize("policy", F.POLICIES)
def test_gantt_reproduces_every_output_time_of_section_5(gantt, policy):
    g = gantt[gantt["policy"] == policy]
    assert (round(g["makespan_s"].iloc[0] * 1e3, 2), round(g["longest_interval_s"].iloc[0] * 1e3, 2)) == SUMMARY[policy]
    for rid, times in OUTPUTS[policy].items():
        emitted = g[(g["request"] == rid) & g["emits"]]["end_s"]
        assert [round(t * 1e3, 2) for t in emitted] == times


def test_gantt_members_and_prefill_tokens(gantt):
    cont = gantt[gantt["policy"] == "continuous"]
    third = cont[cont["iteration"] == 2].set_index("request")
    # r2 joins as soon as r1 finishes: its whole 8K prefill shares an iteration with r0's decode
    assert third.loc[0, "role"] == "decode" and third.loc[2, "role"] == "prefill"
    assert third.loc[2, "prefill_tokens"] == 8192
    assert round((third.loc[2, "end_s"] - third.loc[2, "start_s"]) * 1e3, 2) == 375.97
    fixed = gantt[(gantt["policy"] == "fixed") & (gantt["role"] == "prefill") & (gantt["request"] >= 2)]
    assert fixed["iteration"].nunique() == 1 and fixed.set_index("request")["prefill_tokens"].to_dict() == {2: 8192, 3: 2048}
    chunks = gantt[(gantt["policy"] == "chunked") & (gantt["request"] == 2) & (gantt["role"] == "prefill")]
    assert chunks["prefill_tokens"].tolist() == [2048] * 4


def test_output_intervals_and_plot(gantt):
    iv = F.output_intervals(("continuous",), request=0)
    assert round(iv["interval_s"].max() * 1e3, 2) == 375.97 and iv["output"].tolist() == list(range(1, 9))
    fig = F.plot_scheduler_gantt(gantt, iv)
    assert len(fig.axes) == 4


def test_membership_is_refused_where_it_cannot_be_derived():
    from sim.api import run_scenario
    res = run_scenario(F.CHAPTER8 / "scheme-d-16tok.yaml")   # speculative rounds
    with pytest.raises(ValueError, match="speculative"):
        F.iteration_membership(res)


def test_token_budget_trades_late_arrivals_for_the_longest_interval():
    t = F.token_budget_tradeoff(budgets=(512, 2048, 8192, 16384))
    assert t["late_ttft_mean_s"].is_monotonic_decreasing
    assert t["running_longest_interval_s"].is_monotonic_increasing
    assert t["late_ttft_mean_s"].iloc[0] > 2 * t["late_ttft_mean_s"].iloc[-1]
    assert t["running_longest_interval_s"].iloc[-1] > 5 * t["running_longest_interval_s"].iloc[0]
    assert F.plot_token_budget(t).axes


# ---- 03 prefix caching ---------------------------------------------------------------------------

def test_prefix_value_per_byte_reproduces_section_6():
    v = F.prefix_value_per_byte(prefix_tokens=(2048, 6144), hit_probabilities=(0.5,))
    gen5 = v[v["link"].str.startswith("PCIe Gen5")].set_index("prefix_tokens")
    gen4 = v[v["link"].str.startswith("PCIe Gen4")].set_index("prefix_tokens")
    a, b = gen5.loc[6144], gen5.loc[2048]
    assert round(a["value_s"] * 1e3, 1) == 132.7 and round(b["value_s"] * 1e3, 1) == 40.3
    assert round(a["value_s_per_mib"] * 1e3, 3) == 0.154 and round(b["value_s_per_mib"] * 1e3, 3) == 0.140
    assert round(a["break_even_hit_probability"] * 100, 1) == 4.8
    assert round(gen4.loc[6144, "break_even_hit_probability"] * 100, 1) == 10.1
    # in an 864 MiB cache one A saves 132.7 ms, three Bs 120.9 ms
    assert round(3 * b["value_s"] * 1e3, 1) == 120.9
    assert F.plot_prefix_value(v).axes


def test_prefix_cache_curve_on_the_mooncake_trace(shared_data):
    trace = F.mooncake_trace(shared_data)
    if trace is None:
        pytest.skip(f"no Mooncake conversation trace under {shared_data}")
    c = F.prefix_cache_curve(trace, budgets_gib=(32, 256), window_s=(0, 300), rate_scale=0.3, baseline=False)
    assert c["requests"].tolist() == [918, 918]
    small, big = c.iloc[0], c.iloc[1]
    # vLLM's policy (the default): blocks nobody reuses crowd out later turns' blocks, even at 256 GiB
    assert small["prefix_hit_rate"] < 0.06 < big["prefix_hit_rate"] < 0.15
    assert big["ttft_p50_s"] < small["ttft_p50_s"]
    assert bool(small["card_fit"]) and not bool(big["card_fit"])
    assert F.plot_prefix_cache(c).axes
    f = F.prefix_cache_curve(trace, budgets_gib=(32, 256), window_s=(0, 300), rate_scale=0.3, baseline=False,
                             prefix_index="foresight")
    # the upper bound, caching only blocks a later request matches: reuse needs a big cache
    assert f.iloc[0]["prefix_hit_rate"] < 0.06 and f.iloc[1]["prefix_hit_rate"] > 0.15
    assert (f["prefix_hit_rate"] >= c["prefix_hit_rate"]).all()


def test_prefix_cache_curve_names_the_missing_trace(tmp_path):
    assert F.mooncake_trace(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="Mooncake"):
        F.prefix_cache_curve(tmp_path / "absent.jsonl")


# ---- 04 speculative ---------------------------------------------------------------------------------

def test_speculative_tradeoffs_reproduce_section_8():
    t = F.speculative_tradeoffs(acceptances=(0.25, 0.75), max_drafts=4)
    four = t[t["num_drafts"] == 4]
    n = four.groupby("acceptance")["expected_outputs"].first()
    assert round(n[0.25], 2) == 1.33 and round(n[0.75], 2) == 3.05
    ngram = four[four["drafter"] == "n-gram lookup"].set_index("acceptance")
    assert round(ngram.loc[0.25, "per_token_s"] * 1e3, 1) == 19.8 and round(ngram.loc[0.75, "per_token_s"] * 1e3, 2) == 8.64
    assert (four["verify_s"] == F.PLAIN_STEP_S).all()          # 5 verified positions cost the plain 26.26 ms step
    assert round(t["drafter_pass_s"].iloc[0] * 1e3, 2) == 3.57  # 2.10 GB at 15.44 GB / 26.26 ms
    seq = four[four["drafter"].str.startswith("draft model")].set_index("acceptance")
    assert seq.loc[0.75, "draft_s"] == pytest.approx(4 * t["drafter_pass_s"].iloc[0])
    assert F.plot_speculative_tradeoffs(t).axes


def test_draft_time_budget_is_figure_8_32():
    b = F.draft_time_budget(acceptances=(0.25, 0.75), num_drafts=4).set_index("acceptance")
    assert round(b.loc[0.25, "draft_time_budget_s"] * 1e3, 1) == 8.7
    assert round(b.loc[0.75, "draft_time_budget_s"] * 1e3, 1) == 53.9
    assert F.plot_draft_time_budget(b.reset_index()).axes


# ---- 05 capacity -----------------------------------------------------------------------------------

def test_memory_deadline_plane_places_schemes_a_to_d():
    p = F.memory_deadline_plane().set_index(["variant", "label"])
    main12 = p.loc["12gib"]
    assert main12.loc["A", "kv_need_bytes"] == 19008 * MiB and main12.loc["A", "memory_ratio"] == pytest.approx(19008 / 12288)
    assert main12.loc["B", "kv_need_bytes"] == 6048 * MiB and round(main12.loc["B", "makespan_s"], 2) == 9.01
    assert round(main12.loc["C", "kv_need_bytes"] / GiB, 2) == 9.86 and round(main12.loc["C", "makespan_s"], 2) == 14.55
    assert main12.loc["D", "kv_need_bytes"] == 9236 * MiB and round(main12.loc["D", "makespan_s"], 2) == 4.56
    assert main12.loc["D", "deadline_ratio"] == pytest.approx(main12.loc["D", "makespan_s"] / 7.0)
    assert main12["quadrant"].to_dict() == {"A": "out of memory and late", "B": "late", "C": "late", "D": "feasible"}
    assert not p.loc["6gib", "feasible"].any()       # with 6 GiB nothing is feasible
    assert F.plot_memory_deadline_plane(p.reset_index()).axes


# ---- capsim figures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """`capsim figures` once, with an empty data folder: every figure but the Mooncake one."""
    out, empty = tmp_path_factory.mktemp("figures"), tmp_path_factory.mktemp("no-data")
    assert main(["figures", "--out", str(out), "--data-dir", str(empty)]) == 0
    return out


def test_capsim_figures_writes_every_png_and_its_data(written, capsys):
    expected = set(F.FIGURES) - {"prefix-cache"}
    assert {p.stem for p in written.glob("*.png")} == expected
    for name in expected:
        assert (written / f"{name}.png").stat().st_size > 20_000
        assert list(written.glob(f"{name}*.csv"))
    assert not (written / "prefix-cache.png").exists()


def test_capsim_figures_data_of_the_simulated_figures(written):
    conc = pd.read_csv(written / "speculation-concurrency.csv")
    cross = pd.read_csv(written / "speculation-concurrency-crossover.csv")
    lone = conc[conc["concurrency"] == 1].set_index("variant")
    assert lone.loc["plain decode", "tpot_p50_s"] == pytest.approx(0.02626, abs=1e-4)   # the measured batch-1 step
    assert (lone["speedup_vs_plain"].drop("plain decode") > 2).all()
    assert (conc[conc["concurrency"] == conc["concurrency"].max()]["speedup_vs_plain"].drop_duplicates() <= 1).all()
    assert cross["stops_paying_at"].notna().all() and (cross["stops_paying_at"] > 64).all()
    rates = pd.read_csv(written / "goodput-vs-rate.csv")
    assert rates["slo_attainment"].is_monotonic_decreasing and rates["requests"].eq(2867).all()
    assert (rates["goodput_rps"] <= rates["request_throughput_rps"] + 1e-12).all()
    reps = pd.read_csv(written / "replicas.csv")
    n = int(reps["simulated_replicas"].iloc[0])
    assert reps.set_index("replicas").loc[n, "attainment"] >= 0.9
    assert n == 1 or reps.set_index("replicas").loc[n - 1, "attainment"] < 0.9
    assert reps["division_replicas"].iloc[0] == math.ceil(20.0 / reps["per_replica_capacity_rps"].iloc[0] - 1e-9)
    gantt = pd.read_csv(written / "scheduler-gantt-r0-intervals.csv")
    assert round(gantt.groupby("policy")["interval_s"].max()["continuous"] * 1e3, 2) == 375.97
    plane = pd.read_csv(written / "memory-deadline-plane.csv")
    assert plane[plane["feasible"]]["label"].tolist() == ["D"]


def test_capsim_figures_only_and_missing_data(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path / "one"), "--only", "draft-budget", "prefix-value"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["draft-budget.csv", "draft-budget.png",
                                                                    "prefix-value.csv", "prefix-value.png"]
    assert main(["figures", "--out", str(tmp_path / "two"), "--only", "prefix-cache", "--data-dir", str(tmp_path)]) == 2
    assert "Mooncake" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["figures", "--out", str(tmp_path), "--only", "no-such-figure"])


def test_every_figure_has_a_notebook_and_the_package_exports_them():
    import sim.figures.registry
    from tests.conftest import REPO
    for spec in F.FIGURES.values():
        assert (REPO / "notebooks" / f"{spec.notebook}.ipynb").exists()
    for name in F.__all__:
        assert hasattr(F, name)
    assert F.FIGURES is sim.figures.registry.FIGURES
    assert np.isfinite(F.PLAIN_STEP_S)
