"""Replay published serving runs in the simulator: each row becomes a closed loop of `concurrency`
users sending fixed ISL/OSL requests to one replica running the engine's default settings, and the
simulated mean TTFT and TPOT are set against the measured ones.

Multi-GPU rows run one replica of `parallel: {tp, pp, ep, attention_dp}` (issue [parallel]: per-GPU weights
and KV, MoE experts over the GPUs of a stage, moe_tp x moe_ep = attention_dp x tp; attention data-parallel
ranks with the engine's limits each). Disaggregated rows run a prefill pool and a decode pool, each built as
one replica is here (sim.published.disagg). A row capsim cannot express (pools without worker counts, a card
or precision without operator tables, a model without a profile, weights that do not fit, collectives the
card's tables lack) is skipped with the reason, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from sim.core.disagg_config import FIRST_TOKEN
from sim.published.checkpoints import (ATTENTION_BF16_FP4, EXPERTS_ONLY_FP4, MXFP4_EXPERTS,  # noqa: F401
                                        checkpoint_formats, mxfp4_activations)
from sim.published.client import as_sa_bench, client_for
from sim.published.routing import routed_scenario
from sim.io.errors import ConfigError
from sim.io.profiles import load_hardware, load_model, profiles_dir
from sim.models.ops_tables import find_table, load_table_set
from sim.models.parallel import Layout, kv_bytes_per_token_per_gpu, layout_problems, weights_per_gpu
from sim.models.spec import ModelSpec
from sim.published.disagg import FRONTEND_USERS, POOL_BATCH, PREFILL_RESPONSE, build_disagg_case
from sim.published.handshake import handshake_scenario
from sim.published.engines import (ENGINE_CONFIGS, ENGINES, KV_CACHE, aic_benchmark_limits, kv_budget_bytes,  # noqa: F401
                                   kv_format_for)  # (KV_CACHE re-exported)
from sim.published.launches import later_waves as launch_waves, launch_config, launch_scheduler, postprocess_workers
from sim.published.rows import PublishedRow

SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "b200_sxm": "b200", "a100_sxm": "a100-80g-sxm",
           "l40s": "l40s", "b300_sxm": "b300", "gb200": "gb200", "gb300": "gb300"}
"""Card names of the published schema -> capsim hardware profiles (cards with operator tables)."""

MODEL_ALIASES = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
                 "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
                 "Qwen/Qwen3-32B-FP8": "qwen3-32b", "deepseek-ai/DeepSeek-R1": "deepseek-v3",
                 "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b", "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3",
                 "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3", "nvidia/Qwen3-32B-NVFP4": "qwen3-32b"}
"""Checkpoints with the architecture of a shipped model profile (instruct tunes, FP8 exports, NVIDIA's NVFP4
quantizations: their config.json keeps the base model's architecture, DeepSeek-V3.1 DeepSeek-V3's)."""

PRECISIONS = {"bf16": "bf16", "fp16": "bf16", "": "bf16", "fp8": "fp8", "fp4": "nvfp4"}
"""Published precision -> capsim weight format. Empty means the checkpoint's own dtype (BF16 for every
model capsim maps). fp4 is NVFP4 (every fp4 row's gemm_quant_mode and moe_quant_mode say nvfp4): every GEMM
from the card's NVFP4 table, the routed experts from the engine's NVFP4 fused-MoE kernel; Blackwell cards
only. int4 has no operator tables and is skipped."""

START_MODES = ("cold", "staggered", "burst")

PHASES = ("even", "random")

ROUNDS = 10
"""Requests per user of the benchmark a row is replayed as under `--start cold` (N; N x concurrency requests
in all). The file does not say; AIConfigurator, whose database the rows come from, describes its serving
benchmarks as N x concurrency requests with N = 10 (aiconfigurator 0.12.0, sdk/inference_session.py, the
TTFT correction of its disaggregated search). Stated, not fitted."""

DISAGG_ROUNDS = "dynamo"
"""Requests per user of the benchmark a disaggregated row is replayed as under the fixed client (`--client fixed`,
`--rounds` unset; by default these rows replay as SA-Bench, their recorded client: sim.published.client).
`dynamo`: Dynamo's benchmark utility (ai-dynamo/dynamo benchmarks/utils/aiperf.py, `run_aiperf`) sends
max(3 x concurrency, 10) requests without a warm-up, N = max(3, 10 / concurrency). Chosen, before the rows' client was
read from their provenance, on the even disaggregated lines among
N = 10 (ROUNDS), this rule, and AIConfigurator's generated benchmark (generator bench_run.sh.j2: 50 x concurrency
requests after 2 x concurrency warm-up ones, the steady state alone), reported on the odd ones
(docs/disaggregation.md, "The benchmark's length")."""

ROUND_RULES = ("dynamo",)
"""Named benchmark lengths `rounds` accepts besides an integer (benchmark_rounds)."""


def benchmark_rounds(rounds: int | str | None, mode: str, users: int) -> float:
    """Requests per user (N, possibly fractional) of the benchmark a row of `mode` at `users` concurrency is replayed
    as: `rounds` an integer, or `dynamo` (DISAGG_ROUNDS), or None for the default (agg ROUNDS, disagg DISAGG_ROUNDS).
    The mean over the benchmark's requests is (first wave + (N - 1) x steady) / N for fractional N too: N x users
    requests, the first `users` of them the cold wave."""
    if rounds is None:
        rounds = DISAGG_ROUNDS if mode == "disagg" else ROUNDS
    if rounds == "dynamo":
        return max(3 * users, 10) / max(users, 1)
    if isinstance(rounds, str) or rounds < 1:
        raise ConfigError(f"rounds: expected an integer >= 1 or one of {', '.join(ROUND_RULES)}, got {rounds!r}")
    return float(rounds)


def requests_per_user(osl: int) -> int:
    """Requests each simulated user sends by default: 1 + ceil(16384 / OSL), between 3 and 6 (the
    first is a warm-up; long outputs need fewer rounds for stable means and cost more to simulate)."""
    return max(3, min(6, 1 + math.ceil(16384 / osl)))


@dataclass(frozen=True)
class Case:
    """A row as a scenario mapping, or the reason it cannot be one."""

    row: PublishedRow
    scenario: dict | None = None
    skipped: str | None = None
    start: str = "cold"
    """`cold` (default): the benchmark as run, N x concurrency requests whose first wave starts together on
    an idle engine (see `simulate_case`); `staggered`: users' first requests spread over one request
    lifetime, first wave not counted (the steady state alone); `burst`: all users start together and every
    request counts (the simulator keeps a cohort in lock-step)."""
    rounds: float = 10
    """`cold`: requests per user in the replayed benchmark (N); see ROUNDS, DISAGG_ROUNDS and benchmark_rounds."""
    frontend_s: float = 0.0
    """Added to the simulated TTFT: the front end's time the engine model does not produce (frontend_latency_s), times
    frontend_hops."""
    frontend_hops: int = 1
    """Front ends a request passes through in series before its first token (EngineDefaults.disagg_frontend_hops)."""
    phases: str = "even"
    """The steady state's users (`cold`'s later waves, `staggered`): first requests spread `even`ly over one request
    lifetime, or at `random` times within it (workload.ramp_phases)."""


def model_for(model_path: str) -> str | None:
    """The capsim model profile for a Hugging Face id (aliases first, then each profile's hf_id)."""
    if model_path in MODEL_ALIASES:
        return MODEL_ALIASES[model_path]
    for path in sorted((profiles_dir() / "models").glob("*.yaml")):
        try:
            prof = load_model(path.stem)
        except ConfigError:
            continue
        if prof.hf_id.lower() == model_path.lower():
            return prof.name
    return None


def _unsupported_layout(row: PublishedRow) -> str | None:
    if row.mode != "agg":
        return "disaggregated serving (separate prefill and decode pools) is not modelled"
    dp = max(row.attention_dp, 1)
    if (row.moe_ep > 1 or dp > 1) and row.moe_tp * row.moe_ep != row.tp * dp:
        return (f"expert layout moe_tp {row.moe_tp} x moe_ep {row.moe_ep} != attention_dp {dp} x tp {row.tp}: "
                "experts are modelled on the GPUs of a stage (issue [parallel])")
    return None


def _collectives_missing(hardware: str, layout: Layout, all_reduce: str = "nccl") -> str | None:
    """Why the card's tables cannot time this layout's all-reduce / all-gather (None when they can): the all-reduce
    in the table the step time will use (`all_reduce`: nccl or an engine's own, step_time.model.all_reduce), the
    attention-DP all-gather and the logits' all-gather under tp in NCCL's (sim.models.ops.OpsModel.head_s)."""
    need = []
    if layout.tp > 1:
        need += [("all_reduce", layout.tp, all_reduce), ("all_gather", layout.tp, "nccl")]
    if layout.attention_dp > 1 and layout.ep_communication == "all_reduce":
        need.append(("all_gather", layout.expert_gpus, "nccl"))
    from sim.models.collectives import fabric_of, table_collectives
    from sim.models.ops_tables import load_table_set
    tables, fabric = load_table_set(hardware), fabric_of(load_hardware(hardware))
    for op, gpus, whose in need:
        table = table_collectives(tables, fabric, whose)[0 if op == "all_reduce" else 1]
        if why := table.why_not(op, gpus):
            return (f"{layout.describe()}: {op} over {gpus} GPUs, which the {hardware} tables do not measure nor its "
                    f"fabric reach ({why})")
    return None


ASYNC_SCHEDULING = ("engine", "on", "off")
"""build_case's `async_scheduling`: each engine's choice (EngineDefaults.async_scheduling), or on / off for all rows."""


PREFILL_BATCHES = ("engine", "mixed", "separate")
"""build_case's `prefill_batches`: each engine's (EngineDefaults.prefill_batches), or mixed / separate for every row
whose engine schedules chunked prefill (scheduler.prefill_batches)."""


def _scheduler(engine, dp: int, per_rank: dict | None = None, async_scheduling: str = "engine",
               prefill_batches: str = "engine") -> dict:
    """The engine's scheduler mapping (or `per_rank`) for a replica of `dp` attention data-parallel ranks: each
    rank schedules its own requests within the engine's limits, so the replica's limits are dp times them
    (chunks stay a rank's); scheduler.async_scheduling as `async_scheduling` (ASYNC_SCHEDULING) says, and a chunked
    scheduler's prefill_batches as `prefill_batches` (PREFILL_BATCHES) does (`engine`: mixed under the benchmark
    limits, whose launch enables mixed chunks; else EngineDefaults.prefill_batches)."""
    out = dict(per_rank or engine.scheduler)
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        out[key] = out[key] * dp
    if (engine.async_scheduling if async_scheduling == "engine" else async_scheduling == "on"):
        out["async_scheduling"] = True
    # AIConfigurator's benchmark limits (`per_rank`) launch SGLang with mixed chunks (aic_benchmark_limits)
    default = "mixed" if per_rank is not None else engine.prefill_batches
    if out.get("kind") == "chunked" and (default if prefill_batches == "engine" else prefill_batches) == "separate":
        out["prefill_batches"] = "separate"
    if dp > 1 and engine.attention_dp_balance_iters:
        out["attention_dp_balance_iters"] = engine.attention_dp_balance_iters
    return out


def step_time_for(mixed: str = "one_pass", moe_kernels: str = "vllm", moe_routing: str = "balanced",
                  all_reduce: str = "nccl", host_overhead_s: float | None = None,
                  shared_experts_overlap: str | int = 256, qk_norm_kernels: str = "separate",
                  host_per_sequence_s: float = 0.0, mla_kernels: str = "composed",
                  dp_prefill_gather: str = "all_gather") -> dict:
    """The scenario's step_time mapping: operator-table composition (the layout is the scenario's `parallel`);
    `mixed` says how a chunked iteration (decodes + prefill chunks) is costed, `moe_kernels` whose measured
    fused-MoE kernels MoE layers use (vllm, sglang, trtllm) or `composed` from GEMMs, `moe_routing` which
    measured routing of them (balanced, power_law_1.2), `all_reduce` whose all-reduce times tensor
    parallelism (nccl, vllm, sglang, trtllm), `shared_experts_overlap` when shared experts run beside the routed
    ones (off, decode, or a token count), `qk_norm_kernels` whether q / k norms are kernels of their own,
    `host_per_sequence_s` the host time per sequence of every pass (set only when above 0), `mla_kernels` whose
    measured MLA attention kernels MLA models use (sglang, trtllm) or `composed` (set only when not composed),
    `dp_prefill_gather` how attention-DP ranks gather tokens for the experts in passes with a prefill (set only when
    not all_gather)."""
    model = {"kind": "ops", "mixed": mixed, "moe_kernels": moe_kernels, "moe_routing": moe_routing,
             "all_reduce": all_reduce, "shared_experts_overlap": shared_experts_overlap,
             "qk_norm_kernels": qk_norm_kernels}
    if host_overhead_s is not None:
        model["host_overhead_s"] = host_overhead_s
    if host_per_sequence_s > 0:
        model["host_per_sequence_s"] = host_per_sequence_s
    if mla_kernels != "composed":
        model["mla_kernels"] = mla_kernels
    if dp_prefill_gather != "all_gather":
        model["dp_prefill_gather"] = dp_prefill_gather
    return {"model": model}


def _engine_step_time(engine, backend: str, mixed: str, moe_kernels: str, moe_routing: str, all_reduce: str,
                      host_overhead_s: float | None, shared_experts_overlap, host_per_sequence_s: float = 0.0,
                      mla_kernels: str = "engine", extra: dict | None = None) -> dict:
    """step_time_for with each `engine` choice (and `own`, the row's backend) resolved from the engine's defaults;
    `extra` the model's own step_time.model fields (_model_fields)."""
    st = step_time_for(mixed, {"engine": engine.moe[0], "own": backend}.get(moe_kernels, moe_kernels),
                         engine.moe[1] if moe_routing == "engine" else moe_routing,
                         {"engine": engine.all_reduce, "own": backend}.get(all_reduce, all_reduce),
                         engine.host_overhead_s if host_overhead_s is None else host_overhead_s,
                         engine.shared_experts_overlap if shared_experts_overlap == "engine" else shared_experts_overlap,
                         engine.qk_norm_kernels, host_per_sequence_s,
                         {"engine": engine.mla_kernels, "own": _own_mla(backend)}.get(mla_kernels, mla_kernels),
                         engine.dp_prefill_gather)
    st["model"].update(extra or {})
    return st


def _model_fields(spec: ModelSpec, blackwell: bool, backend: str) -> dict:
    """step_time.model fields only some models take: the activations of MXFP4 experts (as the runs' launch recipes
    set them, sim.published.checkpoints.mxfp4_activations) and, for linear-attention layers, the row's engine's own
    measured Gated DeltaNet kernels."""
    out = {}
    if (act := mxfp4_activations(spec, blackwell)) is not None:
        out["mxfp4_activations"] = act
    if spec.profile.linear_attention is not None:
        out["linear_attention_kernels"] = backend
    return out


def _own_mla(backend: str) -> str:
    """The row's engine's own measured MLA kernels, or the composition for an engine with none (vLLM)."""
    return backend if backend in ("sglang", "trtllm") else "composed"


def frontend_latency_s(frontend, backend: str, users: float, postprocess_workers: int = 0) -> float:
    """The time added to a replay's simulated TTFT: `frontend` is `engine` (the engine's fitted (base, per user)
    ms, sim.published.engines: frontend_postprocess_ms where the launch has `postprocess_workers` and the engine
    states one, else frontend_ms), `off`, or a (base_ms, per_user_ms) pair; the time is base + per_user x users.
    Added after the simulation, not simulated as cluster.frontend_latency_s (time the users spend outside the
    engine): fitted so, it leaves TPOT as it was; simulated, it lowered TensorRT-LLM's predicted TPOT where it
    was already low (docs/fidelity.md, "The engines' front end")."""
    if frontend == "off":
        return 0.0
    engine = ENGINES[backend]
    own = engine.frontend_postprocess_ms if postprocess_workers and engine.frontend_postprocess_ms else engine.frontend_ms
    base, per_user = own if frontend == "engine" else frontend
    return (base + per_user * users) / 1e3


def build_case(row: PublishedRow, per_user: int | None = None, start: str = "cold",
               mixed: str = "one_pass", rounds: int | str | None = None, moe_kernels: str = "engine",
               moe_routing: str = "engine", all_reduce: str = "engine", engine_config: str = "engine",
               host_overhead_s: float | None = None, shared_experts_overlap: str | int = "engine",
               frontend="engine", pool_batch: str = "engine", async_scheduling: str = "engine",
               first_token: str = "engine", phases: str = "engine", seed: int = 0,
               host_per_sequence_s: float | None = None, kv_cache: str = "engine",
               prefill_batches: str = "engine", prefill_response: str = "engine", mla_kernels: str = "engine",
               frontend_users: str = "engine", attention_dp_routing: str = "engine",
               attention_dp_pools: str = "both", client: str = "auto", handshake: str = "engine") -> Case:
    """Translate one published row into a closed-loop scenario for one replica, or say why not. `engine` means the
    row's engine's default (sim.published.engines) for each of: `moe_kernels` (or `own`: the row's engine's kernels,
    vllm / sglang / trtllm, composed), `moe_routing` (balanced, power_law_1.2), `all_reduce` (`own`, nccl, vllm,
    sglang, trtllm), `engine_config` (`defaults`: launch defaults, `aic_benchmark`: aic_benchmark_limits),
    `shared_experts_overlap` (off, decode, a token count), `frontend` (frontend_latency_s), `async_scheduling` (on,
    off); disaggregated rows: `pool_batch` (sim.published.disagg.POOL_BATCH; `engine`:
    EngineDefaults.disagg_pool_batch),
    `first_token` (disaggregation.first_token; `engine`: EngineDefaults.disagg_first_token), `frontend_users` (whose
    users the front end's per-user term counts, sim.published.disagg.FRONTEND_USERS; `engine`:
    EngineDefaults.disagg_frontend_users), `prefill_response`
    (sim.published.disagg.PREFILL_RESPONSE; `engine`: EngineDefaults.disagg_prefill_response); `phases`: the steady
    state's user phases (Case.phases; `engine`: EngineDefaults.steady_phases on agg rows, disagg_steady_phases on
    disaggregated ones); `seed`: the scenario seed (what is drawn: random phases); `host_per_sequence_s`: the host time
    per sequence of every pass (None: the engine's for the row's version, EngineDefaults.host_per_sequence_s);
    `mla_kernels` (`own`, composed, sglang, trtllm; EngineDefaults.mla_kernels);
    `kv_cache`: which rows' KV cache is FP8 (KV_CACHE; `engine`: EngineDefaults.kv_cache); `prefill_batches`: whether a
    chunked scheduler mixes decodes with prefill chunks (PREFILL_BATCHES; `engine`: EngineDefaults.prefill_batches);
    `rounds`: the replayed benchmark's requests per user under `start` cold (benchmark_rounds; None: the mode's
    default); `attention_dp_routing`: how attention-DP ranks get their requests (parallel.attention_dp_routing;
    `engine`: EngineDefaults.attention_dp_routing on agg rows, disagg_attention_dp_routing on disaggregated ones) and
    `attention_dp_pools` which pools of a disaggregated row it applies to (sim.published.routing.DP_ROUTED_POOLS);
    `client`: the benchmark client the row is replayed as (sim.published.client: `sa_bench`, `fixed`, or `auto`, the
    mode's default); `handshake`: a disaggregated row's decode pre-allocation (sim.published.handshake.HANDSHAKES;
    `engine`: EngineDefaults.disagg_handshake)."""
    client = client_for(row.mode, client)
    if phases not in ("engine", *PHASES):
        raise ConfigError(f"phases: expected one of engine, {', '.join(PHASES)}, got {phases!r}")
    if phases == "engine":
        engine = ENGINES[row.backend]
        phases = engine.disagg_steady_phases if row.mode == "disagg" else engine.steady_phases
    case = _build_case(row, per_user, start, mixed, rounds, moe_kernels, moe_routing, all_reduce, engine_config,
                       host_overhead_s, shared_experts_overlap, frontend, pool_batch, async_scheduling, first_token,
                       host_per_sequence_s, kv_cache, prefill_batches, prefill_response, mla_kernels, frontend_users)
    routed = routed_scenario(case.scenario, row, attention_dp_routing, attention_dp_pools)
    routed = handshake_scenario(routed, row, handshake, ENGINES[row.backend].disagg_handshake)
    case = case if routed is case.scenario else replace(case, scenario=routed)
    if phases != "even" or seed != 0:
        case = replace(case, phases=phases, scenario=None if case.scenario is None else dict(case.scenario, seed=seed))
    return as_sa_bench(case) if client == "sa_bench" else case


def _check_choices(**given: str) -> None:
    """Each named choice of build_case among its allowed values (ENGINE_CONFIGS, ASYNC_SCHEDULING, PREFILL_BATCHES)."""
    allowed = {"engine_config": ENGINE_CONFIGS, "async_scheduling": ASYNC_SCHEDULING, "prefill_batches": PREFILL_BATCHES}
    for name, value in given.items():
        if value not in allowed[name]:
            raise ConfigError(f"{name}: expected one of {', '.join(allowed[name])}, got {value!r}")


def _card_and_model(row: PublishedRow) -> tuple[str | None, str | None, str | None]:
    """The row's card tables and model profile, or (None, None, why there are none)."""
    hardware, model = SYSTEMS.get(row.system), model_for(row.model_path)
    if hardware is None:
        return None, None, f"no operator tables for card {row.system!r} (have: {', '.join(SYSTEMS)})"
    if model is None:
        return None, None, f"no model profile for {row.model_path!r}"
    return hardware, model, None


def _build_case(row: PublishedRow, per_user, start: str, mixed: str, rounds, moe_kernels: str, moe_routing: str,
                all_reduce: str, engine_config: str, host_overhead_s, shared_experts_overlap, frontend, pool_batch: str,
                async_scheduling: str, first_token: str, host_per_sequence_s: float | None = None,
                kv_cache="engine", prefill_batches="engine", prefill_response="engine", mla_kernels="engine",
                frontend_users="engine") -> Case:
    """build_case's row with even phases and seed 0."""
    _check_choices(engine_config=engine_config, async_scheduling=async_scheduling, prefill_batches=prefill_batches)
    if row.mode == "disagg":  # two pools, each built as one replica is here (sim.published.disagg)
        return _disagg_case(row, per_user, start, rounds, frontend, pool_batch,
                            (first_token, prefill_response, frontend_users), dict(
            mixed=mixed, moe_kernels=moe_kernels, moe_routing=moe_routing, all_reduce=all_reduce, mla_kernels=mla_kernels,
            host_overhead_s=host_overhead_s, shared_experts_overlap=shared_experts_overlap,
            async_scheduling=async_scheduling, host_per_sequence_s=host_per_sequence_s, kv_cache=kv_cache,
            # a prefill pool runs no decodes and a decode pool no prompts: nothing to keep apart unless asked
            prefill_batches="mixed" if prefill_batches == "engine" else prefill_batches,
            # pools keep the launch defaults unless asked: the choice was made on agg rows only
            engine_config="defaults" if engine_config == "engine" else engine_config))
    kv_format = kv_format_for(kv_cache, row)
    if why := _unsupported_layout(row):
        return Case(row, skipped=why)
    hardware, model, why = _card_and_model(row)
    if why:
        return Case(row, skipped=why)
    spec = ModelSpec(load_model(model))
    dp = max(row.attention_dp, 1)
    layout = Layout(tp=row.tp, pp=row.pp, ep=row.moe_ep, attention_dp=dp)
    problems = layout_problems(spec, layout)
    if problems:
        return Case(row, skipped="; ".join(problems))
    engine = ENGINES[row.backend]
    if why := _collectives_missing(hardware, layout, {"engine": engine.all_reduce, "own": row.backend}.get(
            all_reduce, all_reduce)):
        return Case(row, skipped=why)
    fmt = PRECISIONS.get(row.precision)
    if fmt is None:
        return Case(row, skipped=f"precision {row.precision!r}: no operator tables (have bf16, fp8, fp4)")
    fmt, spec = checkpoint_formats(model, fmt, spec)
    blackwell = find_table(load_table_set(hardware).folder, "gemm_nvfp4") is not None
    if "nvfp4" in (fmt, spec.expert_format) and not blackwell:
        return Case(row, skipped=f"precision 'fp4': the {hardware} tables have no NVFP4 GEMMs (Blackwell cards only)")
    config = launch_config(row, engine.config) if engine_config == "engine" else engine_config
    # each rank's batch: the users over the ranks, rounded up (a stated concurrency need not divide evenly)
    limits = aic_benchmark_limits(engine, -(-row.concurrency // dp), row.isl) if config == "aic_benchmark" else None
    launch = launch_scheduler(row)  # what the row's launch script adds (sim.published.launches)
    hw = load_hardware(hardware)
    weights = weights_per_gpu(spec, layout, fmt).total
    budget = kv_budget_bytes(engine, hw.reported_memory_bytes, weights, layout.gpus)
    block_tokens = 16
    need = (math.ceil((row.isl + row.osl) / block_tokens) * block_tokens
            * kv_bytes_per_token_per_gpu(spec, layout, kv_format) * layout.rank_gpus)
    if budget < need:
        return Case(row, skipped=f"weights ({weights / 1e9:.1f} GB per GPU over {layout.gpus} x {hw.name}) leave "
                                 f"{max(budget, 0) / 1e9:.1f} GB of KV, less than one request needs")
    users = row.concurrency
    scenario = {
        "name": row.id, "seed": 0, "model": model, "hardware": hardware, "weight_format": fmt,
        **({"expert_weight_format": spec.expert_format} if spec.expert_format else {}),
        **({"attention_weight_format": spec.attention_format} if spec.attention_format else {}),
        "kv": {"block_tokens": block_tokens, "format": kv_format, "budget": budget, "admission": engine.kv_admission},
        "scheduler": _scheduler(engine, dp, limits[0] if limits else None, async_scheduling, prefill_batches) | launch,
        "step_time": _engine_step_time(engine, row.backend, mixed, moe_kernels, moe_routing, all_reduce,
                                       host_overhead_s, shared_experts_overlap,
                                       engine.host_per_sequence_s(row.backend_version) if host_per_sequence_s is None
                                       else host_per_sequence_s, mla_kernels,
                                       _model_fields(spec, blackwell, row.backend)),
        "parallel": {"tp": row.tp, "pp": row.pp, "ep": row.moe_ep, **({"attention_dp": dp} if dp > 1 else {})},
        "workload": {"kind": "closed_loop", "users": users,
                     "num_requests": users * (per_user or requests_per_user(row.osl)),
                     "prompt_tokens": {"kind": "fixed", "value": row.isl},
                     "output_tokens": {"kind": "fixed", "value": row.osl}},
    }
    if dp > 1:
        # the routed experts see every rank's tokens, up to dp x the token budget: past the fused-MoE tables' 16,384
        # tokens every expert is busy and time grows with the tokens; the model extrapolates so (and warns)
        scenario["step_time"]["allow_extrapolation"] = True
    graphs = limits[1] if limits else engine.graph_sizes
    if graphs:  # per rank: dp evenly loaded ranks pad together to dp x each size
        scenario["step_time"]["graph_sizes"] = [g * dp for g in graphs]
    return Case(row, scenario=scenario, start=start, rounds=benchmark_rounds(rounds, "agg", users),
                frontend_s=frontend_latency_s(frontend, row.backend, users, postprocess_workers(row)))


def _disagg_case(row: PublishedRow, per_user, start: str, rounds, frontend, pool_batch: str,
                 client: tuple[str, str, str], pool_options: dict) -> Case:
    """A disaggregated row's case: its pools built by build_case with `pool_options`, each worker's batch by
    `pool_batch`, the client's first token by `client` (first_token, prefill_response, frontend_users), and the
    engine's front end as on agg rows (chosen on the even disaggregated lines over none: docs/fidelity.md, "The
    engines' front end"), its per-user term counting the users of one decode worker, the serving process that
    streams their tokens (an agg row's one process serves them all), or none (FRONTEND_USERS;
    docs/disaggregation.md, "The front end's users")."""
    if pool_batch not in ("engine", *POOL_BATCH):
        raise ConfigError(f"pool_batch: expected one of engine, {', '.join(POOL_BATCH)}, got {pool_batch!r}")
    first_token, response, users = client
    for name, value, allowed in (("first_token", first_token, FIRST_TOKEN), ("prefill_response", response,
                                 PREFILL_RESPONSE), ("frontend_users", users, FRONTEND_USERS)):
        if value not in ("engine", *allowed):
            raise ConfigError(f"{name}: expected one of engine, {', '.join(allowed)}, got {value!r}")
    engine = ENGINES[row.backend]
    users = engine.disagg_frontend_users if users == "engine" else users
    case = build_disagg_case(row, per_user, start, partial(build_case, **pool_options), Case,
                             engine.disagg_pool_batch if pool_batch == "engine" else pool_batch,
                             engine.disagg_first_token if first_token == "engine" else first_token,
                             (engine.disagg_prefill_response if response == "engine" else response) == "wait",
                             engine.disagg_ep_communication, engine.disagg_all_to_all)
    hops = engine.disagg_frontend_hops
    return replace(case, rounds=benchmark_rounds(rounds, "disagg", row.concurrency), frontend_hops=hops,
                   frontend_s=0.0 if case.scenario is None else hops * frontend_latency_s(
                       frontend, row.backend, row.concurrency / row.decode.workers if users == "decode_worker" else 0))


def request_lifetime_s(sim, isl: int, osl: int, users: int) -> float:
    """Rough time one request spends in the engine at this concurrency: its prefill alone plus `osl`
    decode steps of `users` sequences at the mean context (for spreading the users' start times)."""
    from sim.core.request import Request
    from sim.core.step import StepPlan
    pre = StepPlan()
    pre.add(Request(-1, 0.0, isl, osl, 0.0), isl)
    dec = StepPlan()
    dec.add_decodes(users, users * (isl + osl // 2), isl + osl)
    return sim.step_time.step_s(pre) + osl * sim.step_time.step_s(dec)


def _with_ramp(scenario: dict, ramp_s: float, num_requests: int | None = None, phases: str = "even") -> dict:
    out = dict(scenario)
    out["workload"] = dict(scenario["workload"], ramp_up_s=ramp_s)
    if phases != "even":
        out["workload"]["ramp_phases"] = phases
    if num_requests is not None:
        out["workload"]["num_requests"] = num_requests
    return out


class _Unfinished(Exception):
    """The simulated engine left some request unfinished (the reason is the message)."""


def _run(scenario: dict, source: str):
    from sim.core.simulation import Simulation
    from sim.io.config import Scenario
    from sim.io.schema import validate_mapping
    return Simulation(validate_mapping(Scenario, scenario, source), Path(".")).run()


def _means(res, first_id: int) -> dict:
    """Mean TTFT and TPOT (ms) of the requests with id >= first_id, and their mean end-to-end time (s)."""
    req = res.requests
    if res.summary["completed"] < res.summary["requests"]:
        reasons = sorted(set(req.loc[req["status"] != "finished", "status"]))
        raise _Unfinished(f"simulated engine did not finish every request ({', '.join(reasons)})")
    counted = req[req["id"] >= first_id]
    return {"ttft_ms": float(counted["ttft_s"].mean()) * 1e3, "tpot_ms": float(counted["tpot_s"].mean()) * 1e3,
            "e2e_s": float(counted["e2e_s"].mean()), "throughput_tok_s": res.summary["output_throughput_tok_s"]}


def steady_state(case: Case, source: str) -> dict:
    """The closed loop's steady state: the users' first requests spread evenly over one request lifetime
    (their phases uniform), the first wave not counted. The lifetime is made self-consistent: a short
    run (two requests per user) spread over the step-time estimate measures the real one (prefill chunks
    slow the decodes they share iterations with), and the counted run is spread over that (again, if it
    moved by more than 5%). Spread over too short a time, the users bunch, and with fixed lengths a
    bunch comes back as a bunch forever."""
    from sim.core.simulation import Simulation
    from sim.io.config import Scenario
    from sim.io.schema import validate_mapping
    users = case.row.concurrency
    sim = Simulation(validate_mapping(Scenario, case.scenario, source), Path("."))
    ramp = request_lifetime_s(sim, case.row.isl, case.row.osl, users)
    ramp = _means(_run(_with_ramp(case.scenario, ramp, 2 * users, case.phases), source), users)["e2e_s"]
    out = _means(_run(_with_ramp(case.scenario, ramp, phases=case.phases), source), users)
    if abs(out["e2e_s"] / ramp - 1) > 0.05:
        ramp = out["e2e_s"]
        out = _means(_run(_with_ramp(case.scenario, ramp, phases=case.phases), source), users)
    return dict(out, lifetime_s=ramp)


def first_wave(case: Case, source: str) -> dict:
    """The benchmark's first wave: every user's first request at once on an idle engine."""
    scenario = dict(case.scenario, workload=dict(case.scenario["workload"], num_requests=case.row.concurrency))
    return _means(_run(scenario, source), 0)


def combine_cold(first: dict, steady: dict, rounds: float, later_waves: str) -> dict:
    """Mean TTFT and TPOT over a benchmark of `rounds` requests per user that starts cold: the first wave is
    a burst; the later waves are the steady state (`spread`: the engine breaks the cohort up) or repeat the
    first wave (`cohort`: the users come back together and are served together, wave after wave)."""
    if later_waves == "cohort":
        return {m: first[m] for m in ("ttft_ms", "tpot_ms")}
    return {m: (first[m] + (rounds - 1) * steady[m]) / rounds for m in ("ttft_ms", "tpot_ms")}


def simulate_case(_shared, case: Case) -> dict:
    """Run one case (on a worker); a scenario the simulator refuses becomes a skip with its reason.

    Cold start (the default): the benchmark a row reports, N = `case.rounds` requests per user, the first
    wave sent at once to an idle engine (as `vllm bench serve --max-concurrency`, genai-perf and aiperf
    start), the mean over all N waves: `(first wave + (N - 1) x steady state) / N` where the engine breaks a
    cohort up (`later_waves: spread`), the first wave's where it keeps it (`cohort`, sim.published.engines).
    `out["components"]` keeps both parts. Staggered: the steady state alone. Burst: everyone starts at once,
    every request counts, the simulator's own (lock-step) dynamics."""
    from sim.published.engines import ENGINES
    out = {"id": case.row.id}
    if case.scenario is None:
        out["skipped"] = case.skipped
        return out
    source = f"row {case.row.id} (line {case.row.line})"
    try:
        if case.start == "burst":
            res = _means(_run(case.scenario, source), 0)
        elif case.start == "staggered":
            res = steady_state(case, source)
        else:
            first, steady = first_wave(case, source), steady_state(case, source)
            engine = ENGINES[case.row.backend]
            later = engine.disagg_later_waves if case.row.mode == "disagg" else launch_waves(case.row, engine.later_waves)
            res = dict(steady, **combine_cold(first, steady, case.rounds, later))
            out["components"] = {"first_wave": {m: first[m] for m in ("ttft_ms", "tpot_ms")},
                                 "steady": {m: steady[m] for m in ("ttft_ms", "tpot_ms")}}
    except ConfigError as exc:
        out["skipped"] = "; ".join(exc.lines)
        return out
    except _Unfinished as exc:
        out["skipped"] = str(exc)
        return out
    out.update({m: res[m] for m in ("ttft_ms", "tpot_ms", "throughput_tok_s")})
    if case.frontend_s > 0:  # the front end's fitted time (frontend_latency_s), outside the simulated engine
        out["ttft_ms"] += case.frontend_s * 1e3
        out["frontend_ms"] = case.frontend_s * 1e3
        if case.frontend_hops > 1:
            out["frontend_hops"] = case.frontend_hops
    return out


def error_summary(records: list[dict]) -> list[dict]:
    """Per (system, backend, mode, metric): rows, median and p90 of |predicted - measured| / measured, over
    the measured metrics and the derived ones (a record's `derived`: e2e_ms)."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        if "predicted" not in r:
            continue
        pairs = [(m, r["predicted"][m], r["measured"][m]) for m in r["predicted"]]
        pairs += [(m, d["predicted"], d["measured"]) for m, d in r.get("derived", {}).items()]
        for metric, predicted, measured in pairs:
            groups.setdefault((r["system"], r["backend"], r["mode"], metric), []).append(
                abs(predicted - measured) / measured)
    out = []
    for (system, backend, mode, metric), errs in sorted(groups.items()):
        e = np.asarray(errs)
        out.append({"system": system, "backend": backend, "mode": mode, "metric": metric, "n": int(len(e)),
                    "median_abs_error": float(np.median(e)), "p90_abs_error": float(np.percentile(e, 90))})
    return out
