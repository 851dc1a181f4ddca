"""How a replayed row's attention data-parallel ranks get their requests (parallel.attention_dp_routing,
sim.core.schedulers.ranked): each engine's choice (EngineDefaults.attention_dp_routing on agg rows,
disagg_attention_dp_routing on disaggregated ones) or one for every row, and which pools of a disaggregated row
it applies to."""

from __future__ import annotations

from sim.io.errors import ConfigError
from sim.published.engines import ENGINES

DP_ROUTINGS = ("shared_queue", "random", "round_robin", "least_loaded")
"""build_case's `attention_dp_routing` (besides `engine`): parallel.attention_dp_routing of every replica and pool of
more than one attention-DP rank."""

DP_ROUTED_POOLS = {"both": ("prefill", "decode"), "prefill": ("prefill",), "decode": ("decode",)}
"""build_case's `attention_dp_pools`: which pools of a disaggregated row attention_dp_routing applies to (the others
keep one shared queue)."""


def routed_scenario(scenario: dict | None, row, routing: str, pools: str = "both") -> dict | None:
    """`scenario` (a replayed row's; None for a skipped row) with parallel.attention_dp_routing set to `routing`
    (`engine`: the row's engine's for its mode) in every layout of more than one attention-DP rank: an agg row's
    replica, a disaggregated row's `pools` (DP_ROUTED_POOLS). The same object back when nothing changes; bad values
    are refused by name whatever the row."""
    if routing not in ("engine", *DP_ROUTINGS):
        raise ConfigError(f"attention_dp_routing: expected one of engine, {', '.join(DP_ROUTINGS)}, got {routing!r}")
    if pools not in DP_ROUTED_POOLS:
        raise ConfigError(f"attention_dp_pools: expected one of {', '.join(DP_ROUTED_POOLS)}, got {pools!r}")
    if routing == "engine":
        engine = ENGINES[row.backend]
        routing = engine.disagg_attention_dp_routing if row.mode == "disagg" else engine.attention_dp_routing
    if scenario is None or routing == "shared_queue":
        return scenario

    def routed(par: dict) -> dict:
        return dict(par, attention_dp_routing=routing) if par.get("attention_dp", 1) > 1 else par

    if "disaggregation" not in scenario:
        return dict(scenario, parallel=routed(scenario["parallel"])) if "parallel" in scenario else scenario
    d = scenario["disaggregation"]
    return dict(scenario, disaggregation={**d, **{n: dict(d[n], parallel=routed(d[n]["parallel"]))
                                                  for n in DP_ROUTED_POOLS[pools]}})
