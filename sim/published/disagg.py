"""Disaggregated rows of the silicon-sample schema: their two pools, read from the prefill_* and
decode_* columns, and their replay as a disaggregated scenario (sim.core.pools).

A disaggregated row's client concurrency is not in batch_size (empty for these rows) but in
silicon_data_source ("...; silicon_concurrency=6; ..."). Each pool is built as the aggregated replay
builds one replica (the engine's defaults, the pool's layout, its KV budget by the engine's memory
rule, its scheduler's limits for its own attention-DP ranks): `build_case` of a one-pool copy of the row, so
that both replays share every assumption.
The KV link is the card's (hardware profile kv_transfer_link); a row that leaves the pools' worker
counts or the concurrency empty is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from sim.io.errors import ConfigError

_CONCURRENCY = re.compile(r"(?:^|;)\s*silicon_concurrency=([^;]*)")


@dataclass(frozen=True)
class PoolShape:
    """One pool of a disaggregated row: workers (replicas) and each worker's parallel sizes; None
    where the file leaves a column empty."""

    workers: int | None
    tp: int | None
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    batch: int | None = None
    """The pool's batch size column (a worker's most running requests per attention-DP rank), None if empty."""


def pool_shape(row: dict, prefix: str, where: str, integer_field, text) -> PoolShape:
    """The `prefix`_* columns (prefill_ or decode_) of a record; 0 in the *_dp / moe_* columns means
    "not used" (as in the agg columns), empty workers or tp stay None (the file never writes 0 for them: a 0 is an
    error, as an agg row's tp_size of 0 is)."""
    get = lambda col, default, minimum: integer_field(where, prefix + col, text(row, prefix + col),  # noqa: E731
                                                      default, minimum)
    workers = get("num_workers", 0, 1) or None
    tp = get("tp_size", 0, 1) or None
    return PoolShape(workers, tp, max(get("pp_size", 1, 0), 1), max(get("attention_dp_size", 1, 0), 1),
                     max(get("moe_tp_size", 1, 0), 1), max(get("moe_ep_size", 1, 0), 1),
                     get("batch_size", 0, 0) or None)


def concurrency_from_source(source: str, where: str) -> int:
    """silicon_concurrency=N in a silicon_data_source text (0 when absent)."""
    m = _CONCURRENCY.search(source or "")
    if m is None:
        return 0
    raw = m.group(1).strip()
    whole = re.fullmatch(r"(\d+)(?:\.0*)?", raw)   # the file writes its counts as 8 or 8.0
    if whole is None or int(whole.group(1)) < 1:
        raise ConfigError(f"{where}, column silicon_data_source: silicon_concurrency={raw!r}; expected an integer >= 1")
    return int(whole.group(1))


PREFILL_RESPONSE = ("at_once", "wait")
"""Whether a disaggregated row's client stream waits for the prefill server's answer
(EngineDefaults.disagg_prefill_response)."""

FRONTEND_USERS = ("decode_worker", "none")
"""Whose users a disaggregated row's front-end time counts in its per-user term (EngineDefaults.disagg_frontend_users):
`decode_worker`, the users of one decode worker (concurrency / decode_num_workers); `none`, no per-user term, the
front end's base time alone."""

POOL_BATCH = ("stated", "defaults", "decode")
"""How many requests a pool's worker runs at once: `stated`, the row's prefill_batch_size / decode_batch_size per
attention-DP rank (the engine's other limits kept); `defaults`, the engine's launch default; `decode`, the stated
decode_batch_size on the decode pool and the engine's launch default on the prefill pool."""


def build_disagg_case(row, per_user, start, build_case, case_cls, pool_batch: str = "defaults",
                      first_token: str = "prefill", wait_for_prefill_response: bool = False,
                      ep_communication: str = "all_reduce", all_to_all: str = "auto"):
    """A disaggregated row as a closed loop of its concurrency against two pools, or why not (`pool_batch`: one of
    POOL_BATCH; `first_token`: disaggregation.first_token; `wait_for_prefill_response`: its namesake there;
    `ep_communication`: parallel.ep_communication of a pool with attention data parallelism and expert parallelism;
    `all_to_all`: step_time.model.all_to_all, or `recipes`, RECIPE_ALL_TO_ALL by the row's precision)."""
    if row.concurrency < 1:
        return case_cls(row, skipped="disaggregated row without a client concurrency (silicon_concurrency)")
    pools = {}
    for name, shape in (("prefill", row.prefill), ("decode", row.decode)):
        if shape is None or shape.workers is None or shape.tp is None:
            return case_cls(row, skipped=f"{name} pool: worker count or tp not stated")
        # (source: the agg launches read in sim.published.launches are single-node scripts, not these pools')
        one = dataclasses.replace(row, mode="agg", source="", tp=shape.tp, pp=shape.pp, attention_dp=shape.attention_dp,
                                  moe_tp=shape.moe_tp, moe_ep=shape.moe_ep)
        case = build_case(one, per_user, start)
        if case.scenario is None:
            return case_cls(row, skipped=f"{name} pool: {case.skipped}")
        sc = case.scenario  # the agg replay's attention-DP balance was read in single-node launch scripts only
        sc = dict(sc, scheduler={k: v for k, v in sc["scheduler"].items() if k != "attention_dp_balance_iters"})
        if shape.batch and (pool_batch == "stated" or pool_batch == name == "decode"):
            sc = dict(sc, scheduler=dict(sc["scheduler"], max_num_seqs=shape.batch * shape.attention_dp))
        pools[name] = (shape, sc)
    from sim.io.profiles import load_hardware
    scenario = dict(pools["decode"][1], name=row.id)
    st = scenario["step_time"]  # the layout is each pool's `parallel`, not the ops model's tp
    scenario["step_time"] = {**st, "model": {k: v for k, v in st["model"].items() if k != "tp"}}
    if all_to_all == "recipes":
        all_to_all = RECIPE_ALL_TO_ALL.get(row.precision, "auto")
    if all_to_all != "auto":
        scenario["step_time"]["model"]["all_to_all"] = all_to_all
    if any(sc["step_time"].get("allow_extrapolation") for _, sc in pools.values()):
        scenario["step_time"]["allow_extrapolation"] = True  # one step-time model serves both pools
    hw = load_hardware(scenario["hardware"])
    if hw.kv_transfer_link is None or hw.kv_transfer_link.bandwidth_gbs_per_direction.value is None:
        return case_cls(row, skipped=f"{hw.name}: no kv_transfer_link in its profile to send KV between the pools")
    scenario["disaggregation"] = {
        name: {"replicas": shape.workers, "kv_budget": sc["kv"]["budget"], "scheduler": sc["scheduler"],
               "parallel": _pool_parallel(sc, shape, name, row.precision, ep_communication)}
        for name, (shape, sc) in pools.items()}
    scenario["disaggregation"]["first_token"] = first_token
    if wait_for_prefill_response:
        scenario["disaggregation"]["wait_for_prefill_response"] = True
    return case_cls(row, scenario=scenario, start=start)


RECIPE_EP_COMMUNICATION = {("fp8", "prefill"): "all_to_all", ("fp8", "decode"): "all_to_all",
                           ("fp4", "prefill"): "all_reduce", ("fp4", "decode"): "all_to_all"}
"""parallel.ep_communication of an SGLang pool with attention DP and ep > 1 as its recipes set it, by (precision,
pool): every FP8 such worker of the GB200 / GB300 recipes sets `moe-a2a-backend: deepep`, as does every FP4 decode
worker; the FP4 prefill workers leave it out (SGLang's default, none: FlashInfer's MoE runners over gathered tokens).
Read in ishandhanani/srt-slurm and NVIDIA/srt-slurm (92 recipes; EngineDefaults.disagg_ep_communication)."""


RECIPE_ALL_TO_ALL = {"fp4": "nvlink_one_sided", "fp8": "nvlink_two_sided"}
"""step_time.model.all_to_all of a TensorRT-LLM disaggregated row by precision, as its recipes run the attention-DP
workers' experts (EngineDefaults.disagg_all_to_all): NVLinkOneSided, the default of the CUTLASS, CuteDSL and TRTLLM MoE
backends of the FP4 recipes; NVLinkTwoSided, which the FP8 recipes force on their DeepGEMM decode workers
(TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED in SemiAnalysisAI/InferenceX benchmarks/multi_node/srt-slurm-recipes/dsr1/
trtllm/gb200-fp8/...)."""


def _pool_parallel(sc: dict, shape: PoolShape, pool: str, precision: str, ep_communication: str) -> dict:
    """A pool's `parallel`: its case's, with `ep_communication` (or the recipes') where its attention-DP ranks
    spread the experts."""
    out = dict(sc.get("parallel", {"tp": shape.tp, "pp": shape.pp, "ep": shape.moe_ep}))
    if ep_communication == "recipes":
        ep_communication = RECIPE_EP_COMMUNICATION.get((precision, pool), "all_reduce")
    if out.get("attention_dp", 1) > 1 and out.get("ep", 1) > 1 and ep_communication != "all_reduce":
        out["ep_communication"] = ep_communication
    return out
