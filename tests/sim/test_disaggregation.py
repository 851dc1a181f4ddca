"""Disaggregated serving: prefill pool, KV transfer over the link, decode pool (sim.core.pools)."""

import numpy as np
import pytest

from sim.core.handoff import KVLink
from sim.io.config import Scenario
from sim.io.errors import ConfigError
from sim.io.schema import validate_mapping
from tests.sim.helpers import run, scenario

# qwen3-8b in BF16: 36 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
QWEN3_8B_KV_BYTES_PER_TOKEN = 36 * 8 * 128 * 2 * 2


def disagg(prefill=1, decode=1, bandwidth_gbs=50.0, latency_s=0.0, prefill_pool=None, decode_pool=None):
    link = {"latency_s": latency_s} if bandwidth_gbs is None else {"bandwidth_gbs": bandwidth_gbs, "latency_s": latency_s}
    return {"prefill": {"replicas": prefill, **(prefill_pool or {})},
            "decode": {"replicas": decode, **(decode_pool or {})}, "link": link}


def requests(*specs):
    return {"kind": "requests", "requests": [{"arrival_s": a, "prompt_tokens": p, "output_tokens": o} for a, p, o in specs]}


def test_kv_bytes_per_token_is_the_hand_computed_one():
    from sim.io.profiles import load_model
    from sim.models.spec import ModelSpec
    assert ModelSpec(load_model("qwen3-8b")).kv_bytes_per_token("bf16") == QWEN3_8B_KV_BYTES_PER_TOKEN == 147456


def test_kv_transfer_time_is_exact_for_a_hand_computed_case():
    # 1000 prompt tokens x 147,456 B = 147,456,000 B over 50 GB/s = 2.94912 ms, plus 0.5 ms latency
    res = run(scenario(workload=requests((0.0, 1000, 10)), disaggregation=disagg(latency_s=0.0005)))
    r = res.requests.iloc[0]
    assert r["kv_transfer_bytes"] == 147_456_000
    assert r["transfer_start_s"] == r["prefill_done_s"] == r["first_token_s"]
    assert r["transfer_end_s"] - r["transfer_start_s"] == pytest.approx(0.00294912 + 0.0005, abs=1e-12)
    tr = res.summary["disaggregation"]["transfer"]
    assert tr["transfers"] == 1 and tr["bytes"] == 147_456_000
    assert tr["transfer_s"]["max"] == pytest.approx(0.00344912, abs=1e-12)


def test_a_link_sends_one_transfer_at_a_time_per_prefill_replica():
    link = KVLink(10e9, 0.001, lanes=2, senders=2)  # 20 GB/s over two GPUs' NICs
    assert link.transfer_s(2e9) == pytest.approx(0.101)
    assert link.book(0, 2e9, 1.0) == pytest.approx((1.0, 1.101))
    assert link.book(0, 2e9, 1.05) == pytest.approx((1.1, 1.201))   # waits for the first to leave the wire
    assert link.book(1, 2e9, 1.05) == pytest.approx((1.05, 1.151))  # another replica's link is free


def test_a_prefill_replica_of_attention_dp_ranks_sends_one_transfer_per_rank_at_once():
    link = KVLink(10e9, 0.0, lanes=0.5, senders=1, channels=2)  # two ranks' links, 2 copies out of each
    assert link.transfer_s(1e9) == pytest.approx(0.2)
    assert link.book(0, 1e9, 0.0) == pytest.approx((0.0, 0.2))
    assert link.book(0, 1e9, 0.05) == pytest.approx((0.05, 0.25))  # the other rank's link is free
    assert link.book(0, 1e9, 0.1) == pytest.approx((0.2, 0.4))     # both busy: waits for the first


def _layout(**kw):
    from sim.models.parallel import Layout
    return Layout(**kw)


def _spec(name):
    from sim.io.profiles import load_model
    from sim.models.spec import ModelSpec
    return ModelSpec(load_model(name))


@pytest.mark.parametrize("send, receive, share", [
    # Llama-3.1-70B, 8 KV heads: each prefill GPU sends its heads; the side with fewer head shards is the bottleneck
    (dict(tp=4), dict(tp=8), 1 / 4),
    (dict(tp=8), dict(tp=2), 1 / 2),
    (dict(tp=1), dict(tp=1), 1.0),
    (dict(tp=2, attention_dp=4), dict(tp=8), 1 / 2),     # a request's KV lives on one rank's two GPUs
    (dict(tp=4), dict(tp=16), 1 / 2),                   # 16 GPUs hold 8 heads twice: 2 copies over 4 links
    (dict(tp=1, pp=2), dict(tp=1), 1.0),                # the one receiving GPU takes every layer
    (dict(tp=2, pp=2), dict(tp=2, pp=2), 1 / 4),
])
def test_kv_transfer_share_of_a_gqa_model_is_hand_computed(send, receive, share):
    from sim.models.parallel import kv_transfer_share
    assert kv_transfer_share(_spec("llama-3.1-70b"), _layout(**send), _layout(**receive)) == pytest.approx(share)


@pytest.mark.parametrize("send, receive, share", [
    # DeepSeek-V3's MLA latent is whole on every GPU and every receiving GPU needs it whole
    (dict(tp=8), dict(tp=8), 1.0),                      # eight GPU pairs, one copy each
    (dict(tp=4), dict(tp=8), 2.0),                      # each prefill GPU sends two copies
    (dict(tp=8), dict(tp=4), 1.0),                      # four of the eight prefill GPUs send
    (dict(tp=1, attention_dp=4), dict(tp=8), 8.0),      # one rank's GPU sends eight copies
    (dict(tp=8), dict(tp=1, attention_dp=8), 1.0),      # to the one GPU of the request's decode rank
    (dict(tp=1, attention_dp=8), dict(tp=1, attention_dp=8), 1.0),
])
def test_kv_transfer_share_of_mla_is_hand_computed(send, receive, share):
    from sim.models.parallel import kv_transfer_share
    assert kv_transfer_share(_spec("deepseek-v3"), _layout(**send), _layout(**receive)) == pytest.approx(share)


def test_mla_kv_from_attention_dp_ranks_is_timed_as_the_busiest_link_carries_it():
    # DeepSeek-V3's latent in FP8: 61 layers x (512 + 64) x 1 B = 35,136 B a token, 35,136,000 B for 1,000 tokens.
    # From a one-GPU prefill rank to a TP8 decode replica that link sends eight copies: 281,088,000 B at 50 GB/s =
    # 5.62176 ms. Two prompts prefilled together on two ranks go out at once, each over its own rank's link.
    sc = scenario(model="deepseek-v3", hardware="h200-sxm", weight_format="fp8",
                  kv={"block_tokens": 64, "format": "fp8", "budget": "20GiB"},
                  workload=requests((0.0, 1000, 5), (0.0, 1000, 5)),
                  disaggregation=disagg(prefill_pool={"parallel": {"tp": 1, "attention_dp": 8, "ep": 8}},
                                        decode_pool={"parallel": {"tp": 8, "ep": 8}}))
    res = run(sc)
    req = res.requests
    assert (req["kv_transfer_bytes"] == 35_136_000).all()
    assert (req["transfer_start_s"] == req["prefill_done_s"]).all()
    assert (req["transfer_end_s"] - req["transfer_start_s"]).to_numpy() == pytest.approx([0.00562176] * 2, abs=1e-12)
    tr = res.summary["disaggregation"]["transfer"]
    assert tr["lanes"] == 0.125 and tr["channels"] == 8 and tr["link_wait_s"]["max"] == 0.0


def test_decode_never_starts_before_the_transfer_ends():
    wl = {"kind": "synthetic", "num_requests": 200, "arrival": {"kind": "poisson", "rate_rps": 6.0},
          "prompt_tokens": {"kind": "lognormal", "median": 1500, "sigma": 0.6, "max": 6000},
          "output_tokens": {"kind": "lognormal", "median": 40, "sigma": 0.6, "max": 300}}
    res = run(scenario(workload=wl, disaggregation=disagg(prefill=2, decode=1, bandwidth_gbs=5.0)))
    req, its = res.requests, res.iterations
    assert (req["status"] == "finished").all()
    assert (req["transfer_end_s"] > req["prefill_done_s"]).all()
    assert (req["decode_admitted_s"] >= req["transfer_end_s"]).all()
    # the second token comes from an iteration that started at or after the transfer's end
    dec = its[its["replica"] == 2]
    ends = (dec["start_s"] + dec["duration_s"]).to_numpy()
    for _, r in req.iterrows():
        k = np.searchsorted(dec["start_s"].to_numpy(), r["transfer_end_s"], side="left")
        assert k < len(dec) and ends[k] <= r["finish_s"] + 1e-12
    # prefill replicas never decode; the decode replica never prefills
    assert (its.loc[its["replica"] < 2, "decode_sequences"] == 0).all()
    assert (dec["prefill_tokens"] == 0).all()


def test_one_request_decodes_as_soon_as_its_kv_lands():
    res = run(scenario(workload=requests((0.0, 800, 5)), disaggregation=disagg(latency_s=0.002)))
    r, its = res.requests.iloc[0], res.iterations
    first_decode = its[its["replica"] == 1].iloc[0]
    assert first_decode["start_s"] == r["transfer_end_s"] == r["decode_admitted_s"]
    assert r["ttft_s"] == r["prefill_done_s"] - r["arrival_s"]  # TTFT is the prefill pool's
    assert r["replica"] == 1 and r["prefill_replica"] == 0 and r["output_tokens"] == 5
    # TPOT counts the transfer (the client waits through it); the decode pool's own does not
    assert r["tpot_s"] == pytest.approx((r["finish_s"] - r["first_token_s"]) / 4)
    pool_tpot = res.summary["disaggregation"]["decode"]["tpot_s"]["mean"]
    assert pool_tpot == pytest.approx((r["finish_s"] - r["decode_admitted_s"]) / 4)
    assert pool_tpot < r["tpot_s"]


def test_one_token_outputs_finish_in_the_prefill_pool():
    res = run(scenario(workload=requests((0.0, 500, 1)), disaggregation=disagg()))
    r = res.requests.iloc[0]
    assert r["status"] == "finished" and r["replica"] == 0 and np.isnan(r["transfer_end_s"])
    assert (res.iterations["replica"] == 0).all()


def test_gpu_seconds_and_energy_count_every_gpu_of_every_pool():
    res = run(scenario(workload=requests((0.0, 500, 20), (0.1, 700, 30)), disaggregation=disagg(prefill=2, decode=3)))
    s = res.summary
    assert s["gpus"] == 5 and s["replicas"] == 5
    assert s["gpu_seconds"] == pytest.approx(5 * s["makespan_s"])
    tdp = 600.0  # rtx-pro-6000-bw-ws power cap
    assert s["energy_j"] == pytest.approx(5 * tdp * s["makespan_s"])
    parts = s["disaggregation"]
    assert parts["prefill"]["gpu_seconds"] + parts["decode"]["gpu_seconds"] == pytest.approx(s["gpu_seconds"])


@pytest.mark.skipif("parallel" not in Scenario.model_fields, reason="the scenario schema has no parallel layout yet")
def test_gpu_seconds_count_the_gpus_of_each_pools_layout():
    sc = scenario(model="llama-3.1-70b", hardware="h100-sxm", kv={"block_tokens": 16, "budget": "20GiB"},
                  workload=requests((0.0, 500, 20)),
                  disaggregation=disagg(prefill=2, decode=1, prefill_pool={"parallel": {"tp": 2}},
                                        decode_pool={"parallel": {"tp": 4}}))
    s = run(sc).summary
    assert s["gpus"] == 2 * 2 + 1 * 4
    assert s["gpu_seconds"] == pytest.approx(8 * s["makespan_s"])
    assert s["disaggregation"]["transfer"]["lanes"] == 2


def test_pools_take_their_own_scheduler():
    pools = {"prefill_pool": {"scheduler": {"kind": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 8192}},
             "decode_pool": {"scheduler": {"kind": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 8192}}}
    res = run(scenario(workload=requests(*[(0.0, 300, 10)] * 8), disaggregation=disagg(**pools)))
    its = res.iterations
    assert its.loc[its["replica"] == 0, "batch_size"].max() == 4
    assert its.loc[its["replica"] == 1, "batch_size"].max() == 8


def _load(data):
    sc = validate_mapping(Scenario, data, "disagg.yaml")
    return sc


def test_a_pool_with_zero_replicas_is_refused_naming_the_field():
    base = scenario().model_dump(mode="python")
    base["disaggregation"] = disagg(prefill=0)
    with pytest.raises(ConfigError) as err:
        _load(base)
    assert "disaggregation.prefill.replicas" in str(err.value)


@pytest.mark.parametrize("pools, field, expected", [
    (disagg(decode=1_000_000), "disaggregation.decode.replicas", "less than or equal to 10000"),
    (disagg(bandwidth_gbs=1e-9), "disaggregation.link.bandwidth_gbs", "greater than or equal to 0.001"),
    (disagg(bandwidth_gbs=0.0), "disaggregation.link.bandwidth_gbs", "greater than or equal to 0.001"),
])
def test_absurd_pool_sizes_and_links_are_refused_naming_the_field(pools, field, expected):
    """A million decode replicas had taken 9 GB before the first request; a link of 1e-9 GB/s had run and printed
    transfers of 3e11 ms."""
    base = scenario().model_dump(mode="python")
    base["disaggregation"] = pools
    with pytest.raises(ConfigError) as err:
        _load(base)
    assert f"{field}: Input should be {expected}" in str(err.value)
    base = scenario().model_dump(mode="python")
    base["cluster"] = {"replicas": 20_000}
    with pytest.raises(ConfigError, match="cluster.replicas: Input should be less than or equal to 10000"):
        _load(base)


def test_a_missing_link_bandwidth_is_refused_naming_the_field():
    # the RTX PRO 6000 workstation card has no kv_transfer_link in its profile
    sc = scenario(workload=requests((0.0, 100, 5)), disaggregation=disagg(bandwidth_gbs=None))
    with pytest.raises(ConfigError) as err:
        run(sc)
    assert "disaggregation.link.bandwidth_gbs" in str(err.value) and "rtx-pro-6000-bw-ws" in str(err.value)


def test_the_card_link_is_used_when_the_scenario_gives_none():
    sc = scenario(hardware="h100-sxm", workload=requests((0.0, 1000, 5)), disaggregation=disagg(bandwidth_gbs=None))
    tr = run(sc).summary["disaggregation"]["transfer"]
    assert tr["bandwidth_bytes_per_s"] == 50e9  # ConnectX-7, 400 Gb/s per GPU


def test_what_disaggregation_does_not_model_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as err:
        run(scenario(cluster={"replicas": 2}, workload=requests((0.0, 100, 5)), disaggregation=disagg()))
    assert "cluster.replicas" in str(err.value)


def test_same_seed_same_bytes():
    wl = {"kind": "synthetic", "num_requests": 80, "arrival": {"kind": "poisson", "rate_rps": 5.0},
          "prompt_tokens": {"kind": "uniform", "low": 100, "high": 2000},
          "output_tokens": {"kind": "uniform", "low": 2, "high": 100}}
    a = run(scenario(workload=wl, disaggregation=disagg(prefill=2, decode=2)))
    b = run(scenario(workload=wl, disaggregation=disagg(prefill=2, decode=2)))
    assert a.digest() == b.digest()


def test_cancelled_in_transfer_leaves_without_decoding():
    reqs = {"kind": "requests", "requests": [{"arrival_s": 0.0, "prompt_tokens": 4000, "output_tokens": 50,
                                              "cancel_at_s": None}]}
    first = run(scenario(workload=reqs, disaggregation=disagg(bandwidth_gbs=0.5))).requests.iloc[0]
    mid = (first["transfer_start_s"] + first["transfer_end_s"]) / 2
    reqs["requests"][0]["cancel_at_s"] = float(mid)
    res = run(scenario(workload=reqs, disaggregation=disagg(bandwidth_gbs=0.5)))
    r = res.requests.iloc[0]
    assert r["status"] == "cancelled" and r["output_tokens"] == 1
    assert (res.iterations["replica"] == 0).all()  # the decode replica never ran


def _busy(**kw):
    wl = {"kind": "synthetic", "num_requests": 150, "arrival": {"kind": "poisson", "rate_rps": 12.0},
          "prompt_tokens": {"kind": "lognormal", "median": 900, "sigma": 0.6, "max": 4000},
          "output_tokens": {"kind": "lognormal", "median": 60, "sigma": 0.6, "max": 300}}
    return scenario(workload=wl, kv={"block_tokens": 16, "budget": "2GiB", "admission": "on_demand"},
                    disaggregation=disagg(prefill=2, decode=2, bandwidth_gbs=2.0), **kw)


def test_lazy_decode_and_fast_forward_change_no_byte(monkeypatch):
    from sim.core import pools
    from sim.core.engine import ModelledExecutor
    from sim.core.simulation import Simulation
    sc = _busy()
    base = Simulation(sc, ".").run()
    assert base.summary["preemptions"] > 0  # the decode pool's KV is short: the hard case
    assert Simulation(sc, ".", lazy_decode=False).run().digest() == base.digest()
    monkeypatch.setattr(pools, "ModelledExecutor", lambda st: ModelledExecutor(st, fast_forward=False))
    assert Simulation(sc, ".").run().digest() == base.digest()


def test_the_prefill_replica_holds_the_kv_until_it_is_sent():
    # 4000 tokens x 147,456 B over 0.5 GB/s: 1.18 s on the wire; a short prompt arriving meanwhile
    # finds the first prompt's 250 blocks still in use on the prefill replica, and none after
    res = run(scenario(workload=requests((0.0, 4000, 3), (0.5, 96, 3), (2.0, 96, 3)),
                       disaggregation=disagg(bandwidth_gbs=0.5)))
    req, its = res.requests, res.iterations
    assert req.loc[0, "transfer_end_s"] - req.loc[0, "transfer_start_s"] == pytest.approx(4000 * 147456 / 0.5e9)
    pre = its[its["replica"] == 0].reset_index(drop=True)
    assert len(pre) == 3  # one prefill each
    assert pre.loc[1, "start_s"] < req.loc[0, "transfer_end_s"] < pre.loc[2, "start_s"]
    assert pre.loc[1, "kv_blocks_in_use"] == 250 + 6   # held + the second prompt's own
    assert pre.loc[2, "kv_blocks_in_use"] == 6         # released once sent


@pytest.mark.parametrize("mode", ["decode_admission", "decode_step", "decode_recompute"])
def test_the_clients_first_token_from_the_decode_pool(mode):
    wl = requests((0.0, 800, 5))
    base = run(scenario(workload=wl, disaggregation=disagg(latency_s=0.002)))
    res = run(scenario(workload=wl, disaggregation={**disagg(latency_s=0.002), "first_token": mode}))
    b, r = base.requests.iloc[0], res.requests.iloc[0]
    # the prefill pool and the link do the same work at the same times; only what the client sees moves
    for col in ("prefill_done_s", "kv_transfer_bytes", "transfer_start_s", "transfer_end_s", "decode_admitted_s"):
        assert r[col] == b[col]
    assert b["first_token_s"] == b["prefill_done_s"]
    dec = res.iterations[res.iterations["replica"] == 1].reset_index(drop=True)
    assert dec.loc[0, "start_s"] == r["decode_admitted_s"] == r["transfer_end_s"]
    if mode == "decode_admission":  # sent with the KV, streamed when the decode replica takes the request
        assert r["first_token_s"] == r["decode_admitted_s"]
    else:  # the decode replica's first response, at the end of its first iteration with the request
        assert r["first_token_s"] == dec.loc[0, "start_s"] + dec.loc[0, "duration_s"]
    assert r["ttft_s"] == r["first_token_s"] - r["arrival_s"]
    assert r["tpot_s"] == pytest.approx((r["finish_s"] - r["first_token_s"]) / 4)
    assert r["output_tokens"] == 5 and r["status"] == "finished"
    if mode == "decode_recompute":  # vLLM: the last prompt token again, then all five outputs in the decode pool
        assert list(dec["prefill_tokens"]) == [1, 0, 0, 0, 0] and len(dec) == 5
        assert r["finish_s"] > b["finish_s"]
    else:  # four decode iterations, as with the prefill pool's token
        assert list(dec["prefill_tokens"]) == [0] * 4 and r["finish_s"] == b["finish_s"]


@pytest.mark.parametrize("mode", ["decode_admission", "decode_step", "decode_recompute"])
def test_first_token_modes_change_no_byte_under_lazy_decode_and_fast_forward(monkeypatch, mode):
    from sim.core import pools
    from sim.core.engine import ModelledExecutor
    from sim.core.simulation import Simulation
    sc = _busy()
    sc = sc.model_copy(update={"disaggregation": sc.disaggregation.model_copy(update={"first_token": mode})})
    base = Simulation(sc, ".").run()
    assert (base.requests["status"] == "finished").all() and base.summary["preemptions"] > 0
    assert (base.requests["first_token_s"] > base.requests["prefill_done_s"]).all()
    assert Simulation(sc, ".", lazy_decode=False).run().digest() == base.digest()
    monkeypatch.setattr(pools, "ModelledExecutor", lambda st: ModelledExecutor(st, fast_forward=False))
    assert Simulation(sc, ".").run().digest() == base.digest()


def test_an_unknown_first_token_mode_is_refused_naming_the_field():
    base = scenario().model_dump(mode="python")
    base["disaggregation"] = {**disagg(), "first_token": "router"}
    with pytest.raises(ConfigError) as err:
        _load(base)
    assert "disaggregation.first_token" in str(err.value) and "decode_recompute" in str(err.value)


def test_a_client_that_waits_for_the_prefill_servers_answer_gets_its_first_token_after_the_busy_iteration():
    """wait_for_prefill_response (SGLang's router): request A's KV lands while the prefill replica is computing B's
    prompt; the prefill server answers only after that iteration, so A's stream starts then (its tokens meanwhile
    come at once); B's KV lands on an idle prefill replica, so B is not held. The pools work as without it."""
    one = run(scenario(workload=requests((0.0, 1000, 40)), disaggregation=disagg()))
    t_done = float(one.requests.loc[0, "prefill_done_s"])
    wl = requests((0.0, 1000, 40), (t_done, 6000, 40))
    base_cfg = {**disagg(), "first_token": "decode_admission"}
    base = run(scenario(workload=wl, disaggregation=base_cfg))
    res = run(scenario(workload=wl, disaggregation={**base_cfg, "wait_for_prefill_response": True}))
    a, b = res.requests.iloc[0], res.requests.iloc[1]
    pre = res.iterations[res.iterations["replica"] == 0].reset_index(drop=True)
    busy = pre[(pre["start_s"] < a["transfer_end_s"]) & (pre["start_s"] + pre["duration_s"] > a["transfer_end_s"])]
    assert len(busy) == 1  # B's prefill was running when A's KV had gone
    answer = float(busy["start_s"].iloc[0] + busy["duration_s"].iloc[0])
    assert base.requests.loc[0, "first_token_s"] == a["decode_admitted_s"] < answer
    assert a["first_token_s"] == answer == a["prefill_response_s"] and a["ttft_s"] == answer - a["arrival_s"]
    assert base.requests["prefill_response_s"].isna().all()  # reported only when the client waits for it
    assert a["finish_s"] == base.requests.loc[0, "finish_s"]  # the decode pool's pace is unchanged
    assert a["tpot_s"] == pytest.approx((a["finish_s"] - answer) / 39)
    assert b["first_token_s"] == base.requests.loc[1, "first_token_s"]
    for col in ("prefill_done_s", "transfer_end_s", "decode_admitted_s"):
        assert (res.requests[col] == base.requests[col]).all()


def test_waiting_for_the_prefill_servers_answer_changes_no_byte_under_lazy_decode_and_fast_forward(monkeypatch):
    from sim.core import pools
    from sim.core.engine import ModelledExecutor
    from sim.core.simulation import Simulation
    sc = _busy()
    cfg = sc.disaggregation.model_copy(update={"first_token": "decode_admission", "wait_for_prefill_response": True})
    sc = sc.model_copy(update={"disaggregation": cfg})
    base = Simulation(sc, ".").run()
    plain = Simulation(sc.model_copy(update={"disaggregation": cfg.model_copy(
        update={"wait_for_prefill_response": False})}), ".").run()
    assert (base.requests["first_token_s"] >= plain.requests["first_token_s"]).all()
    assert (base.requests["first_token_s"] > plain.requests["first_token_s"]).any()
    assert Simulation(sc, ".", lazy_decode=False).run().digest() == base.digest()
    monkeypatch.setattr(pools, "ModelledExecutor", lambda st: ModelledExecutor(st, fast_forward=False))
    assert Simulation(sc, ".").run().digest() == base.digest()
