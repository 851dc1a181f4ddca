"""Real replay: the simulator's own engine loop and scheduler drive the reference model on a device.

The same objects as a `capsim run` replica, assembled by sim.api's Simulation and run by the same
engine loop (sim.core.engine.replica_loop); only the step executor differs: instead of asking a
step-time model, :class:`ReplayExecutor` runs each plan for real on calibration.model.ReferenceModel
(one attention group per request: `count=1, new=n, cached=h`, against that request's own K/V views; on
CUDA the single-token decodes of an iteration share one attention call per layer over the K/V slabs,
calibration.model.DecodeRows), times it, and the loop commits it at its measured end.

- arrivals are released at their scheduled times by the simulation's own arrival process; the
  executor lines its clock up with the loop's instants (sleeping through idle time on the wall clock);
- every request is an explicit plan item (`lazy_decode=False`);
- requests.csv / iterations.csv / summary.json come from the simulator's own table builder, so they
  have `capsim run`'s format exactly.

Because the replay is the simulator's loop with measured durations, the simulator given each
iteration's measured duration makes the same plans (checked by tests/calibration/test_replay.py and by
`capsim validate`): while busy, iteration k+1 is planned with the arrivals up to the end of iteration k,
and its recorded start is that end (the host work in between -- commit, bookkeeping, planning,
building the inputs -- counts in iteration k+1's duration, as it does in a serving engine's iteration
time); when idle, the loop wakes at the next scheduled arrival, and the iteration it starts is recorded
from that arrival (so a late wake-up, the *arrival jitter*, counts in that iteration's duration).

Clocks: `wall` (time.perf_counter; CUDA/MPS synchronised before every reading) is what a client
sees. `thread` (CPU, one torch thread) advances a virtual clock by the CPU time of the thread that
does all the work -- scheduling, inputs and the forward -- and jumps over idle periods; it leaves
out the time other processes hold the core, like `capsim calibrate --clock thread`.

Speculative decoding with an n-gram (prompt lookup) draft source runs for real: drafts are looked
up in the request's own tokens, verified in one pass that computes every position's greedy token,
and the accepted prefix is what the scheduler commits (its acceptance model is replaced by what
happened). Other draft sources need a second model on the device and are refused.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from calibration.model import ATTENTION, DTYPES, DecodeRows, KVCache, ReferenceModel
from calibration.replay_slots import KVSlots
from calibration.shapes import Group, Shape
from calibration.timing import check_device, device_name, synchronize
from sim.api import NgramDraft, Result, Scenario, Simulation, Speculator, Status

CLOCKS = ("wall", "thread")

# Plan fields the step-time models read (sim.models.step_time); copied per iteration so that a step-time model can be
# evaluated on the replay's plans afterwards.
PLAN_FIELDS = ("num_seqs", "new_tokens", "pairs", "prefill_tokens", "prefill_pairs", "prefill_logits", "prefill_seqs",
               "decode_seqs", "decode_kv_tokens", "kv_tokens_read", "max_context", "lazy_decodes",
               "decode_positions", "decode_pairs", "decode_logits", "draft_s", "draft_overlapped", "swap_bytes")

# replay_iterations.csv: per iteration, its recorded start and duration (the clock's), the host time in
# it (everything but the forward pass: the previous commit, arrivals, planning, building inputs, a late
# wake-up), the forward pass on the clock and on both wall and thread-CPU time (their ratio is the share
# of a core the replay got), the wake-up lateness when it started an idle engine, its kind and plan
# features, and its speculative rounds.
DETAIL_COLUMNS = ("iteration", "start_s", "duration_s", "host_s", "forward_s", "forward_wall_s", "forward_cpu_s",
                  "wake_s", "kind", "items",
                  "num_seqs", "new_tokens", "pairs", "kv_tokens_read", "decode_seqs", "decode_kv_tokens",
                  "prefill_seqs", "prefill_tokens", "prefill_pairs", "max_context", "spec_rounds", "spec_drafts",
                  "spec_accepted")


@dataclass
class ReplayConfig:
    """How to replay: device, dtype, threads, clock, reference-model seed, warm-up, n-gram draft settings."""
    device: str = "cpu"
    dtype: str = "fp32"                 # weights, activations and KV of the reference model
    threads: int | None = None          # torch CPU threads (None: leave torch's choice)
    clock: str = "wall"                 # wall | thread (see the module docstring)
    seed: int = 0                       # weights of the reference model (token ids derive from the workload)
    warmup: int = 2                     # untimed forward passes before the clock starts
    ngram_min: int = 1                  # n-gram draft source: shortest suffix looked up
    ngram_max: int = 4                  # ... and longest (vLLM's prompt_lookup_min / _max)
    attention: str = "torch"            # SDPA kernels (calibration.model.ATTENTION): the profile's calibration's
    batched_decode: bool | None = None  # decode tokens in one attention call per layer (None: on CUDA only)
    stream: object = None               # progress lines (default: none)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock {self.clock!r}: expected one of {', '.join(CLOCKS)}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention {self.attention!r}: expected one of {', '.join(ATTENTION)}")


@dataclass
class ReplayRun:
    """What a replay produced: the tables (capsim run's format), per-iteration timing detail, the plans."""

    result: Result
    detail: pd.DataFrame
    plans: list                          # per iteration: a StepPlan look-alike (PLAN_FIELDS, items, spec_items)
    meta: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)   # rid -> generated token ids
    spec_log: dict | None = None                 # speculation: per request, drafts offered and accepted, in order

    def write(self, out_dir: str | Path) -> None:
        """Write the tables (capsim run's format) and replay_iterations.csv into `out_dir`."""
        out = Path(out_dir)
        self.result.write(out)
        self.detail.to_csv(out / "replay_iterations.csv", index=False)


# ---------------------------------------------------------------------------------------------
# What the replay supports


def check_replayable(scenario: Scenario) -> None:
    """Raise ValueError naming every scenario feature the real replay cannot reproduce."""
    sc, bad = scenario, []
    if sc.cluster.replicas != 1 or sc.cluster.faults:
        bad.append("cluster: the replay runs one replica without faults")
    if sc.kv.preemption == "swap":
        bad.append("kv.preemption swap: host-memory swapping is not implemented in the replay (use recompute)")
    if sc.lora is not None:
        bad.append("lora: the reference model has no adapters")
    if sc.offload is not None:
        bad.append("offload: the reference model keeps every layer on the device")
    if sc.accuracy.p_correct < 1:
        bad.append("accuracy.p_correct < 1: retries of wrong answers are not replayed")
    if sc.kv.conversion_s_per_token:
        bad.append("kv.conversion_s_per_token: the reference model does not dequantise KV")
    spec = getattr(sc.scheduler, "speculative", None)
    if spec is not None and not isinstance(spec.draft, NgramDraft):
        bad.append(f"scheduler.speculative.draft.kind {spec.draft.kind}: needs a draft model on the device; "
                   "the replay runs the n-gram (prompt lookup) source only")
    if bad:
        raise ValueError("the real replay cannot run this scenario: " + "; ".join(bad))


def _check_workload(wl) -> None:
    if wl.leader is not None and (wl.leader >= 0).any():
        raise ValueError("the real replay cannot run this scenario: workload: parallel sampling (n > 1) "
                         "is not replayed")
    if np.isfinite(wl.cancel_at_s).any():
        raise ValueError("the real replay cannot run this scenario: workload: cancellations are not replayed")
    if wl.adapter is not None and (wl.adapter >= 0).any():
        raise ValueError("the real replay cannot run this scenario: workload: LoRA adapters are not replayed")


# ---------------------------------------------------------------------------------------------
# Token ids: a deterministic id per (stream, position), so shared prefixes share their tokens


_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def stream_token_ids(stream: tuple[int, int], first: int, length: int, vocab: int) -> np.ndarray:
    """Token ids of positions first..first+length of a token stream (splitmix64 of stream and position)."""
    a, b = (int(x) & 0xFFFFFFFFFFFFFFFF for x in stream)
    with np.errstate(over="ignore"):
        h = (np.uint64(a) * _M1) ^ (np.uint64(b) * _M2)
        x = h + np.arange(first, first + length, dtype=np.uint64) * _M3
        x ^= x >> np.uint64(30)
        x *= _M2
        x ^= x >> np.uint64(27)
        x *= _M3
        x ^= x >> np.uint64(31)
    return (x % np.uint64(vocab)).astype(np.int64)


def prompt_token_ids(segments: tuple, vocab: int, outputs: dict[int, list[int]]) -> list[int]:
    """A prompt's ids from its segments; a segment of another request's outputs (a later turn of a
    conversation) takes that request's generated tokens when it has them."""
    ids: list[int] = []
    for stream, first, length in segments:
        if stream[0] == 3 and stream[1] in outputs:
            got = outputs[stream[1]][first:first + length]
            ids.extend(got)
            if len(got) < length:
                ids.extend(stream_token_ids(stream, first + len(got), length - len(got), vocab).tolist())
        else:
            ids.extend(stream_token_ids(stream, first, length, vocab).tolist())
    return ids


def ngram_propose(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup (as transformers' prompt_lookup_num_tokens): the (up to) k tokens that followed the
    first earlier occurrence of the longest suffix n-gram (n_max down to n_min) of `tokens`; [] when
    there is none."""
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = tokens[L - n:]
        for start in range(0, L - n):
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []


# ---------------------------------------------------------------------------------------------
# The n-gram speculator: drafts from the request's tokens, acceptance from the verify pass


class ReplaySpeculator(Speculator):
    """Speculator whose drafts are real n-gram lookups and whose accepted counts are the verify pass's."""

    def __init__(self, cfg, rng, tokens: dict[int, list[int]], n_min: int, n_max: int):
        super().__init__(cfg, rng)
        self.tokens, self.n_min, self.n_max = tokens, n_min, n_max
        self.proposals: dict[int, list[int]] = {}
        self.measured: dict[int, int] = {}
        self.index_pending = False
        # per request, in order: drafts offered at each planning, accepted at each verified round
        self.log: dict[str, dict[int, list[int]]] = {"drafts": {}, "accepted": {}}

    def drafts_for(self, req) -> int:
        """Look up n-gram drafts in the request's own tokens; how many were found."""
        k = max(0, min(self.cfg.num_draft_tokens, req.max_output_tokens - req.output_tokens - 1))
        prop = ngram_propose(self.tokens[req.rid], k, self.n_min, self.n_max) if k else []
        self.proposals[req.rid] = prop
        self.log["drafts"].setdefault(req.rid, []).append(len(prop))
        return len(prop)

    def draft_s(self, drafts: list[int], include_index: bool = True) -> float:
        """Zero: the lookup ran for real inside the measured iteration."""
        return 0.0   # the lookup ran for real, inside the measured iteration

    def sample(self, reqs: list, drafts: list[int]) -> np.ndarray:
        """The accepted counts the verify pass measured, logged per request."""
        accepted = np.array([self.measured[r.rid] for r in reqs], dtype=np.int64)
        for r, a in zip(reqs, accepted.tolist()):
            self.log["accepted"].setdefault(r.rid, []).append(a)
        return self.count(accepted, drafts)


# ---------------------------------------------------------------------------------------------
# Clocks


class _Clock:
    """now() in seconds since the start of the replay; wait_until(t) sleeps (wall) or jumps (thread)."""

    def __init__(self, kind: str, device: str):
        self.kind, self.device = kind, device
        if kind == "thread" and (device != "cpu" or torch.get_num_threads() != 1):
            raise ValueError("clock thread times one thread's CPU time: it needs device cpu and threads 1")
        self._read = time.thread_time if kind == "thread" else time.perf_counter
        self._base = 0.0
        self._t0 = self._read()

    def now(self) -> float:
        return self._base + (self._read() - self._t0)

    def wait_until(self, t: float) -> None:
        if self.kind == "thread":
            now = self.now()
            if t > now:
                self._base += t - now
            return
        while True:
            left = t - self.now()
            if left <= 0:
                return
            if left > 0.002:
                time.sleep(left - 0.001)


# ---------------------------------------------------------------------------------------------
# The replay


def _plan_copy(plan, kinds: dict[int, bool]) -> SimpleNamespace:
    """A StepPlan look-alike frozen at plan time (requests mutate afterwards)."""
    snap = SimpleNamespace(**{f: getattr(plan, f) for f in PLAN_FIELDS})
    snap.items = [(SimpleNamespace(rid=req.rid, in_prefill=kinds[req.rid]), n, h) for req, n, h in plan.items]
    snap.spec_items = [(SimpleNamespace(rid=req.rid), k) for req, k in plan.spec_items]
    snap.adapters = set()
    return snap


def _kind(plan) -> str:
    if plan.prefill_seqs and plan.decode_seqs:
        return "mixed"
    return "prefill" if plan.prefill_seqs else "decode"


class Replayer:
    """Holds the reference model (built once) and replays scenarios on it."""

    def __init__(self, model_profile, cfg: ReplayConfig):
        check_device(cfg.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.device == "cpu":
            torch.set_flush_denormal(True)
        self.cfg = cfg
        self.profile = model_profile
        self.model = ReferenceModel(model_profile, cfg.dtype, cfg.device, seed=cfg.seed, attention=cfg.attention)
        # one attention call for a decode batch of different lengths: per-request calls are most of a GPU step
        # (docs/validation.md, "On an H200"); on a CPU the per-request path stays, as validated
        self.batched_decode = cfg.device == "cuda" if cfg.batched_decode is None else cfg.batched_decode
        self.model.eval()

    def _log(self, text: str) -> None:
        if self.cfg.stream is not None:
            print(text, file=self.cfg.stream, flush=True)

    def _warmup(self, slots: KVSlots) -> None:
        """Untimed passes through the code paths the replay takes (prefill after a prefix, batched decode)."""
        m = self.model
        n = max(1, min(16, slots.capacity // 2))
        with torch.inference_mode():
            for _ in range(self.cfg.warmup):
                for groups in (((1, n, 0),), ((1, n, n),), ((1, 1, n), (1, 1, max(n - 1, 1)))):
                    shape = Shape.of(*groups)
                    batch = m.prepare(shape)
                    cache = m.new_cache(shape)
                    ids = torch.zeros(batch.tokens, dtype=torch.long, device=m.device)
                    m(ids, batch, cache).tolist()
                if self.batched_decode and slots.slabs is not None and slots.slabs[0][0].shape[0] >= 2:
                    self._warm_batched(slots, n)
        synchronize(self.cfg.device)

    def _warm_batched(self, slots: KVSlots, n: int) -> None:
        """An untimed batched decode step over slab rows 0 and 1 (their values are rewritten before use)."""
        m = self.model
        batch = m.prepare(Shape.of((1, 1, n), (1, 1, max(n - 1, 1))))
        batch.decode = _decode_rows([(0, 0, n), (1, 1, max(n - 1, 1))], {0, 1}, m.device)
        cache = KVCache([[None, None] for _ in range(m.num_layers)], slots.slabs)
        m(torch.zeros(2, dtype=torch.long, device=m.device), batch, cache).tolist()

    def run(self, scenario: Scenario, base_dir: str | Path = ".") -> ReplayRun:
        """Replay `scenario` for real on the reference model and return the measured tables."""
        check_replayable(scenario)
        cfg, model = self.cfg, self.model
        with torch.inference_mode():
            return self._run(scenario, Path(base_dir), cfg, model)

    def _run(self, sc: Scenario, base_dir: Path, cfg: ReplayConfig, model: ReferenceModel) -> ReplayRun:
        tokens: dict[int, list[int]] = {}     # rid -> prompt + outputs (token ids)
        outputs: dict[int, list[int]] = {}
        made: list[ReplaySpeculator] = []

        def speculator(spec_cfg, rng, *_args):
            made.append(ReplaySpeculator(spec_cfg, rng, tokens, cfg.ngram_min, cfg.ngram_max))
            return made[-1]

        sim = Simulation(sc, base_dir, lazy_decode=False, speculator_factory=speculator)
        if sim.model.name != self.profile.name:
            raise ValueError(f"scenario model {sim.model.name!r} but the reference model is {self.profile.name!r}")
        wl = sim.workload
        _check_workload(wl)
        spec_cfg = getattr(sc.scheduler, "speculative", None)
        lookahead = spec_cfg.num_draft_tokens if spec_cfg is not None else 0
        capacity = int((wl.prompt_tokens + wl.output_tokens).max()) + lookahead + 1
        if capacity > self.profile.max_position_embeddings:
            raise ValueError(f"a request needs {capacity} positions; the model has "
                             f"{self.profile.max_position_embeddings}")
        slots = KVSlots(model, capacity)
        want = min(sc.scheduler.max_num_seqs, len(wl))
        from calibration.timing import available_memory_bytes
        avail = available_memory_bytes(cfg.device)
        if avail is not None and want * slots.bytes_per_slot > 0.8 * avail:
            raise ValueError(f"KV slots for {want} requests of up to {capacity} tokens need "
                             f"{want * slots.bytes_per_slot / 2**30:.2f} GiB; {avail / 2**30:.2f} GiB available")
        slots.reserve(want)
        if cfg.warmup:
            self._warmup(slots)

        load_start = _loadavg()
        self._log(f"replay: {len(wl)} requests, scheduler {sc.scheduler.kind}, clock {cfg.clock}")
        executor = ReplayExecutor(self, slots, tokens, outputs, made, _Clock(cfg.clock, cfg.device), len(wl))
        wall0 = time.perf_counter()
        result = sim.run(executor=executor)
        meta = dict(device=cfg.device, device_name=device_name(cfg.device), dtype=cfg.dtype, clock=cfg.clock,
                    attention=cfg.attention, batched_decode=self.batched_decode,
                    threads=torch.get_num_threads(), torch=torch.__version__, model=self.profile.name,
                    layers=model.num_layers, kv_slots=slots.created, kv_slot_tokens=capacity,
                    loadavg_start=load_start, loadavg_end=_loadavg(), wall_s=time.perf_counter() - wall0)
        result.summary["replay"] = meta
        return ReplayRun(result, pd.DataFrame(executor.detail), executor.plans, meta, outputs,
                         made[0].log if made else None)

    def forward(self, plan, slots: KVSlots, tokens: dict[int, list[int]], speculator, clock: _Clock):
        """Build the inputs of a plan, run the forward pass, return ({rid: tokens emitted}, forward seconds)."""
        model = self.model
        groups, ids, rows, spec_rows = [], [], [], {}
        layer_views: list[list] = [[] for _ in range(model.num_layers)]
        drafts_of = {r.rid: k for r, k in plan.spec_items}
        batched = _batched_items(plan.items, drafts_of, slots) if self.batched_decode else set()
        dec: list[tuple[int, int, int]] = []   # (packed row, slab row, cached) of the batched decode tokens
        off = 0
        for i, (req, n, h) in enumerate(plan.items):
            seq = tokens[req.rid]
            k = drafts_of.get(req.rid, 0)
            if i in batched:
                ids.append(seq[h])
                rows.append(off)
                groups.append(Group(1, 1, h))
                dec.append((off, slots.row_of(req.rid), h))
                for layer in layer_views:
                    layer.append(None)
                off += 1
                continue
            if k:
                prop = speculator.proposals[req.rid][:k]
                ids.extend([seq[h]] + prop)
                spec_rows[req.rid] = (len(rows), prop)
                rows.extend(range(off, off + n))
            else:
                ids.extend(seq[h:h + n])
                rows.append(off + n - 1)
            groups.append(Group(1, n, h))
            for layer, (k_t, v_t) in zip(layer_views, slots.of(req.rid)):
                layer.append((k_t[:, :, :h + n], v_t[:, :, :h + n]))
            off += n
        batch = model.prepare(Shape(tuple(groups)))
        if spec_rows:
            batch.logit_rows = torch.tensor(rows, device=model.device)
        if dec:
            batch.decode = _decode_rows(dec, batched, model.device)
        ids_t = torch.tensor(ids, dtype=torch.long, device=model.device)
        cache = KVCache(layer_views, slots.slabs if dec else None)
        t0, w0, c0 = clock.now(), time.perf_counter(), time.thread_time()
        out = model(ids_t, batch, cache)
        synchronize(self.cfg.device)
        got = out.tolist()
        fwd = clock.now() - t0
        self.last_wall, self.last_cpu = time.perf_counter() - w0, time.thread_time() - c0
        emit: dict[int, list[int]] = {}
        pos = 0
        for req, n, h in plan.items:
            if req.rid in spec_rows:
                first, prop = spec_rows[req.rid]
                pred = got[first:first + n]
                a = 0
                while a < len(prop) and prop[a] == pred[a]:
                    a += 1
                speculator.measured[req.rid] = a
                emit[req.rid] = prop[:a] + [pred[a]]
                pos = first + n
            else:
                emit[req.rid] = [got[pos]]
                pos += 1
        return emit, fwd


def _batched_items(items, drafts_of: dict, slots: KVSlots) -> set[int]:
    """The plan items whose one new token joins the batched decode call: single-token, no drafts, a slab
    row (at least two of them; one goes through the per-request path as before)."""
    if slots.slabs is None:
        return set()
    out = {i for i, (req, n, _h) in enumerate(items)
           if n == 1 and not drafts_of.get(req.rid) and slots.row_of(req.rid) is not None}
    return out if len(out) >= 2 else set()


def _decode_rows(dec: list[tuple[int, int, int]], groups: set[int], device) -> DecodeRows:
    """The DecodeRows of (packed row, slab row, cached) triples: each token attends up to its own position."""
    rows, slab_rows, cached = zip(*dec)
    pos = torch.tensor(cached, device=device)
    length = max(cached) + 1
    mask = torch.arange(length, device=device).unsqueeze(0) <= pos.unsqueeze(1)
    return DecodeRows(rows=torch.tensor(rows, device=device), slots=torch.tensor(slab_rows, device=device),
                      positions=pos, mask=mask.view(len(dec), 1, 1, length), groups=frozenset(groups))


class ReplayExecutor:
    """The engine loop's step executor for a real replay: each plan runs on the reference model and
    takes the time it took on the replay's clock (sim.core.engine.StepExecutor).

    The loop wakes at the simulated instant of an event; `begin` lines the clock up with it (sleeps
    until then on the wall clock, jumps the thread clock over idle time), so an iteration's duration
    counts from the end of the previous one (or from the arrival that woke an idle engine) to the end
    of its forward pass: the host work in between is part of it, as in a serving engine.
    """

    def __init__(self, replayer: "Replayer", slots: KVSlots, tokens: dict, outputs: dict, speculators: list,
                 clock: "_Clock", total: int):
        self.replayer, self.slots, self.tokens, self.outputs = replayer, slots, tokens, outputs
        self.speculators, self.clock, self.total = speculators, clock, total
        self.vocab = replayer.profile.vocab_size
        self.detail: dict[str, list] = {c: [] for c in DETAIL_COLUMNS}
        self.plans: list = []
        self.index = 0
        self.done = 0
        self._idle_from = 0.0     # simulated end of the last iteration: a later wake-up was idle
        self._wake = 0.0
        self._emit: dict[int, list[int]] = {}

    def begin(self, now_s: float) -> None:
        """Line the clock up with the loop's instant; a wake-up after idle time records its lateness."""
        if now_s > self._idle_from:
            self.clock.wait_until(now_s)
            self._wake = max(0.0, self.clock.now() - now_s)
            self._idle_from = now_s

    def execute(self, plan, start_s: float) -> float:
        """Run `plan` for real; its duration is the clock's time from `start_s` to the forward's end."""
        for req, _n, _h in plan.items:
            if req.rid not in self.tokens:   # first scheduled: its prompt's ids (earlier turns' outputs included)
                self.tokens[req.rid] = prompt_token_ids(req.segments, self.vocab, self.outputs)
        kinds = {req.rid: req.in_prefill for req, _n, _h in plan.items}  # counters move only at commit
        snap = _plan_copy(plan, kinds)
        speculator = self.speculators[0] if self.speculators else None
        self._emit, fwd_s = self.replayer.forward(plan, self.slots, self.tokens, speculator, self.clock)
        end = self.clock.now()
        self.plans.append(snap)
        spec = [(r.rid, k) for r, k in plan.spec_items]
        row = dict(iteration=self.index, start_s=start_s, duration_s=end - start_s, host_s=end - start_s - fwd_s,
                   forward_s=fwd_s, forward_wall_s=self.replayer.last_wall, forward_cpu_s=self.replayer.last_cpu,
                   wake_s=self._wake, kind=_kind(plan), items=len(plan.items),
                   spec_rounds=len(spec), spec_drafts=sum(k for _, k in spec),
                   spec_accepted=sum(speculator.measured[rid] for rid, _ in spec) if spec else 0)
        row.update({c: getattr(plan, c) for c in DETAIL_COLUMNS if c not in row})
        for c in DETAIL_COLUMNS:
            self.detail[c].append(row[c])
        self._wake = 0.0
        self._idle_from = end
        if self.replayer.cfg.stream is not None and self.index % 50 == 0:
            self.replayer._log(f"  iteration {self.index}: t={end:8.2f} s, {self.done}/{self.total} requests done")
        self.index += 1
        return end - start_s

    def committed(self, plan, outcome, now_s: float) -> None:
        """Append the emitted token ids; free the KV slots of finished requests."""
        for req in outcome.emitted:
            new = self._emit[req.rid]
            self.tokens[req.rid].extend(new)
            self.outputs.setdefault(req.rid, []).extend(new)
        for req in outcome.finished_decodes + outcome.emitted:
            if req.status is Status.FINISHED:
                self.slots.release(req.rid)
                self.done += 1


def _loadavg() -> str | None:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return None


def replay(scenario: Scenario, base_dir: str | Path = ".", cfg: ReplayConfig | None = None,
           model_profile=None) -> ReplayRun:
    """Replay `scenario` for real on cfg.device (the scenario's model unless `model_profile` is given)."""
    cfg = cfg or ReplayConfig()
    if model_profile is None:
        from sim.api import load_model
        base = Path(base_dir)
        model_profile = load_model(scenario.model) if not scenario.model.endswith(".yaml") else \
            load_model(base / scenario.model)
    return Replayer(model_profile, cfg).run(scenario, base_dir)


__all__ = ["ReplayConfig", "ReplayRun", "Replayer", "replay", "check_replayable", "ngram_propose",
           "stream_token_ids", "prompt_token_ids", "PLAN_FIELDS"]
