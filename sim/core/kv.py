"""Paged KV cache: block pool, per-request block tables, reference counts, prefix index, eviction,
and a host tier for swapped-out requests.

State model
- Every block is in exactly one of: the free list (no content), in use (held by the block tables
  of ref_count requests), or cached-free (ref_count 0 but its content is indexed and reusable until
  evicted). free + used + cached-free = capacity.
- A *private* block (in use by one request, past its indexed_blocks, neither indexed nor a
  duplicate, its request not sharing its tail with forked branches) keeps ref_count 0 while it is
  held: its one reference is implicit, so handing it out and releasing it writes nothing per block.
  Indexing it (`_index`) or sharing it (`share_tail`) makes its count explicit (1).
- A full block's content is identified by a chain hash over (previous block's hash, the pieces of
  token streams it holds), so two requests share a block exactly when they share every token
  before and in it (reference section 6: reuse stops at the first differing token).
- Operations come in can_x / x pairs; the scheduler asks before it mutates. Blocks are freed at
  commit, after the iteration that read them (deferred free, reference section 3).
- Eviction of cached-free blocks is a policy: LRU on simulated time (default) or the chapter's
  value per byte V_h / size (section 6).
- Which full blocks are cached is `prefix_index`: all (default, vLLM: every full block, reusable
  until evicted) or foresight (only blocks a later request will match: an upper bound).
- Cost of all (LRU): a block holding a token of a stream no other request's tokens come from (past
  Request.shareable_tokens, which the workload derives from token identity, as a hash would) can
  only ever be matched by a request with its id. Such blocks are not hashed while their request
  runs; when it finishes they join the LRU list as one run, unhashed, evicted from its end in the
  order single entries freed tail first would be. A request that may meet its own earlier blocks
  (preempted, swapped, retried, a disaggregated leg, or any request whose id left runs, which are
  hashed then) hashes every block (Request.hash_all). Hits, eviction order and counts are those of
  hashing every block as it fills (LAZY_PRIVATE = False; tests/sim/test_prefix_index.py compares
  the two, and withholds shareable_tokens to show the results do not depend on it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from sim.core.request import Request

LAZY_PRIVATE = True
"""Under prefix_index all + LRU, release private full blocks as unhashed LRU runs (see above);
False hashes and indexes every full block as it fills (same results, slower: for tests)."""

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


class CachedFree:
    """Cached-free blocks in LRU order, oldest first. An entry is one block (key: its id, value None)
    or a run of a finished request's private blocks (key < 0, value: their ids in table order, the
    last evicted first, as single entries freed tail first would be). len() counts blocks;
    iterating yields block ids in eviction order."""

    __slots__ = ("od", "count", "_next_run")

    def __init__(self):
        self.od: OrderedDict[int, list[int] | None] = OrderedDict()
        self.count = 0
        self._next_run = -1

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for key, run in self.od.items():
            if run is None:
                yield key
            else:
                yield from reversed(run)

    def add(self, bid: int) -> None:
        """Append one block (the most recently used)."""
        self.od[bid] = None
        self.count += 1

    def add_run(self, ids: list[int]) -> int:
        """Append a run of blocks that only their own finished request could match; its key."""
        key = self._next_run
        self._next_run = key - 1
        self.od[key] = ids
        self.count += len(ids)
        return key

    def remove(self, bid: int) -> None:
        """Take one single-entry block out (a prefix hit; a block of a run: BlockManager._take_from_run)."""
        del self.od[bid]
        self.count -= 1


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
                 block_value: Callable[[Block, float], float] | None = None, prefix_index: str = "all"):
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
        self._lru = eviction == "lru" or block_value is None
        self._lazy = LAZY_PRIVATE and prefix_index == "all" and self._lru
        """Private full blocks are released as unhashed LRU runs (module docstring)."""
        self._runs_of: dict[int, list[int]] = {}       # request id -> keys of its cached runs
        self._run_owner: dict[int, tuple] = {}         # run key -> (request id, segments, adapter, first block, released at)
        self._hashed_runs: set[int] = set()            # runs hashed since (their owner came back)
        self._in_run: dict[int, int] = {}              # block id -> run key, for blocks of hashed runs
        # Blocks come into being when first handed out (never one object per block up front: a pool
        # of 1e24 blocks costs nothing). Logically the free list is a stack whose bottom holds the
        # never-used ids in order (handed out 0, 1, 2, ...); `free_list` holds the freed ids on top of
        # them and the never-used ones start at `_fresh`.
        self.blocks: list[Block] = [Block(0)]
        self.free_list: list[int] = [0]
        self._fresh = 1
        self.cached_free = CachedFree()                                  # LRU order: oldest first
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

    def last_used(self, bid: int) -> float:
        """When block `bid` was last used (for tests: an unhashed run keeps one time for its blocks)."""
        runs = [k for k, run in self.cached_free.od.items() if run and k not in self._hashed_runs and bid in run]
        return self._run_owner[runs[0]][4] if runs else self.blocks[bid].last_used_s

    def free_ids(self) -> list[int]:
        """The free list as a stack (last handed out first); materialises every id: for tests."""
        return list(range(self.num_blocks - 1, self._fresh - 1, -1)) + self.free_list

    def _take_empty(self, n: int) -> list[int]:
        """n block ids with no content, in hand-out order: freed ones first (last freed first), then
        never-used ones (created here). They come out private: ref_count 0, one implicit reference."""
        fl = self.free_list
        take = min(n, len(fl))
        new = fl[len(fl) - take:]
        del fl[len(fl) - take:]
        new.reverse()  # pop() order: the most recently freed first (their ref_count is 0: private)
        more = n - take
        if more:
            f0 = self._fresh
            self._fresh = f0 + more
            self.blocks.extend(map(Block, range(f0, f0 + more)))
            new.extend(range(f0, f0 + more))
        return new

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens (the last one partly filled)."""
        return -(-tokens // self.block_tokens)

    # ---- prefix matching ----------------------------------------------------------------------
    def match(self, req: Request) -> list[int]:
        """Block ids whose content equals the start of `req`'s existing tokens, for a request that
        holds no blocks yet. At least one token is always left to compute (its logits are needed);
        with hybrid-model snapshots reuse rounds down to the last snapshot. Changes no state that
        decides a result (it may hash the runs of an earlier request with the same id, see _hash_runs)."""
        if self._runs_of and req.rid in self._runs_of:
            self._hash_runs(req)
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
        new = -(-tokens // self.block_tokens) - len(req.block_table)
        if not hits:
            return new <= 0 or new <= len(self.free_list) + (self.num_blocks - self._fresh) + self.cached_free.count
        new -= len(hits)
        if new <= 0:
            return True
        blocks = self.blocks
        cached_hits = sum(1 for b in hits if blocks[b].ref_count == 0)
        return new <= self.free_blocks - cached_hits

    def allocate(self, req: Request, tokens: int, hits: list[int] | None = None, now_s: float = 0.0) -> None:
        """Grow `req`'s table to hold `tokens`; first take the matched `hits` (ref counts + 1)."""
        table = req.block_table
        for bid in hits or ():
            blk = self.blocks[bid]
            if blk.ref_count == 0:
                if bid in self._in_run:
                    self._take_from_run(bid)
                else:
                    self.cached_free.remove(bid)
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
        if extra > empty:  # evicted blocks (unindexed now, ref_count 0) are private too
            new.extend(self._evict_lru(extra - empty) if self._lru else
                       [self._evict(now_s) for _ in range(extra - empty)])
        if req.tail_shared:  # its branches hold references past its indexed prefix: counts stay explicit
            blocks = self.blocks
            for bid in new:
                blocks[bid].ref_count = 1
        table.extend(new)
        self.used_blocks += extra
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks

    def _evict_lru(self, n: int) -> list[int]:
        """Evict the n least recently used cached-free blocks; their ids, in eviction order."""
        od, blocks = self.cached_free.od, self.blocks
        out: list[int] = []
        while len(out) < n:
            key, run = od.popitem(last=False)
            if run is not None:  # a run of private blocks, taken from its end
                take = min(n - len(out), len(run))
                taken = run[len(run) - take:]
                taken.reverse()
                del run[len(run) - take:]
                if key in self._hashed_runs:
                    for bid in taken:
                        del self._in_run[bid]
                        if blocks[bid].content_hash is not None:
                            self._unindex(blocks[bid])
                out.extend(taken)
                if run:
                    od[key] = run
                    od.move_to_end(key, last=False)
                else:
                    self._drop_run(key)
                continue
            blk = blocks[key]
            self._unindex(blk)
            out.append(key)
        self.cached_free.count -= n
        self.stats.evictions += n
        return out

    def _evict(self, now_s: float) -> int:
        """Evict one block by value per byte (LRU order breaks ties)."""
        bid = min(self.cached_free, key=lambda b: self.block_value(self.blocks[b], now_s))
        self.cached_free.remove(bid)
        self._unindex(self.blocks[bid])
        self.stats.evictions += 1
        return bid

    def _unindex(self, blk: Block) -> None:
        """Drop an evicted block's index entry; a live block with the same content takes it over."""
        h = blk.content_hash
        del self.index[h]
        blk.content_hash = None
        blk.hits = 0
        for i, dup in enumerate(dups := self._dups.pop(h, [])):  # a live block with its content keeps it findable
            d = self.blocks[dup]
            if d.dup_of == h and d.ref_count > 0:
                d.dup_of, d.content_hash, self.index[h] = None, h, dup
                if i + 1 < len(dups):  # the others stay duplicates, now of it (free() finds them here)
                    self._dups[h] = dups[i + 1:]
                break

    def _hash_runs(self, req: Request) -> None:
        """A request with the id of an earlier one that left private runs: they are no longer only
        their owner's, so hash and index their blocks (still where they are in the LRU list), as
        hashing every block would have done when they filled; from now on `req` hashes all of its."""
        req.hash_all = True
        for key in self._runs_of[req.rid]:
            if key in self._hashed_runs:
                continue
            self._hashed_runs.add(key)
            rid, segments, adapter, first, released_s = self._run_owner[key]
            run = self.cached_free.od[key]
            streams = segments + (((OUTPUT_STREAM, rid), 0, 1 << 62),)  # as request_streams
            seed = 0 if adapter is None else adapter + 1                 # as _adapter_seed
            hashes = chain_hashes(streams, self.block_tokens, first + len(run), [], seed=seed)
            for depth, bid in enumerate(run, start=first):
                self._in_run[bid] = key
                h = hashes[depth]
                if h in self.index:  # cannot happen: a lazily handled request met no block of its own id
                    continue
                blk = self.blocks[bid]
                blk.content_hash, blk.depth, blk.cached_since_s = h, depth, released_s
                blk.last_used_s = released_s
                self.index[h] = bid

    def _take_from_run(self, bid: int) -> None:
        """A prefix hit on a block of a hashed run: out of the run, which keeps its place."""
        key = self._in_run.pop(bid)
        run = self.cached_free.od[key]
        run.remove(bid)
        self.cached_free.count -= 1
        if not run:
            del self.cached_free.od[key]
            self._drop_run(key)

    def _drop_run(self, key: int) -> None:
        """Forget an emptied run."""
        rid = self._run_owner.pop(key)[0]
        keys = self._runs_of[rid]
        keys.remove(key)
        if not keys:
            del self._runs_of[rid]
        self._hashed_runs.discard(key)

    def register(self, req: Request, tokens: int, now_s: float = 0.0, own_reuse: bool = False) -> None:
        """Index the full blocks among `req`'s first `tokens` tokens (their KV is computed).

        With `prefix_index` all, every full block is cached (vLLM); its private ones (past
        `req.shareable_tokens`, which only this request could match) are hashed lazily, see the
        module docstring. With foresight, only blocks another request could match are indexed; a
        private block goes straight back to the free list when released. Before a recompute
        preemption (`own_reuse`) every full block is indexed either way: the request itself will
        match them when it comes back.
        """
        if not self.prefix_caching:
            return
        full = min(tokens // self.block_tokens, len(req.block_table))
        upto = full
        if not own_reuse and req.shareable_tokens is not None and self.prefix_index == "foresight":
            upto = min(upto, req.shareable_tokens // self.block_tokens)
        elif self._lazy:
            if own_reuse:
                req.hash_all = True  # it will come back to its own blocks: hash everything from now on
            elif self._runs_of and req.rid in self._runs_of:
                self._hash_runs(req)
            if req.shareable_tokens is not None and not (req.hash_all or req.tail_shared or req.attempt > 1):
                upto = min(upto, req.shareable_tokens // self.block_tokens)
                if full > req.full_blocks:
                    req.full_blocks = full
        if upto > req.indexed_blocks:
            self._index(req, upto, now_s)

    def _index(self, req: Request, full: int, now_s: float) -> None:
        """Hash and index `req`'s blocks from `req.indexed_blocks` up to `full` (a duplicate of
        content already indexed is kept aside, to take over if that block is evicted)."""
        hashes = chain_hashes(request_streams(req), self.block_tokens, full, req.block_hashes, seed=_adapter_seed(req))
        explicit = req.tail_shared  # otherwise each block indexed here was private: its reference is req's
        for b in range(req.indexed_blocks, full):
            blk = self.blocks[req.block_table[b]]
            if blk.content_hash is not None or blk.dup_of is not None:
                continue
            if not explicit:
                blk.ref_count = 1
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

    def share_tail(self, req: Request) -> None:
        """Branches forked from `req` are about to hold blocks past its indexed prefix: from now on
        the references of all its blocks are counted explicitly (its private ones hold 1 each)."""
        if req.tail_shared:
            return
        req.tail_shared = True
        blocks = self.blocks
        for bid in req.block_table[req.indexed_blocks:]:
            blk = blocks[bid]
            if blk.content_hash is None and blk.dup_of is None:
                blk.ref_count = 1

    def free(self, req: Request, now_s: float = 0.0) -> None:
        """Drop `req`'s references, tail first (so LRU evicts tails before the prefixes they extend)."""
        blocks, fl, cf, table = self.blocks, self.free_list, self.cached_free, req.block_table
        released = 0
        k = req.indexed_blocks
        f = min(req.full_blocks, len(table))
        if f > k and req.tail_shared:  # shared past its indexed prefix: no shortcut, hash them now
            self._index(req, f, now_s)
            k = f
        if not req.tail_shared and k < len(table):
            # fast path: blocks past the indexed prefix were handed out fresh to this request alone
            # (no content hash, one reference): the unfilled tail straight back to the free list,
            # tail first; full private blocks (prefix_index all) to the LRU list as one run
            if f < len(table):  # private: their ref_count is 0 already
                tail = table[max(f, k):]
                tail.reverse()
                fl.extend(tail)
            if f > k:  # (a run's blocks were all last used now: said once, in _run_owner)
                key = cf.add_run(table[k:f])
                self._run_owner[key] = (req.rid, req.segments, req.adapter, k, now_s)
                self._runs_of.setdefault(req.rid, []).append(key)
            released = len(table) - k
            table = table[:k]
        od = cf.od
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
                od[bid] = None
                cf.count += 1
        self.used_blocks -= released
        req.block_table = []
        req.indexed_blocks = req.full_blocks = 0

    # ---- host tier (swap) ---------------------------------------------------------------------
    def can_swap_out(self, req: Request) -> bool:
        """Whether the host tier has room for all of `req`'s blocks."""
        return self.host_used_blocks + len(req.block_table) <= self.host_capacity_blocks

    def swap_out(self, req: Request, now_s: float) -> float:
        """Copy `req`'s blocks to host memory and release them on the GPU. Returns bytes moved."""
        n = len(req.block_table)
        self.host_used_blocks += n
        req.swapped_blocks = n
        if self._lazy:
            req.hash_all = True  # a swapped request meets its own cached blocks again: hash them all
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
            self.cached_free.add(bid)
            added += 1
        return added
