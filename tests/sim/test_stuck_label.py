"""A request that can never start is rejected with the right cause: "kv:" only when the empty pool
cannot hold it (that flips memory_fit); otherwise the scheduler's rule is named (issue 16)."""

from __future__ import annotations

from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.core.schedulers.fixed import FixedBatching, FixedConfig


class _NeverAdmits(FixedBatching):
    """A policy that admits nothing (as a token budget or chunk rule might): the stall is not memory."""

    def _schedule(self, plan, now_s):
        return None


def _stuck(scheduler_cls, num_blocks: int, prompt: int, output: int) -> str:
    pool = BlockManager(num_blocks, 16, 1.0)
    sched = scheduler_cls(FixedConfig(max_num_seqs=4), pool, "reserve", None)
    sched.admit(Request(0, 0.0, prompt, output, 0.0), 0.0)
    assert sched.plan(0.0) is None
    (req,) = sched.dropped
    return req.reject_reason


def test_a_request_larger_than_the_pool_is_a_kv_rejection():
    assert _stuck(FixedBatching, num_blocks=4, prompt=100, output=10).startswith("kv:")


def test_a_policy_that_cannot_start_a_request_that_fits_is_not_a_kv_rejection():
    reason = _stuck(_NeverAdmits, num_blocks=100, prompt=100, output=10)
    assert reason.startswith("scheduler: fixed cannot start it"), reason
