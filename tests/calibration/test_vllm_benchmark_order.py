"""The vLLM benchmark's replay order (benchmarks/vllm_validation.py, `--order`): every replay once per round,
the same order on every run of the script, a different one from round to round."""

from __future__ import annotations

from benchmarks.vllm_validation import CALIBRATION, POINTS, round_order

CAL = CALIBRATION.split(",")


def test_fixed_runs_the_calibration_first_then_the_points():
    assert round_order(CAL, list(POINTS), 1, "fixed") == CAL + list(POINTS)
    assert round_order(CAL, list(POINTS), 4, "fixed") == CAL + list(POINTS)


def test_shuffled_is_a_seeded_permutation_that_changes_from_round_to_round():
    orders = [round_order(CAL, list(POINTS), r, "shuffled") for r in range(1, 6)]
    for order in orders:
        assert sorted(order) == sorted(CAL + list(POINTS))
    assert orders == [round_order(CAL, list(POINTS), r, "shuffled") for r in range(1, 6)]   # reproducible
    assert len({tuple(o) for o in orders}) == 5
    # no scenario sits at the same place in every round, and the calibration is not always first
    assert all(len({o.index(n) for o in orders}) > 1 for n in CAL + list(POINTS))
    assert any(o[0] not in CAL for o in orders)
