"""Paged KV cache: block pool, per-request block tables, reference counts, prefix index, eviction,
and a host tier for swapped-out requests.

State model
- Every block is in exactly one of: the free list (no content), in use (ref_count > 0, held by the
  block tables of ref_count requests), or cached-free (ref_count 0 but its content is indexed and
  reusable until evicted). free + used + cached-free = capacity.
- A full block's content is identified by a chain hash over (previous block's hash, the pieces of
  token streams it holds), so two requests share a block exactly when they share every token
  before and in it (reference section 6: reuse stops at the first differing token).
- Operations come in can_x / x pairs; the scheduler asks before it mutates. Blocks are freed at
  commit, after the iteration that read them (deferred free, reference section 3).
- Eviction of cached-free blocks is a policy: LRU on simulated time (default) or the chapter's
  value per byte V_h / size (section 6).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from sim.core.request import Request

OUTPUT_STREAM = 3  # stream kinds (first element of a stream id): 0 private prompt, 1 named prefix,
                   # 2 trace block id (Mooncake hash_ids), 3 a request's outputs


@dataclass(slots=True)
class Block:
    """One KV block of the pool: who holds it, and its content identity while indexed or cached."""

    block_id: int
    ref_count: int = 0
    content_hash: int | None = None
    """Set once the block is full and indexed (or was indexed and is now cached-free)."""
    last_used_s: float = 0.0
    hits: int = 0
    cached_since_s: float = 0.0
    depth: int = 0
    """Index of the block in its sequence (0 = first block), for the value-per-byte policy."""
    dup_of: int | None = None
    """Full, computed, but not indexed because another block already held this content (a
    concurrent duplicate); it takes over the index entry if that block is evicted."""


@dataclass
class KVStats:
    """Counters of one pool: evictions, swaps, prefix hits and copy-on-write copies."""

    evictions: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    swapped_bytes: float = 0.0
    hit_tokens: int = 0
    cow_copies: int = 0


def _adapter_seed(req: Request) -> int:
    """Hash seed of a request's blocks: KV is only shared between requests of one adapter."""
    return 0 if req.adapter is None else req.adapter + 1


def request_streams(req: Request) -> tuple:
    """The token streams a request's tokens come from: its prompt segments, then its outputs."""
    return req.segments + (((OUTPUT_STREAM, req.rid), 0, 1 << 62),)


def block_pieces(streams: tuple, start: int, end: int) -> tuple:
    """(stream, first, last) pieces covering tokens [start, end) of the concatenated streams."""
    pieces = []
    pos = 0
    for stream, s0, length in streams:
        lo, hi = max(start, pos), min(end, pos + length)
        if lo < hi:
            pieces.append((stream, s0 + lo - pos, s0 + hi - pos))
        pos += length
        if pos >= end:
            break
    return tuple(pieces)


def chain_hashes(streams: tuple, block_tokens: int, count: int, into: list[int], seed: int = 0) -> list[int]:
    """Extend `into` to the chain hashes of the first `count` full blocks (ints only: deterministic).

    Block b's hash is hash((hash of block b - 1, its pieces)), pieces as in `block_pieces`.
    """
    start = len(into)
    if start >= count:
        return into
    prev = into[-1] if into else seed
    if len(streams) <= 2 and (len(streams) == 1 or streams[0][2] >= count * block_tokens):
        # fast path: the blocks lie in the first stream (one piece each)
        stream, s0, _ = streams[0]
        for b in range(start, count):
            lo = s0 + b * block_tokens
            prev = hash((prev, ((stream, lo, lo + block_tokens),)))
            into.append(prev)
        return into
    # general path: walk the streams with a cursor (linear in blocks + pieces)
    k, pos = 0, 0  # first stream overlapping the current block, and where it starts
    lo = start * block_tokens
    while pos + streams[k][2] <= lo:
        pos += streams[k][2]
        k += 1
    for b in range(start, count):
        lo, hi = b * block_tokens, (b + 1) * block_tokens
        while pos + streams[k][2] <= lo:
            pos += streams[k][2]
            k += 1
        pieces = []
        j, p = k, pos
        while p < hi:
            stream, s0, length = streams[j]
            a, z = max(lo, p), min(hi, p + length)
            pieces.append((stream, s0 + a - p, s0 + z - p))
            p += length
            j += 1
        prev = hash((prev, tuple(pieces)))
        into.append(prev)
    return into


class BlockManager:
    """The GPU block pool of one replica, with an optional host tier for swapped requests."""

    def __init__(self, num_blocks: int, block_tokens: int, block_bytes: float, prefix_caching: bool = True,
                 eviction: str = "lru", host_blocks: int = 0, snapshot_tokens: int | None = None,
                 block_value: Callable[[Block, float], float] | None = None, prefix_index: str = "foresight"):
        if num_blocks < 1:
            raise ValueError(f"KV pool must hold at least one block, got {num_blocks}")
        if eviction not in ("lru", "value"):
            raise ValueError(f"unknown eviction policy {eviction!r}; known: lru, value")
        if prefix_index not in ("all", "foresight"):
            raise ValueError(f"unknown prefix index policy {prefix_index!r}; known: all, foresight")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.prefix_caching = prefix_caching
        self.prefix_index = prefix_index
        """all: every full block is indexed and kept (LRU) after its request leaves, as vLLM does;
        foresight: only blocks a later request will match (Request.shareable_tokens), an upper bound
        no real engine reaches because it needs to know the future."""
        self.eviction = eviction
        self.snapshot_tokens = snapshot_tokens
        self.block_value = block_value
        # Blocks come into being when first handed out (never one object per block up front: a pool
        # of 1e24 blocks costs nothing). Logically the free list is a stack whose bottom holds the
        # never-used ids in order (handed out 0, 1, 2, ...); `free_list` holds the freed ids on top of
        # them and the never-used ones start at `_fresh`.
        self.blocks: list[Block] = [Block(0)]
        self.free_list: list[int] = [0]
        self._fresh = 1
        self.cached_free: OrderedDict[int, None] = OrderedDict()        # LRU order: oldest first
        self.index: dict[int, int] = {}                                  # content hash -> block id
        self._dups: dict[int, list[int]] = {}                            # content hash -> live duplicates
        self.used_blocks = 0
        self.peak_blocks = 0
        self.host_capacity_blocks = host_blocks
        self.host_used_blocks = 0
        self.stats = KVStats()

    # ---- sizes --------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks a new allocation can take: the free list plus evictable cached blocks."""
        return len(self.free_list) + (self.num_blocks - self._fresh) + len(self.cached_free)

    @property
    def empty_blocks(self) -> int:
        """Blocks with no content (freed or never used)."""
        return len(self.free_list) + (self.num_blocks - self._fresh)

    def free_ids(self) -> list[int]:
        """The free list as a stack (last handed out first); materialises every id: for tests."""
        return list(range(self.num_blocks - 1, self._fresh - 1, -1)) + self.free_list

    def _take_empty(self, n: int) -> list[int]:
        """n block ids with no content, in hand-out order: freed ones first (last freed first), then
        never-used ones (created here with one reference)."""
        fl = self.free_list
        take = min(n, len(fl))
        new = fl[len(fl) - take:]
        del fl[len(fl) - take:]
        new.reverse()  # pop() order: the most recently freed first
        blocks = self.blocks
        for bid in new:
            blocks[bid].ref_count = 1
        more = n - take
        if more:
            f0 = self._fresh
            self._fresh = f0 + more
            blocks.extend([Block(b, 1) for b in range(f0, f0 + more)])
            new.extend(range(f0, f0 + more))
        return new

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens (the last one partly filled)."""
        return -(-tokens // self.block_tokens)

    # ---- prefix matching ----------------------------------------------------------------------
    def match(self, req: Request) -> list[int]:
        """Block ids whose content equals the start of `req`'s existing tokens, for a request that
        holds no blocks yet. At least one token is always left to compute (its logits are needed);
        with hybrid-model snapshots reuse rounds down to the last snapshot. Pure: changes nothing."""
        if not self.prefix_caching or req.block_table or not self.index:
            return []
        bs = self.block_tokens
        existing = req.prompt_tokens + req.output_tokens
        limit = (existing - 1) // bs
        hashes = req.block_hashes
        streams = request_streams(req)
        hits = []
        for b in range(limit):  # hash block by block: stop at the first miss
            if b >= len(hashes):
                chain_hashes(streams, bs, b + 1, hashes, seed=_adapter_seed(req))
            bid = self.index.get(hashes[b])
            if bid is None:
                break
            hits.append(bid)
        if self.snapshot_tokens:
            keep = (len(hits) * bs // self.snapshot_tokens) * self.snapshot_tokens
            hits = hits[:keep // bs]
        return hits

    # ---- allocation ---------------------------------------------------------------------------
    def can_allocate(self, req: Request, tokens: int, hits: list[int] | None = None) -> bool:
        """Can `req` hold `tokens` tokens, reusing `hits` (from match) when it holds nothing yet?"""
        hits = hits or []
        new = self.blocks_for(tokens) - len(req.block_table) - len(hits)
        if new <= 0:
            return True
        cached_hits = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return new <= self.free_blocks - cached_hits

    def allocate(self, req: Request, tokens: int, hits: list[int] | None = None, now_s: float = 0.0) -> None:
        """Grow `req`'s table to hold `tokens`; first take the matched `hits` (ref counts + 1)."""
        table = req.block_table
        for bid in hits or ():
            blk = self.blocks[bid]
            if blk.ref_count == 0:
                del self.cached_free[bid]
                self.used_blocks += 1
            blk.ref_count += 1
            blk.hits += 1
            blk.last_used_s = now_s
            table.append(bid)
        if hits:
            req.indexed_blocks = len(hits)
        extra = self.blocks_for(tokens) - len(table)
        if extra <= 0:
            return
        if extra > self.free_blocks:
            raise RuntimeError(f"request {req.rid}: allocate {extra} blocks with {self.free_blocks} free; "
                               "call can_allocate first")
        empty = self.empty_blocks
        new = self._take_empty(min(extra, empty))
        if extra > empty:
            evicted = [self._evict(now_s) for _ in range(extra - empty)]
            blocks = self.blocks
            for bid in evicted:
                blocks[bid].ref_count = 1
            new.extend(evicted)
        table.extend(new)
        self.used_blocks += extra
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks

    def _evict(self, now_s: float) -> int:
        if self.eviction == "lru" or self.block_value is None:
            bid, _ = self.cached_free.popitem(last=False)
        else:  # lowest value per byte first; LRU order breaks ties
            bid = min(self.cached_free, key=lambda b: self.block_value(self.blocks[b], now_s))
            del self.cached_free[bid]
        blk = self.blocks[bid]
        h = blk.content_hash
        del self.index[h]
        blk.content_hash = None
        blk.hits = 0
        self.stats.evictions += 1
        for dup in self._dups.pop(h, ()):  # a live block with the same content keeps it findable
            d = self.blocks[dup]
            if d.dup_of == h and d.ref_count > 0:
                d.dup_of, d.content_hash = None, h
                self.index[h] = dup
                break
        return bid

    def register(self, req: Request, tokens: int, now_s: float = 0.0, own_reuse: bool = False) -> None:
        """Index the full blocks among `req`'s first `tokens` tokens (their KV is computed).

        With `prefix_index` all, every full block is indexed (vLLM). With foresight, only blocks
        another request could match are (`req.shareable_tokens`); a private block goes straight back
        to the free list when released. Before a recompute preemption (`own_reuse`) every full block
        is indexed either way: the request itself will match them when it comes back.
        """
        if not self.prefix_caching:
            return
        if not own_reuse and self.prefix_index == "foresight":
            if req.shareable_tokens is not None:
                tokens = min(tokens, req.shareable_tokens)
        full = min(tokens // self.block_tokens, len(req.block_table))
        if full <= req.indexed_blocks:
            return
        hashes = chain_hashes(request_streams(req), self.block_tokens, full, req.block_hashes, seed=_adapter_seed(req))
        for b in range(req.indexed_blocks, full):
            blk = self.blocks[req.block_table[b]]
            if blk.content_hash is not None or blk.dup_of is not None:
                continue
            h = hashes[b]
            if h not in self.index:
                blk.content_hash = h
                blk.cached_since_s = now_s
                blk.depth = b
                self.index[h] = blk.block_id
            else:
                blk.dup_of = h
                self._dups.setdefault(h, []).append(blk.block_id)
        req.indexed_blocks = full

    def free(self, req: Request, now_s: float = 0.0) -> None:
        """Drop `req`'s references, tail first (so LRU evicts tails before the prefixes they extend)."""
        blocks, fl, cf = self.blocks, self.free_list, self.cached_free
        table = req.block_table
        released = 0
        k = req.indexed_blocks
        if not req.tail_shared and k < len(table):
            # fast path: blocks past the indexed prefix were handed out fresh to this request alone
            # (no content hash, one reference): straight back to the free list, tail first
            tail = table[k:]
            for bid in tail:
                blocks[bid].ref_count = 0
            tail.reverse()
            fl.extend(tail)
            released = len(tail)
            table = table[:k]
        for bid in reversed(table):
            blk = blocks[bid]
            rc = blk.ref_count - 1
            blk.ref_count = rc
            if rc:
                continue
            released += 1
            if blk.content_hash is None:
                if blk.dup_of is not None:
                    dups = self._dups.get(blk.dup_of)
                    if dups is not None:
                        dups.remove(bid)
                        if not dups:
                            del self._dups[blk.dup_of]
                    blk.dup_of = None
                fl.append(bid)
            else:
                blk.last_used_s = now_s
                cf[bid] = None
        self.used_blocks -= released
        req.block_table = []
        req.indexed_blocks = 0

    # ---- host tier (swap) ---------------------------------------------------------------------
    def can_swap_out(self, req: Request) -> bool:
        """Whether the host tier has room for all of `req`'s blocks."""
        return self.host_used_blocks + len(req.block_table) <= self.host_capacity_blocks

    def swap_out(self, req: Request, now_s: float) -> float:
        """Copy `req`'s blocks to host memory and release them on the GPU. Returns bytes moved."""
        n = len(req.block_table)
        self.host_used_blocks += n
        req.swapped_blocks = n
        self.register(req, req.computed_tokens, now_s)
        self.free(req, now_s)
        self.stats.swap_outs += 1
        self.stats.swapped_bytes += n * self.block_bytes
        return n * self.block_bytes

    def swap_in(self, req: Request) -> float:
        """Release `req`'s host copy once its GPU blocks are allocated again. Returns bytes moved."""
        n = req.swapped_blocks
        self.host_used_blocks -= n
        req.swapped_blocks = 0
        self.stats.swap_ins += 1
        self.stats.swapped_bytes += n * self.block_bytes
        return n * self.block_bytes

    # ---- warm prefixes ------------------------------------------------------------------------
    def warm(self, streams: tuple, tokens: int, now_s: float = 0.0) -> int:
        """Put the full blocks of a prefix in the cache before any request arrives (cached-free)."""
        if not self.prefix_caching:
            return 0
        hashes = chain_hashes(streams, self.block_tokens, tokens // self.block_tokens, [])
        added = 0
        for depth, h in enumerate(hashes):
            if h in self.index:
                continue
            if not self.empty_blocks:
                raise ValueError(f"warm prefix of {tokens} tokens does not fit the KV pool of {self.num_blocks} blocks")
            bid, = self._take_empty(1)
            blk = self.blocks[bid]
            blk.ref_count = 0
            blk.content_hash, blk.depth, blk.last_used_s, blk.cached_since_s = h, depth, now_s, now_s
            self.index[h] = bid
            self.cached_free[bid] = None
            added += 1
        return added
