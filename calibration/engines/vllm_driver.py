"""Replay a request list through a real, in-process vLLM V1 engine and record what it did.

Runs in the ENGINE's interpreter (a separate venv with vLLM installed), never imported by capsim:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 /work/venvs/vllm/bin/python vllm_driver.py SPEC.json OUT_DIR

It uses only the standard library and vLLM. SPEC.json (written by calibration/engines/vllm_replay.py):

    {"format": "capsim-vllm-replay/1",
     "hf_config": {...},               # config.json of the model (random weights: load_format dummy)
     "engine": {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
                "block_size", "kv_cache_memory_bytes", "max_model_len", "dtype", "seed",
                "long_prefill_token_threshold"},
     "clock": "wall" | "thread",       # thread: a virtual clock advanced by this thread's CPU time
     "warmup": 2,                      # untimed warm-up requests before the replay
     "requests": [{"id": 0, "arrival_s": 0.0, "prompt_token_ids": [...], "output_tokens": 16}, ...]}

Arrivals are released at their times (relative to the replay's start) between engine steps; one
`LLMEngine.step()` of the in-process engine is one scheduler iteration (schedule, forward, update).
What each iteration scheduled is read from vLLM's own SchedulerOutput (num_scheduled_tokens per
request; num_computed_tokens of new and cached requests; resumed requests), captured by wrapping
the scheduler's `schedule` method; preemptions by wrapping `_preempt_request`.

OUT_DIR gets, written as the replay goes (so a crash leaves the measured part):
    iterations.jsonl  one line per iteration: iteration, start_s, duration_s, cpu_s, wake_s,
                      items [[id, tokens, computed_before], ...] in vLLM's order, new, resumed, preempted
    requests.jsonl    one line per finished request: id, arrival_s, released_s, token_times [...],
                      prompt_tokens, cached_tokens, preemptions, and vLLM's own RequestOutput.metrics
                      (queued/scheduled/first/last token timestamps, relative to the replay's start
                      on the monotonic clock; meaningful with clock wall)
    meta.json         versions, KV blocks, timings, and status: complete | crashed (with the error)
Exit status: 0 complete, 3 the engine failed to start, 4 the engine failed during the replay.
"""

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

FORMAT = "capsim-vllm-replay/1"


class Clock:
    """now() in seconds since start(); wall: time.monotonic; thread: this thread's CPU time, jumping
    over idle waits (other processes' use of the core is left out)."""

    def __init__(self, kind):
        if kind not in ("wall", "thread"):
            raise ValueError(f"clock {kind!r}: expected wall or thread")
        self.kind = kind
        self.read = time.thread_time if kind == "thread" else time.monotonic
        self.base = 0.0
        self.t0 = self.read()

    def start(self):
        """Restart the clock at 0."""
        self.base, self.t0 = 0.0, self.read()

    def now(self):
        """Seconds since start()."""
        return self.base + self.read() - self.t0

    def wait_until(self, t):
        """Sleep (wall) or jump (thread) to time t."""
        if self.kind == "thread":
            self.base += max(0.0, t - self.now())
            return
        while True:
            left = t - self.now()
            if left <= 0:
                return
            time.sleep(left - 0.001 if left > 0.002 else 0)


def build_engine(spec, model_dir):
    """An in-process LLMEngine with the spec's settings and dummy weights from model_dir/config.json."""
    from vllm import EngineArgs, LLMEngine
    e = spec["engine"]
    kw = dict(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype=e.get("dtype", "bfloat16"),
              max_num_seqs=int(e["max_num_seqs"]), max_num_batched_tokens=int(e["max_num_batched_tokens"]),
              enable_chunked_prefill=bool(e["enable_chunked_prefill"]),
              enable_prefix_caching=bool(e["enable_prefix_caching"]), block_size=int(e["block_size"]),
              kv_cache_memory_bytes=int(e["kv_cache_memory_bytes"]), max_model_len=int(e["max_model_len"]),
              enforce_eager=True, seed=int(e.get("seed", 0)), disable_log_stats=False)
    if e.get("long_prefill_token_threshold"):
        kw["long_prefill_token_threshold"] = int(e["long_prefill_token_threshold"])
    return LLMEngine.from_engine_args(EngineArgs(**kw))


def _rid(req_id):
    """Our integer id from vLLM's request id ('17' or '17-<suffix>')."""
    return int(str(req_id).split("-")[0])


class Recorder:
    """Wraps the scheduler to capture each iteration's SchedulerOutput and preemptions."""

    def __init__(self, scheduler):
        self.outputs, self.preempted = [], []
        self.scheduler = scheduler
        schedule, preempt = scheduler.schedule, scheduler._preempt_request

        def wrapped_schedule(*a, **kw):
            out = schedule(*a, **kw)
            self.outputs.append(out)
            return out

        def wrapped_preempt(request, *a, **kw):
            self.preempted.append(_rid(request.request_id))
            return preempt(request, *a, **kw)

        scheduler.schedule = wrapped_schedule
        scheduler._preempt_request = wrapped_preempt

    def take(self):
        """The SchedulerOutputs and preempted ids captured since the last call."""
        outs, pre = self.outputs, self.preempted
        self.outputs, self.preempted = [], []
        return outs, pre


def describe(so, prompt_len):
    """(items, new ids, resumed ids) of one SchedulerOutput; items [id, tokens, computed before, prompt
    length] in vLLM's scheduling order."""
    new = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
    c = so.scheduled_cached_reqs
    cached = dict(zip(c.req_ids, c.num_computed_tokens))
    items = [[_rid(rid), int(n), int(new[rid] if rid in new else cached.get(rid, -1)), prompt_len.get(_rid(rid), -1)]
             for rid, n in so.num_scheduled_tokens.items()]
    return items, [_rid(r) for r in new], sorted(_rid(r) for r in c.resumed_req_ids)


def warm_up(engine, n, vocab):
    """n untimed requests through the engine before the replay."""
    from vllm import SamplingParams
    for k in range(n):
        ids = [(7 * k + j) % vocab for j in range(64 + 32 * k)]
        engine.add_request(f"warmup{k}", {"prompt_token_ids": ids},
                           SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False))
    while engine.has_unfinished_requests():
        engine.step()


class Replay:
    """The replay loop: arrivals released at their times, one engine step per iteration, records
    written line by line."""

    def __init__(self, spec, engine, recorder, out):
        self.engine, self.recorder = engine, recorder
        self.reqs = sorted(spec["requests"], key=lambda r: (float(r["arrival_s"]), int(r["id"])))
        self.arrival = {int(r["id"]): float(r["arrival_s"]) for r in self.reqs}
        self.clock = Clock(spec.get("clock", "wall"))
        self.it_file = (out / "iterations.jsonl").open("w")
        self.rq_file = (out / "requests.jsonl").open("w")
        self.token_times, self.released = {}, {}
        self.prompt_len = {int(r["id"]): len(r["prompt_token_ids"]) for r in self.reqs}
        self.done = self.index = 0
        self.t0_mono = time.monotonic()

    def release(self, nxt, tau):
        """Add the requests arriving up to tau; returns the index of the next one."""
        from vllm import SamplingParams
        while nxt < len(self.reqs) and float(self.reqs[nxt]["arrival_s"]) <= tau:
            r = self.reqs[nxt]
            self.engine.add_request(str(r["id"]), {"prompt_token_ids": list(r["prompt_token_ids"])},
                                    SamplingParams(max_tokens=int(r["output_tokens"]), ignore_eos=True,
                                                   detokenize=False))
            self.released[int(r["id"])] = self.clock.now()
            nxt += 1
        return nxt

    def log_iterations(self, tau, end, cpu, wake):
        """Write the iteration(s) of the step that ran from tau to end."""
        sos, pre = self.recorder.take()
        pool = self.engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
        for so in sos:
            if so.total_num_scheduled_tokens == 0:
                continue
            items, new, resumed = describe(so, self.prompt_len)
            row = {"iteration": self.index, "start_s": tau, "duration_s": end - tau, "cpu_s": cpu, "wake_s": wake,
                   "items": items, "new": new, "resumed": resumed, "preempted": pre,
                   "kv_free_blocks": pool.get_num_free_blocks()}
            self.it_file.write(json.dumps(row) + "\n")
            self.index += 1
            pre = []
        self.it_file.flush()

    def on_outputs(self, outs, end):
        """Token times of the step's outputs; a finished request's record."""
        for o in outs:
            rid = _rid(o.request_id)
            times = self.token_times.setdefault(rid, [])
            times.extend([end] * (len(o.outputs[0].token_ids) - len(times)))
            if not o.finished:
                continue
            m = o.metrics

            def rel(name):
                v = getattr(m, name, 0) if m is not None else 0
                return v - self.t0_mono if v else None
            self.rq_file.write(json.dumps({
                "id": rid, "arrival_s": self.arrival[rid], "released_s": self.released.get(rid),
                "token_times": times, "prompt_tokens": len(o.prompt_token_ids or []),
                "cached_tokens": o.num_cached_tokens,
                "preemptions": getattr(m, "num_preemptions", None) if m is not None else None,
                "vllm_queued_s": rel("queued_ts"), "vllm_scheduled_s": rel("scheduled_ts"),
                "vllm_first_token_s": rel("first_token_ts"), "vllm_last_token_s": rel("last_token_ts")}) + "\n")
            self.rq_file.flush()
            self.done += 1

    def run(self, meta):
        """Replay every request; meta gets the counts (also when the engine fails)."""
        n, nxt, wake, tau = len(self.reqs), 0, 0.0, 0.0   # tau: when the next iteration is planned
        self.t0_mono = time.monotonic()
        self.clock.start()
        try:
            while self.done < n:
                nxt = self.release(nxt, tau)
                if not self.engine.has_unfinished_requests():
                    if nxt >= n:
                        break
                    tau = float(self.reqs[nxt]["arrival_s"])
                    self.clock.wait_until(tau)
                    wake = max(0.0, self.clock.now() - tau)
                    continue
                c0 = time.thread_time()
                outs = self.engine.step()
                end = self.clock.now()
                self.log_iterations(tau, end, time.thread_time() - c0, wake)
                self.on_outputs(outs, end)
                wake, tau = 0.0, end
                if self.index and self.index % 100 == 0:
                    print(f"  iteration {self.index}: t={end:8.2f} s, {self.done}/{n} requests done",
                          file=sys.stderr, flush=True)
        finally:
            meta.update(iterations=self.index, finished=self.done, requests=n, replay_s=self.clock.now())
            self.it_file.close()
            self.rq_file.close()


def main(argv):
    """vllm_driver.py SPEC.json OUT_DIR; the exit status says how it ended (module docstring)."""
    if len(argv) != 3:
        print("usage: vllm_driver.py SPEC.json OUT_DIR", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    if spec.get("format") != FORMAT:
        print(f"{argv[1]}: format {spec.get('format')!r}, expected {FORMAT!r}", file=sys.stderr)
        return 2
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "status": "starting", "clock": spec.get("clock", "wall"), "python": sys.version.split()[0]}

    def write_meta():
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    model_dir = Path(tempfile.mkdtemp(prefix="capsim-vllm-model-"))
    (model_dir / "config.json").write_text(json.dumps(spec["hf_config"]))
    t = time.monotonic()
    try:
        import torch
        import vllm
        meta.update(vllm=vllm.__version__, torch=torch.__version__)
        engine = build_engine(spec, model_dir)
        scheduler = engine.engine_core.engine_core.scheduler
        warm_up(engine, int(spec.get("warmup", 2)), int(spec["hf_config"]["vocab_size"]))
        scheduler.kv_cache_manager.reset_prefix_cache()
        meta.update(num_gpu_blocks=scheduler.kv_cache_manager.block_pool.num_gpu_blocks,
                    block_size=scheduler.block_size, torch_threads=torch.get_num_threads(),
                    engine_start_s=time.monotonic() - t)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        meta.update(status="failed to start", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        write_meta()
        print(f"vLLM engine failed to start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    recorder = Recorder(scheduler)
    meta["status"] = "running"
    write_meta()
    try:
        Replay(spec, engine, recorder, out).run(meta)
    except Exception as exc:  # noqa: BLE001 - the measured part stays written
        meta.update(status="crashed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        write_meta()
        print(f"vLLM engine failed during the replay: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 4
    meta["status"] = "complete"
    write_meta()
    return 0


if __name__ == "__main__":
    # run as a script: its folder (capsim's calibration/engines) must not shadow the real packages
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.exit(main(sys.argv))
