"""A KV block pool that only counts, for runs in which no block is ever matched, indexed, cached or shared.

A block's id is a label: the prefix index, the cached-free list and forked branches are what make one block
different from another. When a run can use none of them (`counting_suffices`), each request only needs how many
blocks it holds, and the pool how many are in use: CountingBlockManager gives the same answers as BlockManager
(the same admissions, the same counts in every row and summary) without a block table, a free list or a Block
object (tests/sim/test_kv_count.py runs both).
"""

from __future__ import annotations

from sim.core.kv import BlockManager
from sim.core.request import Request


def counting_suffices(scenario, workload) -> bool:
    """Whether no block of this run can ever be matched, indexed, cached or shared:

    - prefix caching is off; or the prefix index is foresight (only blocks a later request will match), no request
      shares a token stream with another (no shared streams, no warm prefixes, no retried answers re-sending a
      prompt) and admission reserves (no recompute preemption, which indexes a request's own blocks either way);
    - and no parallel sampling (branches share their leader's prompt blocks)."""
    kv = scenario.kv
    if kv.warm_prefixes or (workload.leader is not None and bool((workload.leader >= 0).any())):
        return False
    if not kv.prefix_caching:
        return True
    return (kv.prefix_index == "foresight" and kv.admission == "reserve" and not workload.shared_streams
            and not scenario.accuracy.retries)


class CountingBlockManager(BlockManager):
    """BlockManager's counts without its blocks: a request holds `Request.held_blocks`; nothing is indexed."""

    def __init__(self, num_blocks: int, block_tokens: int, block_bytes: float, host_blocks: int = 0,
                 prefix_caching: bool = False):
        super().__init__(num_blocks, block_tokens, block_bytes, prefix_caching=False, prefix_index="foresight",
                         host_blocks=host_blocks)
        self.blocks, self.free_list, self._fresh = [], [], 0
        self._aside = 0  # blocks taken out of the pool for good (vLLM's null block)
        self._caching = prefix_caching
        """The run's prefix caching (on under foresight): a request's own blocks would be indexed before a
        recompute preemption, which counting_suffices rules out by reserve admission; `register` checks it."""

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self._aside - self.used_blocks

    @property
    def empty_blocks(self) -> int:
        return self.num_blocks - self._aside - self.used_blocks

    def _take_empty(self, n: int) -> list[int]:
        """n blocks out of the pool for good (a scheduler's null block); their labels."""
        if n > self.free_blocks:
            raise RuntimeError(f"take {n} blocks with {self.free_blocks} free")
        first = self._aside
        self._aside += n
        return list(range(first, first + n))

    def match(self, req: Request) -> list[int]:
        """No cached block to match: always none."""
        return []

    def can_allocate(self, req: Request, tokens: int, hits: list[int] | None = None) -> bool:
        """Whether the blocks `req` needs past those it holds, to hold `tokens` tokens, are free."""
        new = -(-tokens // self.block_tokens) - req.held_blocks
        return new <= 0 or new <= self.num_blocks - self._aside - self.used_blocks

    def allocate(self, req: Request, tokens: int, hits: list[int] | None = None, now_s: float = 0.0) -> None:
        """Grow `req` to the blocks that hold `tokens` tokens (never shrinks it)."""
        if hits:
            raise RuntimeError(f"request {req.rid}: a counting KV pool has no blocks to share")
        extra = -(-tokens // self.block_tokens) - req.held_blocks
        if extra <= 0:
            return
        if extra > self.num_blocks - self._aside - self.used_blocks:
            raise RuntimeError(f"request {req.rid}: allocate {extra} blocks with {self.free_blocks} free; "
                               "call can_allocate first")
        req.held_blocks += extra
        self.used_blocks += extra
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks

    def register(self, req: Request, tokens: int, now_s: float = 0.0, own_reuse: bool = False) -> None:
        """Nothing is indexed (counting_suffices); a preempted request's own blocks, which a caching pool indexes
        for its return, are refused rather than forgotten."""
        if own_reuse and self._caching:
            raise RuntimeError(f"request {req.rid}: a counting KV pool cannot index a preempted request's blocks "
                               "(counting_suffices needs admission reserve with prefix caching on)")

    def free(self, req: Request, now_s: float = 0.0) -> None:
        """Give back every block `req` holds."""
        self.used_blocks -= req.held_blocks
        req.held_blocks = 0

    def can_swap_out(self, req: Request) -> bool:
        """Whether the host tier has room for all of `req`'s blocks."""
        return self.host_used_blocks + req.held_blocks <= self.host_capacity_blocks

    def swap_out(self, req: Request, now_s: float) -> float:
        """Move `req`'s blocks to the host tier (BlockManager.swap_out less the indexing). Returns bytes moved."""
        n = req.held_blocks
        self.host_used_blocks += n
        req.swapped_blocks = n
        self.free(req, now_s)
        self.stats.swap_outs += 1
        self.stats.swapped_bytes += n * self.block_bytes
        return n * self.block_bytes

    def free_ids(self) -> list[int]:
        """Refused: a counting pool has no free list."""
        raise RuntimeError("a counting KV pool has no block ids (free_ids needs BlockManager)")

    def last_used(self, bid: int) -> float:
        """Refused: a counting pool keeps no block."""
        raise RuntimeError("a counting KV pool keeps no blocks (last_used needs BlockManager)")

    def share_tail(self, req: Request) -> None:
        """Refused: forked branches share blocks."""
        raise RuntimeError("a counting KV pool cannot share blocks (parallel sampling needs BlockManager)")

    def warm(self, streams: tuple, tokens: int, now_s: float = 0.0) -> int:
        """Refused: a warm prefix is cached blocks."""
        raise RuntimeError("a counting KV pool caches nothing (warm prefixes need BlockManager)")
