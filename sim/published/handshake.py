"""How a replayed disaggregated row's decode server takes a request before its prefill may start, and how often
its engines take new requests at all (disaggregation.decode_preallocation, scheduler.recv_interval).

SGLang's disaggregation starts a request on both servers at once, but its prefill server keeps it in a bootstrap
queue until the decode server has pre-allocated its KV slots and sent their indices
(sglang/srt/disaggregation/prefill.py PrefillBootstrapQueue.pop_bootstrapped; decode.py
DecodePreallocQueue.pop_preallocated, run in each pass of the decode server's loop after it has received new
requests). So the prefill waits for a pass of the decode server's loop that takes new requests: the next one at the
default `--scheduler-recv-interval 1`, up to N decode iterations later with N, where a decode iteration counts 1 and
any other 1000 (sglang/srt/managers/scheduler_recv_skipper.py). TensorRT-LLM's and vLLM's paths send the request to
the prefill side first and to the decode side with its answer: nothing to wait for.

Which interval a row ran is its recipe's, not a column of the file: RECIPE_RECV_INTERVAL.
"""

from __future__ import annotations

from sim.io.errors import ConfigError

HANDSHAKES = ("none", "preallocate", "recipes")
"""build_case's `handshake` (besides `engine`, EngineDefaults.disagg_handshake), for disaggregated rows: `none`, the
prefill starts when the request arrives and every pass takes new requests; `preallocate`, the prefill waits for the
decode replica to take the request (disaggregation.decode_preallocation), every pass taking new requests;
`recipes`, as `preallocate`, each server's engine loop taking new requests every RECIPE_RECV_INTERVAL passes where
the row's recipe family sets it."""

RECIPE_RECV_INTERVAL = {("sglang", "gb200", "fp4"): (10, 10), ("sglang", "gb200", "fp8"): (10, 10),
                        ("sglang", "gb300", "fp4"): (10, 10), ("sglang", "gb300", "fp8"): (10, 1)}
"""--scheduler-recv-interval (prefill server, decode server) of the recipes the silicon sample's disaggregated rows
ran, by (engine, card, precision), for rows whose pools both run without attention data parallelism. The rows'
provenance names InferenceX's runs of srt-slurm recipes (docs/disaggregation.md "The rows' client"). In the branch
those runs cloned (ishandhanani/srt-slurm sa-submission-q1-2026) every GB200 and GB300 SGLang recipe of ISL 1,024 or
8,192 whose workers all run without attention DP (the low-latency ones) sets it: 10 on both servers
(recipes/gb200-fp4/1k1k/low-latency.yaml, gb200-fp4/8k1k/low-latency.yaml, gb200-fp8/1k1k/low-latency.yaml,
gb300-fp4/1k1k/low_latency.yaml, gb300-fp4/8k1k/low_latency.yaml), except GB300 FP8's, 10 on the prefill server and 1
on the decode server (gb300-fp8/1k1k/stp/low-latency.yaml, gb300-fp8/8k1k/stp/low-latency.yaml: "save mem"). No
worker with attention DP sets it (SGLang 0.5.x refuses it there: its recv skipper asserts `not
enable_dp_attention`), no recipe of a TP prefill beside an attention-DP decode does, and no B200 disaggregated recipe
does. Every replayed row of these cards without attention DP matches one of those recipes by layout and concurrency.
One recipe sets it on one side only (gb200-fp8/8k1k.yaml's low-latency variants: an attention-DP prefill, 10 on a TP8
decode); no replayed row has that layout. Read, not fitted."""


def recipe_recv_interval(row) -> tuple[int, int]:
    """The (prefill, decode) servers' receive interval of `row`'s recipe family ((1, 1) where none is set)."""
    if any(shape is None or shape.attention_dp > 1 for shape in (row.prefill, row.decode)):
        return 1, 1
    return RECIPE_RECV_INTERVAL.get((row.backend, row.system, row.precision), (1, 1))


def handshake_scenario(scenario: dict | None, row, handshake: str, default: str) -> dict | None:
    """`scenario` (a replayed row's; None for a skipped row) with `handshake` (HANDSHAKES; `engine`: `default`, the
    row's engine's) applied to a disaggregated row; the same object back when nothing changes (an agg row, `none`)."""
    if handshake not in ("engine", *HANDSHAKES):
        raise ConfigError(f"handshake: expected one of engine, {', '.join(HANDSHAKES)}, got {handshake!r}")
    handshake = default if handshake == "engine" else handshake
    if scenario is None or "disaggregation" not in scenario or handshake == "none":
        return scenario
    d = dict(scenario["disaggregation"], decode_preallocation=True)
    for name, every in zip(("prefill", "decode"), recipe_recv_interval(row) if handshake == "recipes" else (1, 1)):
        if every > 1:
            d[name] = dict(d[name], scheduler=dict(d[name]["scheduler"], recv_interval=every))
    return dict(scenario, disaggregation=d)
