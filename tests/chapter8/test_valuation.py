"""Edge cases of sim.planning.valuation that the reference's worked numbers do not reach."""

from __future__ import annotations

import math

import pytest

from sim.planning import valuation as va
from sim.models.spec import ModelSpec
from sim.io.profiles import load_hardware, load_model


def test_no_host_link_on_unified_memory_names_the_card():
    with pytest.raises(ValueError, match="apple-m2-max: host_link.bandwidth_gbs_per_direction is null"):
        va.host_link_bytes_per_s(load_hardware("apple-m2-max"))


@pytest.mark.parametrize("mfu", [0.0, 1.2])
def test_recompute_rejects_mfu_outside_unit_interval(mfu):
    with pytest.raises(ValueError, match=f"mfu must be in \\(0, 1\\], got {mfu}"):
        va.recompute_s(ModelSpec(load_model("qwen3-8b")), load_hardware("rtx-pro-6000-bw-ws"), 2048, mfu)


def test_break_even_is_infinite_when_fetch_is_not_faster():
    assert va.break_even_hit_probability(recompute_s=1.0, fetch_s=1.0, maintenance_s=0.1) == math.inf


def test_snapshot_restore_without_a_usable_snapshot_recomputes_everything():
    assert va.snapshot_restore(3000, [4096, 8192]) == (0, 3000)
    assert va.snapshot_restore(8192, [4096, 8192]) == (8192, 0)


def test_compressed_transfer_counts_decompression_when_given():
    t = va.compressed_transfer(size_bytes=64e9, size_ratio=0.25, link_bytes_per_s=64e9, decompress_bytes_per_s=128e9)
    assert (t.raw_s, t.compressed_transfer_s, t.decompress_s, t.compressed_s) == (1.0, 0.25, 0.5, 0.75)
    assert t.saved_s == pytest.approx(0.25)


def test_one_prefetch_buffer_serialises_copy_and_compute():
    spec = ModelSpec(load_model("qwen3-8b"))
    one = va.offload_decode(spec, 9, 1, 64e9, compute_step_s=0.02626, batch=4, steps=255)
    two = va.offload_decode(spec, 9, 2, 64e9, compute_step_s=0.02626, batch=4, steps=255)
    assert one.step_s == pytest.approx(0.02626 + one.copy_s_per_step)
    assert two.step_s == pytest.approx(max(0.02626, two.copy_s_per_step))


def test_paged_blocks_partial_shared_block_stays_private():
    # 6 shared tokens with 4-token blocks: one full shared block, the partial one is copied on write.
    assert va.paged_blocks([9, 13], 4, shared_prefix_tokens=6, sharing_requests=2) == 3 + 4 - 1


def test_nothing_good_costs_infinitely_much():
    assert va.cost_per_good_result_s(9.01, 0) == math.inf
    assert va.energy_per_good_result_j(9.01, 600, 0) == math.inf


def test_amdahl_rejects_a_fraction_above_one():
    with pytest.raises(ValueError, match="fraction must be in \\[0, 1\\], got 1.5"):
        va.amdahl_speedup(1.5, 4)
