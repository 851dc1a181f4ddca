"""The serving engines' default scheduler and memory settings, as capsim scenario pieces.

Published rows do not say how each engine was configured, so a replay assumes the defaults of the
engine versions in the file and says which. Nothing here is fitted to the published rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sim.io.errors import ConfigError
from sim.published.rows import PublishedRow

GIB = 1 << 30

# vLLM's CUDA-graph capture sizes (V1, max_cudagraph_capture_size 512): 1, 2, 4, 8..256 by 8, 272..512 by 16
VLLM_GRAPH_SIZES = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))


@dataclass(frozen=True)
class EngineDefaults:
    """How one engine schedules and sizes its KV cache when nothing is set on its command line."""

    backend: str
    versions: str
    scheduler: dict
    """The capsim `scheduler` mapping."""
    kv_admission: str
    """capsim kv.admission: on_demand (allocate as tokens arrive, preempt by recompute) or reserve."""
    memory_rule: str
    """`card`: KV = fraction x card memory - weights - reserve (vLLM, SGLang);
    `free`: KV = fraction x (card memory - weights - reserve) (TensorRT-LLM)."""
    memory_fraction: float
    graph_sizes: list[int] | None
    notes: tuple[str, ...] = field(default=())
    later_waves: str = "spread"
    """After a benchmark's cold first wave (every user at once), `spread`: the engine breaks the cohort up and
    the later waves see the closed loop's steady state; `cohort`: the users keep coming back together and
    are served together, so every wave repeats the first (sim.published.predict.combine_cold). A row whose launch's
    receive interval is replayed spreads them whatever this says (sim.published.launches.later_waves)."""
    moe: tuple[str, str] = ("composed", "balanced")
    """MoE layers' routed experts: (step_time.model.moe_kernels, moe_routing). Chosen per engine on the even
    lines of the silicon sample among its own measured fused-MoE kernels under balanced or power-law routing
    and the composition from GEMMs, by median |TPOT error|; reported on the odd lines
    (benchmarks/moe_routing_held_out.py, docs/fidelity.md)."""

    mla_kernels: str = "composed"
    """MLA models' attention kernels (step_time.model.mla_kernels): `composed` from the card's GQA tables, or an
    engine's measured MLA kernels (sglang, trtllm; profiles/ops/<card>/mla_*, benchmarks/aiconfigurator_mla.py).
    Chosen per engine on its even lines, agg and disaggregated together, by median |TPOT error| (a tie keeping
    `composed`), held out on the odd lines (docs/fidelity.md, "MLA's measured kernels"): SGLang its own (18.13% ->
    18.12%, TTFT 52.0% -> 50.7%; odd lines TPOT 15.4% -> 14.7%), TensorRT-LLM `composed` (its own: 22.4% -> 25.4%),
    vLLM SGLang's: it has no kernel table of its own, and on Blackwell (every MLA row of vLLM's) its default MLA
    backend, FLASHINFER_MLA, calls the FlashInfer TRT-LLM-gen kernel SGLang's `trtllm_mla` backend calls (5.7% ->
    3.9%, odd lines 6.6% -> 5.3%)."""

    all_reduce: str = "nccl"
    """Whose all-reduce times tensor parallelism (step_time.model.all_reduce): NCCL's, or the engine's own
    measured one (its name). Chosen per engine on the even lines of the silicon sample's agg rows by median
    |TPOT error| (benchmarks/moe_routing_held_out.py, docs/fidelity.md "All-reduce"): SGLang its own (15.0%
    against 21.2%), TensorRT-LLM its own with the host overhead refitted under it (9.4% against 11.0%;
    host_overhead_s below), vLLM its own (8.7% against 12.2% on all 366 even agg rows, since the q / k norm
    kernels are counted, `qk_norm_kernels`; before that NCCL's had won, 8.9% against 11.0%, its excess standing in
    for those kernels on the MiniMax-M2.5 and Qwen3-32B rows)."""

    host_overhead_s: float | None = None
    """Per-iteration host time of the ops model (step_time.model.host_overhead_s); None: the schema's default
    (sim.io.ops_schema.DEFAULT_HOST_OVERHEAD_S, fitted on TensorRT-LLM's Llama-3.1-8B rows under NCCL's
    all-reduce). TensorRT-LLM: the same fit under its own all-reduce
    (`python benchmarks/ops_fidelity.py --all-reduce trtllm`: 0.4654 ms; NCCL's excess on the fit set's TP > 1
    rows had stood in for host time)."""
    sync_host_per_sequence_s: float = 0.0
    """Host time per sequence of every iteration (step_time.model.host_per_sequence_s) on the versions that schedule
    synchronously (before `async_since`): the scheduler builds each iteration's inputs and takes its outputs while the
    GPU waits, so its per-request CPU work adds to every step; from `async_since` on, async scheduling runs it while
    the GPU computes the step before and the replay adds none. vLLM: 60 us, fitted on the even lines of its 93
    expressible rows before 0.14 (Qwen3-32B on H100, vLLM 0.12.0) by median |TPOT error|, 11.1% -> 2.1%; held out on
    the odd lines 11.3% -> 2.4% (`python benchmarks/host_per_sequence_fit.py`, docs/fidelity.md "Synchronous
    scheduling's host time per sequence")."""
    async_since: str | None = None
    """The first release whose launch default is async scheduling (vLLM 0.14: vllm-project/vllm#27614, the last item
    of its async scheduling plan, issue #27679); None: the engine overlaps its host work in every version modelled."""
    shared_experts_overlap: str | int = 256
    """When MoE layers run their shared experts on a second CUDA stream beside the routed ones
    (step_time.model.shared_experts_overlap; only DeepSeek-V3 / R1 and Kimi-K2.5 have shared experts). Read in each
    engine's source, not fitted: vLLM at most 256 tokens a pass (VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD's
    default), TensorRT-LLM in decode-only passes (maybe_execute_in_parallel runs the two streams only under CUDA
    graphs), SGLang `off`. SGLang's DeepSeek path folds the shared expert into the routed kernel as one more expert
    per token (num_fused_shared_experts) unless the experts are spread over GPUs; that reading (`fused`) was set
    against `off` on SGLang's even lines, agg and disaggregated, and lost (TPOT 14.0% -> 14.6%, docs/fidelity.md
    "SGLang's fused shared expert"), so `off` stays."""
    qk_norm_kernels: str = "separate"
    """Qwen3's / MiniMax-M2's q and k RMSNorms (step_time.model.qk_norm_kernels): two kernels of their own in vLLM and
    SGLang (q_norm, k_norm), fused with RoPE in TensorRT-LLM (fused_qk_norm_rope). Read in the engines' source."""
    dp_prefill_gather: str = "all_gather"
    """Attention data parallelism, passes with a prefill (step_time.model.dp_prefill_gather): `all_reduce` for SGLang,
    whose DpPaddingMode.get_dp_padding_mode picks SUM_LEN for every batch with an extend (sgl-project/sglang#10414,
    of September 2025; the rows ran 0.5.8): its dp_gather all-reduces a zeroed buffer of all the ranks' tokens, and the MoE's output is
    all-reduced before dp_scatter copies each rank's slice out; `all_gather` (an all-gather and a reduce-scatter)
    for TensorRT-LLM and vLLM, and for every engine's decode-only passes (SGLang's MAX_LEN). Read in the engines'
    source, not fitted."""
    config: str = "defaults"
    """Which limits a published row's engine ran with (ENGINE_CONFIGS below): its launch defaults (`scheduler`,
    `graph_sizes` above) or AIConfigurator's benchmark rules. Chosen per engine on the even lines of the
    silicon sample's agg rows by median |TTFT error| (the token budget acts on TTFT first; docs/fidelity.md
    "Engine limits"): vLLM and TensorRT-LLM the benchmark rules, SGLang its defaults. A row whose launch is known
    may say otherwise (sim.published.launches.launch_config: InferenceX's vLLM rows keep vLLM's defaults)."""

    prefill_batches: str = "mixed"
    """Whether a chunked scheduler's iteration mixes decodes with prefill chunks (scheduler.prefill_batches): `mixed`
    (vLLM, whose scheduler always does), or `separate` (SGLang without --enable-mixed-chunk, its default: an iteration
    with prefill work runs it alone and the decodes wait). Agg rows only: a disaggregated prefill pool runs no decodes
    and a decode pool no prompts. SGLang's, read in its scheduler, was tried against `mixed` on its agg rows by the
    rule every engine choice follows (the mean of median |TTFT| and |TPOT| error on the even lines): 25.9% -> 24.4%,
    held out on the odd lines 22.3% -> 19.3% (`python benchmarks/prefill_batches_choice.py`, docs/fidelity.md
    "SGLang's prefill batches")."""
    async_scheduling: bool = False
    """Whether the replay plans each iteration while the one before runs (scheduler.async_scheduling: vLLM's async
    scheduling, default since 0.14; TensorRT-LLM's overlap scheduler, default in its PyTorch backend; SGLang's overlap
    schedule). Every engine's code does. Replayed on the silicon sample's agg rows, each side with its own front end
    chosen on the even lines, it gained nothing held out (TensorRT-LLM a hair worse on every test, vLLM better on the
    odd lines and worse with each collection left out: docs/fidelity.md "Async scheduling"), so the replays keep it
    off and the fitted front end; a scenario of a real deployment should set it."""
    frontend_ms: tuple[float, float] = (0.0, 0.0)
    """The front end's time in a request's TTFT (client, HTTP, API server, tokenizer), which the engine model does
    not produce: (base, per user) in ms, base + per_user x the row's concurrency, added to the replay's simulated
    TTFT (sim.published.predict.frontend_latency_s). Fitted per engine on the even lines of the silicon sample's agg rows by
    median |TTFT error| (`python benchmarks/published_peer.py REPORT --frontend-fit`, REPORT any agg run;
    docs/fidelity.md "The engines' front end"), reported on the odd lines: vLLM 25 + 0.4, SGLang 100 + 0,
    TensorRT-LLM 120 + 1 (its launches without postprocess workers; 90 + 1.5 over all its rows before 2026-12-07).
    Disaggregated rows too: on their even lines that beat none (42.9% against 63.1%); there the users are those of one
    decode worker, concurrency / decode_num_workers (2026-12-06, docs/disaggregation.md "The front end's users")."""
    frontend_postprocess_ms: tuple[float, float] | None = None
    """The front end of agg rows whose launch detokenizes and streams in worker processes (TensorRT-LLM's
    num_postprocess_workers; sim.published.launches.postprocess_workers), fitted as frontend_ms is on those rows'
    even lines (TensorRT-LLM 30 + 0: InferenceX's Llama-70B and gpt-oss-120b launches; docs/fidelity.md
    "TensorRT-LLM's postprocess workers"); None: frontend_ms for every row."""

    steady_phases: str = "even"
    """The steady state's users (`--start cold`'s later waves; Case.phases): first requests spread `even`ly over one
    request lifetime, or at `random` times within it (workload.ramp_phases), which, with fixed lengths, keeps the
    collisions of random phases wave after wave where even phases have none. Chosen per engine on the even lines of the
    silicon sample's agg rows by median |TTFT error| (docs/fidelity.md "The steady state's phases"): vLLM `random`
    (18.2% -> 15.9% on its 294 even H100 and B200 lines with seed 0, 15.2% with seed 1); TensorRT-LLM `even` (random:
    23.3% -> 24.7% on its even lines); SGLang keeps a cohort (later_waves), which has no steady state."""
    disagg_steady_phases: str = "even"
    """Disaggregated rows: the steady state's user phases (as steady_phases), chosen per engine on the even lines of
    the silicon sample's disaggregated rows by the same rule (docs/disaggregation.md, measured 2026-12-04):
    TensorRT-LLM `random` (35.6% -> 34.6% on its even lines), vLLM `random` (67.4% -> 67.3%); SGLang, whose steady state
    counts since disagg_later_waves is `spread` (2026-12-06), `even` (26.9% against 27.1% with `random`)."""
    disagg_later_waves: str = "spread"
    """Disaggregated rows: later_waves after the cold first wave. `spread` for every engine: a prefill pool serves a
    returning cohort's prompts one after another, their decodes end as far apart, and from the second wave on each
    prompt finds the pool free (the simulator's own closed loop, `python benchmarks/disagg_cohort.py waves`,
    docs/disaggregation.md "SGLang's cohort after the first wave"), so SGLang's agg `cohort` does not carry over.
    Chosen with DISAGG_ROUNDS (sim.published.predict) on the even disaggregated lines."""
    disagg_first_token: str = "prefill"
    """Disaggregated rows: where the client's first token comes from (disaggregation.first_token). Read in each
    engine's code: vLLM's decode instance loads the prompt's KV over NIXL and computes its last token again to
    sample the first (`decode_recompute`); SGLang's decode server gets the prefill's token with the KV and streams it
    when the request joins its running batch (`decode_admission`); TensorRT-LLM's disaggregated server streams the
    generation server's response, whose first comes after its first generation step (`decode_step`). Each engine's
    value replaced `prefill` where it lowered the median |TTFT error| on the even disaggregated lines
    (`python benchmarks/disagg_compare.py`, docs/disaggregation.md): vLLM 70.7% -> 67.4%, SGLang 42.1% -> 41.9%;
    TensorRT-LLM tied then (35.6% both) and kept `prefill` until its steady phases and KV format were chosen; set
    against each other again after them (2026-12-05) its even lines read 33.9% -> 32.2% (odd 48.1% -> 47.0%), and
    it takes `decode_step`."""

    disagg_frontend_hops: int = 1
    """Disaggregated rows: how many times a request passes the engine's front end (API server, tokenizer) in series
    before its first token. vLLM 2: its P/D proxy sends the request to a prefill server, waits for the whole one-token
    response, then sends it to a decode server (rule read in its proxies' code; the serial dispatch vllm#50913
    measures). SGLang 1: its router sends to both servers at once. TensorRT-LLM 1: its rows ran Dynamo's images, whose
    one front end hands the request to the workers inside Dynamo's runtime. Tested on 2026-12-03 with TensorRT-LLM
    counted twice too and not adopted; with TensorRT-LLM once (2026-12-06), vLLM's even lines read 43.0% -> 37.6%
    (odd 32.9% -> 33.8%), so it is adopted (docs/disaggregation.md "The front end once or twice")."""
    disagg_frontend_users: str = "decode_worker"
    """Disaggregated rows: whose users the front end's per-user term counts (sim.published.disagg.FRONTEND_USERS):
    `decode_worker`, the users of one decode worker, or `none`, the base time alone. The term was fitted on agg rows
    of at most 384 users (TensorRT-LLM) and grows linearly with them; a disaggregated TensorRT-LLM row puts up to
    4,096 users on one decode worker, where it added 6 s, and those rows ran Dynamo's front end, not trtllm-serve's.
    Chosen per engine on the even disaggregated lines by median |TTFT error| (`python benchmarks/disagg_compare.py` on
    a run with `--frontend-users none` against the default run; docs/disaggregation.md "The front end's users, past
    the fit's range"): TensorRT-LLM `none` (23.7% -> 18.1%; held out on its odd lines 40.2% -> 34.3%), vLLM
    `decode_worker` (39.3% against 39.5%); SGLang's front end has no per-user term. Chosen again once the rows replay
    as their recorded client (SA-Bench, sim.published.client; 2026-12-07, `--backend trtllm --frontend-users
    decode_worker` against the default run): TensorRT-LLM's even lines 36.3% -> 29.2% (odd 41.6% -> 29.2%), so every
    engine now counts a decode worker's users (docs/disaggregation.md "The rows' client, read from their
    provenance")."""
    attention_dp_routing: str = "shared_queue"
    """Agg rows whose replica runs attention data parallelism: how its ranks get their requests
    (parallel.attention_dp_routing, sim.core.schedulers.ranked): `shared_queue`, one queue every pass spreads evenly
    over the ranks, or bound at arrival (`random`, `round_robin`, `least_loaded`)."""
    disagg_attention_dp_routing: str = "shared_queue"
    """Disaggregated rows' pools of attention data parallelism: as attention_dp_routing."""
    disagg_pool_batch: str = "defaults"
    """Disaggregated rows: how many requests a pool's worker runs at once (sim.published.disagg.POOL_BATCH): `stated`,
    the row's prefill_batch_size / decode_batch_size per attention-DP rank, or `defaults`, the engine's launch limit.
    `defaults` for every engine (2026-12-07): the stated sizes are not the engines' limits. On every replayed row
    decode_batch_size x decode workers x attention-DP ranks is the row's concurrency exactly and prefill_batch_size
    is 1 (`python benchmarks/disagg_stated_batch.py`; 239 of the 246 disaggregated rows that state a decode batch),
    one deployment's sweep of concurrencies states a different "limit" at each, and the recipes the rows ran set
    other ones (srt-slurm: vLLM's Kimi 1p4d decode max-num-seqs 1,024 swept at 4-256 users; SGLang's B200 max-tpt
    decode max-running-requests 512-2,048; TensorRT-LLM's ctx servers max_batch_size 1 or 16; docs/disaggregation.md
    "The stated batch is the concurrency, divided"). SGLang and vLLM had taken `stated` by the even lines (2026-12-06,
    and kept under SA-Bench: vLLM 14.5%, SGLang 31.8% on its even lines), a fit to a column that describes the sweep,
    not the engine; with their launch limits their even lines read 57.5% and 40.8%."""
    disagg_prefill_response: str = "at_once"
    """Disaggregated rows: whether the client's stream also waits for the prefill server's answer
    (disaggregation.wait_for_prefill_response): `wait` for SGLang, whose router sends a request to both servers at once
    and starts streaming the decode server's tokens only when both have answered, the prefill server answering between
    its batches once the KV has been sent (read in sgl-project/sglang#22853, where the router and the prefill
    scheduler's inflight queue are traced; docs/disaggregation.md "The prefill server's answer"); `at_once` where
    the first token does not wait for it (TensorRT-LLM's and vLLM's paths take the prefill response before the
    decode request is sent)."""

    disagg_ep_communication: str = "all_reduce"
    """Disaggregated rows: how the experts' inputs and outputs meet in a pool of attention data parallelism with the
    experts spread over its GPUs (parallel.ep_communication): `all_reduce`, every rank's tokens gathered to the expert
    GPUs and scattered back, `all_to_all`, each rank dispatching its tokens to their experts' GPUs and combining them
    back (DeepEP), or `recipes`, as the recipes the rows ran set it (sim.published.disagg.RECIPE_EP_COMMUNICATION).
    SGLang `recipes`: its 92 srt-slurm recipes of GB200 and GB300 set `moe-a2a-backend: deepep` on every FP8
    attention-DP worker with ep > 1 (normal mode on the prefill, low-latency on the decode) and on every FP4 decode
    worker of wide EP, and leave it out on the FP4 prefill workers (FlashInfer's MoE runners over gathered tokens)
    (e.g. recipes/gb200-fp8/1k1k/max-tpt.yaml, gb200-fp4/1k1k/max-tpt.yaml; docs/disaggregation.md "DeepEP in
    SGLang's wide-EP pools"). TensorRT-LLM `all_to_all`: with attention DP and moe_tp 1 its MoE modules pick an NVLink
    all-to-all (NVLinkOneSided first, tensorrt_llm/_torch/modules/fused_moe/communication; disagg_all_to_all says
    whose kernels), and its GB200 / GB300 / B200 disaggregated recipes run every attention-DP worker with ep > 1 that
    way (docs/disaggregation.md "TensorRT-LLM's NVLink all-to-all"). Read in the code and recipes, not fitted."""

    disagg_all_to_all: str = "auto"
    """Disaggregated rows whose pools exchange tokens all-to-all: whose kernels (step_time.model.all_to_all), `auto`
    or `recipes`, by the row's precision as the recipes run them (sim.published.disagg.RECIPE_ALL_TO_ALL): TensorRT-LLM's
    NVLinkOneSided for FP4 (the CUTLASS, CuteDSL and TRTLLM MoE backends' default), NVLinkTwoSided for FP8 (its
    GB200 / GB300 FP8 recipes set TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED on the DeepGEMM decode workers; one
    step-time model serves both pools, so the prefill pool's exchange is costed the same way)."""

    attention_dp_balance_iters: int = 0
    """Agg rows with attention data parallelism: scheduler.attention_dp_balance_iters, new prompts held until every rank
    has one, for at most this many passes while every rank decodes (0: off). TensorRT-LLM 60: InferenceX's B200
    DeepSeek-R1 launch scripts (SemiAnalysisAI/InferenceX benchmarks/single_node/dsr1_fp4_b200_trt.sh,
    dsr1_fp8_b200_trt.sh) set `attention_dp_config: {batching_wait_iters: 0, enable_balance: true, timeout_iters: 60}`
    whenever DP attention is on (its gpt-oss script sets enable_balance alone: TensorRT-LLM's defaults, 50 passes and
    a batching wait of 10, replayed as 60 and none). Read in the scripts and in TensorRT-LLM's
    PyExecutor._balance_adp_requests, not fitted (docs/fidelity.md "TensorRT-LLM's attention-DP balance")."""

    disagg_handshake: str = "none"
    """Disaggregated rows: whether the prefill waits for the decode server to take the request first, and how often
    the engines take new requests (sim.published.handshake.HANDSHAKES): `none` for TensorRT-LLM and vLLM, whose
    paths send the request to the prefill side first; set for SGLang, whose prefill server waits for the decode
    server's pre-allocation (docs/disaggregation.md "The decode server's pre-allocation")."""

    kv_cache: str = "bf16"
    """Which rows' KV cache the replay stores in FP8 (KV_CACHE): `bf16` none, `quantized` every
    FP8 and FP4 row's, `checkpoint` the FP4 rows' (NVIDIA's NVFP4 checkpoints ship kv_cache_quant_algo FP8). Chosen
    per engine on the even lines of the silicon sample (agg and disaggregated) by the mean of the median |TTFT error|
    and the median |TPOT error| (`python benchmarks/kv_cache_choice.py`, docs/fidelity.md "The KV cache's format"):
    TensorRT-LLM `quantized` (17.6% -> 15.8%; held out on the odd lines 17.0% -> 15.5%), SGLang `quantized` (39.0% ->
    37.4%; odd lines 34.1% -> 34.4%, not confirmed), vLLM `checkpoint` (10.1% -> 9.5%; odd lines 9.1% -> 9.0%)."""

    def host_per_sequence_s(self, version: str) -> float:
        """The host time per sequence a row of `version` (the file's backend_version) pays each iteration:
        sync_host_per_sequence_s before `async_since`, else 0. A version that is not a release number (empty, a
        nightly build) is taken as a recent one (async)."""
        if not self.sync_host_per_sequence_s or self.async_since is None:
            return 0.0
        release = release_number(version)
        if release is None or release >= release_number(self.async_since):
            return 0.0
        return self.sync_host_per_sequence_s

    def describe(self, config: str | None = None) -> str:
        """One line: the scheduler, KV admission, KV memory rule and graph padding this engine is simulated with
        (under `config`, default its own)."""
        s = self.scheduler
        if (config or self.config) == "aic_benchmark":
            blocks = " rounded up to 32-token blocks" if self.backend == "trtllm" else ""
            sched = (f"{s['kind']} batching with AIConfigurator's benchmark limits: max_num_seqs = the row's batch "
                     f"size, max_num_batched_tokens = batch + ISL + {AIC_SLACK_TOKENS}{blocks}")
            graphs = "CUDA graphs for every batch size up to max_num_seqs"
        else:
            sched = (f"{s['kind']} batching, max_num_seqs {s['max_num_seqs']}, "
                     f"max_num_batched_tokens {s['max_num_batched_tokens']}")
            graphs = f"CUDA graphs for decode batches <= {max(self.graph_sizes)}" if self.graph_sizes else "no graph padding"
        mem = (f"KV = {self.memory_fraction} x card memory - weights - {RESERVE_BYTES // GIB} GiB"
               if self.memory_rule == "card" else
               f"KV = {self.memory_fraction} x (card memory - weights - {RESERVE_BYTES // GIB} GiB)")
        moe = "composed from GEMMs" if self.moe[0] == "composed" else f"{self.moe[0]}'s kernels, {self.moe[1]} routing"
        ar = "NCCL's" if self.all_reduce == "nccl" else f"{self.all_reduce}'s own"
        if self.host_overhead_s is not None:
            ar += f"; host overhead {self.host_overhead_s * 1e3:.4g} ms"
        if self.sync_host_per_sequence_s and self.async_since is not None:
            ar += (f"; host {self.sync_host_per_sequence_s * 1e6:.4g} us per sequence a step before {self.async_since} "
                   "(synchronous scheduling)")
        mla = "composed" if self.mla_kernels == "composed" else f"{self.mla_kernels}'s measured kernels"
        over = self.shared_experts_overlap
        shared = {"off": "in series with the routed ones", "decode": "beside the routed ones in decode-only passes",
                  "fused": "fused into the routed kernel (in series under expert parallelism)"}.get(
            over, f"beside the routed ones in passes of <= {over} tokens")
        if config is None and self.backend == "vllm":  # sim.published.launches.launch_config
            sched += (f" (InferenceX's launches: its launch defaults, max_num_seqs {s['max_num_seqs']}, "
                      f"max_num_batched_tokens {s['max_num_batched_tokens']})")
        return (f"{self.backend} ({self.versions}): {sched}; KV admission {self.kv_admission}; {mem}; {graphs}; "
                f"after a cold first wave: {self.later_waves} ({self.disagg_later_waves} on disaggregated rows); MoE experts: {moe}; shared experts {shared}; "
                f"MLA attention: {mla}; attention-DP passes with a prefill gather by {self.dp_prefill_gather}; "
                f"q / k norms {'fused with RoPE' if self.qk_norm_kernels == 'fused_with_rope' else 'as kernels of their own'}; "
                f"all-reduce: {ar}; async scheduling {'on' if self.async_scheduling else 'off'}; "
                + (f"prefill batches {self.prefill_batches} (agg rows); " if self.scheduler.get("kind") == "chunked"
                   else "") +
                f"front end {self.frontend_ms[0]:g} ms + {self.frontend_ms[1]:g} ms per user (fitted)"
                + (f", {self.frontend_postprocess_ms[0]:g} ms + {self.frontend_postprocess_ms[1]:g} ms per user "
                   "where the launch has postprocess workers" if self.frontend_postprocess_ms else "")
                + (f", {self.disagg_frontend_hops} in series on disaggregated rows" if self.disagg_frontend_hops > 1
                   else "")
                + (", no per-user term on disaggregated rows" if self.disagg_frontend_users == "none" and
                   self.frontend_ms[1] else "") + "; "
                f"steady-state users' phases: {self.steady_phases} ({self.disagg_steady_phases} on disaggregated "
                f"rows); disaggregated rows' first token: {self.disagg_first_token}"
                + (", after the prefill server's answer" if self.disagg_prefill_response == "wait" else "") +
                f"; disaggregated workers' batch: {self.disagg_pool_batch}; decode handshake: {self.disagg_handshake}" +
                f"; disaggregated attention-DP pools' experts meet by {self.disagg_ep_communication}" +
                (f" ({self.disagg_all_to_all} kernels)" if self.disagg_all_to_all != "auto" else "") +
                (f"; attention-DP prompts held for balance up to {self.attention_dp_balance_iters} passes (agg rows)"
                 if self.attention_dp_balance_iters else "") +
                f"; attention-DP ranks' requests: {self.attention_dp_routing} ({self.disagg_attention_dp_routing} on "
                f"disaggregated rows); KV cache in FP8: "
                f"{KV_CACHE_ROWS[self.kv_cache]}")


KV_CACHE_ROWS = {"bf16": "none", "quantized": "FP8 and FP4 rows", "checkpoint": "FP4 rows"}
"""What each EngineDefaults.kv_cache value stores in FP8, as describe() says it."""

KV_CACHE = tuple(KV_CACHE_ROWS)
"""build_case's `kv_cache` (besides `engine`, EngineDefaults.kv_cache): which rows' KV cache is stored in FP8. The file
has no KV column. `bf16`: none (every engine's `auto` on a checkpoint that states no KV format). `quantized`: every
FP8 and FP4 row's, as AIConfigurator infers for a quantized checkpoint (aiconfigurator-core 0.12.0,
sdk/models/helpers.py _infer_quant_modes_from_raw_config: fp8, fp8_block and nvfp4 weights -> FP8 KV and FMHA) and
its generator writes into the launch config (generator/module_bridge.py: kv_cache_dtype). `checkpoint`: the FP4
rows' only, whose NVIDIA NVFP4 checkpoints ship hf_quant_config kv_cache_quant_algo FP8 (which `auto` follows in
TensorRT-LLM and, since vllm-project/vllm#29980, vLLM); the FP8 rows' checkpoints (the model makers') state none.
An FP8 cache halves the bytes per cached token and the bytes decode attention reads (sim.models.ops.KV_READ_SCALE);
prefill attention keeps its BF16 time."""


def kv_format_for(kv_cache: str, row: PublishedRow) -> str:
    """The scenario's kv.format for `row` under `kv_cache` (KV_CACHE or `engine`), or a ConfigError naming the values."""
    if kv_cache == "engine":
        kv_cache = ENGINES[row.backend].kv_cache
    if kv_cache not in KV_CACHE:
        raise ConfigError(f"kv_cache: expected one of engine, {', '.join(KV_CACHE)}, got {kv_cache!r}")
    fp8 = {"bf16": (), "quantized": ("fp8", "fp4"), "checkpoint": ("fp4",)}[kv_cache]
    return "fp8" if row.precision in fp8 else "bf16"


def release_number(version: str) -> tuple[int, ...] | None:
    """A release's number as a tuple ("0.12.0" -> (0, 12, 0), "v0.14" -> (0, 14), "1.3.0rc1" -> (1, 3, 0)); None when
    `version` does not start with one (empty, "nightly-5b8c30d")."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip().lower())
    return None if m is None else tuple(int(g) for g in m.groups() if g is not None)


AIC_SLACK_TOKENS = 1500
"""AIConfigurator's benchmark rules' token headroom over one prompt: agg max_num_tokens = max_batch_size + ISL + 1500."""

RESERVE_BYTES = 2 * GIB
"""Per card, memory neither weights nor KV: activations of the profiling pass, CUDA graphs, NCCL
buffers. A round figure, stated, not fitted."""

ENGINES: dict[str, EngineDefaults] = {
    "vllm": EngineDefaults(
        "vllm", "V1 engine, 0.11-0.19: `vllm serve` on a >= 70 GiB card",
        {"kind": "chunked", "max_num_seqs": 1024, "max_num_batched_tokens": 8192, "chunk_tokens": 8192},
        "on_demand", "card", 0.9, VLLM_GRAPH_SIZES,
        ("chunked prefill always on; running requests first, then waiting ones, FCFS",
         "gpu_memory_utilization 0.9, 16-token blocks, prefix caching on (random prompts: no hits)"),
        moe=("vllm", "power_law_1.2"), config="aic_benchmark", all_reduce="vllm", frontend_ms=(25.0, 0.4),
        disagg_first_token="decode_recompute", steady_phases="random", disagg_steady_phases="random",
        disagg_frontend_hops=2, mla_kernels="sglang",
        async_since="0.14", sync_host_per_sequence_s=60e-6, kv_cache="checkpoint"),
    "sglang": EngineDefaults(
        "sglang", "0.5.x: `sglang.launch_server` on an 80 GB-class card",
        {"kind": "chunked", "max_num_seqs": 1024, "max_num_batched_tokens": 8192, "chunk_tokens": 8192},
        "on_demand", "card", 0.88, list(range(1, 5)) + list(range(8, 257, 8)),
        ("chunked_prefill_size 8192; mem_fraction_static ~0.88",
         "prefill batches apart from decode batches (no --enable-mixed-chunk, its default)"),
        later_waves="cohort", moe=("sglang", "balanced"), mla_kernels="sglang", all_reduce="sglang",
        shared_experts_overlap="off", dp_prefill_gather="all_reduce",
        frontend_ms=(100.0, 0.0), disagg_first_token="decode_admission", disagg_prefill_response="wait",
        disagg_handshake="recipes", disagg_ep_communication="recipes",
        kv_cache="quantized",
        prefill_batches="separate"),
    "trtllm": EngineDefaults(
        "trtllm", "1.x PyTorch backend: `trtllm-serve` defaults",
        {"kind": "continuous", "max_num_seqs": 2048, "max_num_batched_tokens": 8192},
        "reserve", "free", 0.9, None,
        ("max_batch_size 2048, max_num_tokens 8192, chunked prefill off, GUARANTEED_NO_EVICT (reserve KV for "
         "prompt + all outputs at admission)", "kv_cache free_gpu_memory_fraction 0.9 of the memory left after weights"),
        config="aic_benchmark", all_reduce="trtllm", host_overhead_s=0.4654e-3, shared_experts_overlap="decode",
        qk_norm_kernels="fused_with_rope", frontend_ms=(120.0, 1.0), frontend_postprocess_ms=(30.0, 0.0),
        disagg_steady_phases="random",
        disagg_first_token="decode_step", disagg_ep_communication="all_to_all", disagg_all_to_all="recipes",
        attention_dp_balance_iters=60, kv_cache="quantized"),
}


def kv_budget_bytes(engine: EngineDefaults, card_bytes: int, weight_bytes_per_card: float, tp: int) -> int:
    """KV bytes of one replica of `tp` cards under the engine's memory rule (<= 0: nothing fits)."""
    left = card_bytes - weight_bytes_per_card - RESERVE_BYTES
    if engine.memory_rule == "card":
        per_card = engine.memory_fraction * card_bytes - weight_bytes_per_card - RESERVE_BYTES
    else:
        per_card = engine.memory_fraction * left
    return int(per_card * tp)


ENGINE_CONFIGS = ("engine", "defaults", "aic_benchmark")
"""How the engine of a published row is taken to have been configured: `engine` (each engine's choice,
EngineDefaults.config), `defaults` (each engine's launch defaults, ENGINES above) or `aic_benchmark` (the limits
AIConfigurator's generator writes for a benchmark deployment: aiconfigurator 0.12.0,
generator/rule_plugin/benchmark/<engine>.rule)."""


def aic_benchmark_limits(engine: EngineDefaults, batch: int, isl: int) -> tuple[dict, list[int]]:
    """The scheduler mapping and CUDA-graph sizes of one rank under AIConfigurator's benchmark rules:
    max_batch_size = the row's batch size (its concurrency per rank), a token budget of batch + ISL + 1,500
    (vLLM max_num_batched_tokens, TensorRT-LLM max_num_tokens rounded up to its 32-token blocks, SGLang
    max_prefill_tokens = ISL + 1,500 with mixed chunks, so decodes ride beside it), CUDA graphs captured for
    every batch size up to max_batch_size (no padding). Chunked prefill stays as the engine's default."""
    budget = batch + isl + AIC_SLACK_TOKENS
    if engine.backend == "trtllm":
        budget = -(-budget // 32) * 32
    sched = dict(engine.scheduler, max_num_seqs=batch, max_num_batched_tokens=budget)
    if "chunk_tokens" in sched:
        sched["chunk_tokens"] = isl + AIC_SLACK_TOKENS if engine.backend == "sglang" else budget
    return sched, list(range(1, batch + 1))
