"""Reference section 7 through the simulator: compressed KV, weight offload, multi-LoRA."""

import pytest

from tests.sim.helpers import run, scenario

D_W, K = 15_136_811_008, 147_456
BETA = 1.16e12  # effective bandwidth of the batch-64 MBU (64.9%)
SLOPE = [{"bytes": 1.0e10, "time_s": 1.0e10 / BETA}, {"bytes": 4.0e10, "time_s": 4.0e10 / BETA}]
ONE_8K = [{"arrival_s": 0.0, "prompt_tokens": 8192, "output_tokens": 2}]


def decode_step(fmt, conversion=0.0):
    sc = scenario(kv={"block_tokens": 16, "format": fmt, "budget": "12GiB", "conversion_s_per_token": conversion},
                  step_time={"model": {"kind": "efficiency", "decode_table": SLOPE, "prefill_mfu": 0.6}},
                  workload={"kind": "requests", "requests": ONE_8K})
    its = run(sc).iterations
    return its[its["prefill_tokens"] == 0]["duration_s"].iloc[0]


def test_q8_kv_reads_540_mib_less_and_conversion_eats_into_it():
    saved = decode_step("bf16") - decode_step("q8_0")
    assert round(saved * 1e3, 2) == 0.49  # 540 MiB / 1.16 TB/s = 0.487 ms
    per_token = 0.2e-3 / 8192
    net = decode_step("bf16") - decode_step("q8_0", per_token)
    assert round(net * 1e3, 2) == 0.29  # 0.487 - 0.2 (the chapter prints 0.287)
    loss = decode_step("bf16") - decode_step("q8_0", 0.8e-3 / 8192)
    assert round(loss * 1e3, 2) == -0.31  # conversion of 0.8 ms costs 0.313 ms


def offload_run(hardware, buffers):
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 2048, "output_tokens": 256} for _ in range(4)]
    return run(scenario(hardware=hardware, offload={"layers": 9, "prefetch_buffers": buffers},
                        step_time={"model": {"kind": "linear", "constant_s": 0.02626}},
                        workload={"kind": "requests", "requests": reqs}))


def test_offloading_every_fourth_ffn_over_pcie_misses_the_deadline():
    res = offload_run("rtx-pro-6000-bw-ws", 2)
    s = res.summary
    assert round(s["offload_copy_s_per_step"] * 1e3, 1) == 42.5  # 2.72 GB / 64 GB/s
    assert int(s["decode_throughput_tok_s"]) == 94             # 4 / 0.0425
    decode = res.iterations[res.iterations["prefill_tokens"] == 0]
    assert len(decode) == 255 and decode["duration_s"].sum() >= 10.8  # misses 7 s
    one = offload_run("rtx-pro-6000-bw-ws", 1).iterations
    # one buffer serialises copy and compute: 26.26 + 42.5 ms per step
    assert one[one["prefill_tokens"] == 0]["duration_s"].iloc[0] == pytest.approx(0.02626 + s["offload_copy_s_per_step"])


def test_gh200_link_hides_the_copy():
    s = offload_run("gh200", 2).summary
    assert round(s["offload_copy_s_per_step"] * 1e3, 1) == 6.0
    assert round(255 * s["offload_copy_s_per_step"], 2) == 1.54
    assert s["itl_s"]["max"] == pytest.approx(0.02626)  # compute-bound again


def test_offload_frees_weight_memory_for_kv():
    base = {"gpu_memory_utilization": 0.5, "activation_bytes": "4GiB"}
    plain = run(scenario(kv={"block_tokens": 16, "format": "bf16", "budget": base})).summary
    off = run(scenario(kv={"block_tokens": 16, "format": "bf16", "budget": base},
                       offload={"layers": 9, "prefetch_buffers": 2})).summary
    assert (off["kv_budget_bytes"] - plain["kv_budget_bytes"]) == 2016 * 2**20  # 2592 freed - 2 buffers


def test_lora_adapters_cost_memory_and_time_per_distinct_adapter():
    lora = {"adapters": 100, "rank": 16, "targets": ["q", "v"], "per_adapter_s": 0.0005}
    wl = {"kind": "synthetic", "num_requests": 200, "arrival": {"kind": "poisson", "rate_rps": 4.0},
          "prompt_tokens": {"kind": "fixed", "value": 500}, "output_tokens": {"kind": "fixed", "value": 50}}
    few = run(scenario(lora=lora, workload={**wl, "adapters": {"count": 2}})).summary
    many = run(scenario(lora=lora, workload={**wl, "adapters": {"count": 100}})).summary
    assert round(few["lora_memory_bytes"] / 2**30, 2) == 1.43  # 100 x 14.6 MiB
    assert many["busy_s"] > few["busy_s"]  # spreading the batch over many adapters costs time
    assert few["completed"] == many["completed"] == 200
