"""The benchmark client a published row is replayed as.

The disaggregated rows of the silicon sample come from InferenceX's results database (silicon_data_source
`db-dump/...; config_id=...; workflow_run_id=...`, the natural key of InferenceX's benchmark table). Its multinode jobs
ran srt-slurm's SA-Bench (ishandhanani/srt-slurm branch `sa-submission-q1-2026`, NVIDIA/srt-slurm
`sa-submission-q2-2026`, cloned by InferenceX's `runners/launch_gb200-nv.sh`; recipes `benchmark: type: sa-bench`,
`req_rate: inf`):

- a warm-up of 2 x concurrency requests in a separate process, then one test request alone, then the measured run:
  10 x concurrency requests, `--max-concurrency` users, `--request-rate inf` (every user's first request at once on an
  idle engine), `--ignore-eos`;
- `--random-range-ratio 0.8`: each prompt's and each output's length drawn uniformly from [int(0.8 x L), L]
  (`np.random.randint(int(L * ratio), L + 1)` in its benchmark_serving.py), L the row's isl and osl;
- TTFT and TPOT the means over every measured request;
- behind Dynamo's front end (`frontend: type: dynamo` in the SGLang and vLLM recipes; Dynamo's runtime images for
  TensorRT-LLM), whose `--router-mode` defaults to round-robin: each pool's workers take requests in turn.

`sa_bench` replays exactly that: `start` burst (every user at once, every request counted), 10 requests per user,
uniform lengths, round-robin routing. `fixed` is the replay as it was before the client was known: fixed lengths, the
cold first wave recombined with the steady state over `rounds` (sim.published.predict.simulate_case), the simulator's
default least-outstanding routing. docs/disaggregation.md, "The rows' client, read from their provenance".
"""

from __future__ import annotations

from dataclasses import replace

from sim.io.errors import ConfigError

CLIENTS = ("sa_bench", "fixed")
"""Benchmark clients a row can be replayed as (`auto`: DEFAULT_CLIENT by the row's mode)."""

DEFAULT_CLIENT = {"disagg": "sa_bench", "agg": "fixed"}
"""The client each mode's rows are replayed as under `auto`. Disaggregated rows: `sa_bench`, read from their provenance
(above). Aggregated rows keep `fixed`, though 1,053 of the 1,656 on several GPUs scored on 2026-12-07 are InferenceX
runs, whose client is SA-Bench's too (the other 603 are NVIDIA's gap-analysis runs). Replayed as SA-Bench they read
worse on every engine (vLLM 13.6% -> 17.5%, SGLang 29.5% -> 75.5% median |TTFT error|), with front ends chosen again
as well: the simulator's closed loop spreads the users where the real runs stay crowded, and the fixed client's
regimes (later_waves, steady_phases), chosen under it, stand in for that (docs/fidelity.md, "The agg rows'
provenance, read again")."""

SA_BENCH_REQUESTS_PER_USER = 10
"""SA-Bench's measured requests per user (`num_prompts = concurrency x 10`)."""

SA_BENCH_RANGE_RATIO = 0.8
"""SA-Bench's `--random-range-ratio`: lengths uniform on [int(0.8 x L), L]."""


def client_for(mode: str, client: str) -> str:
    """The client a row of `mode` is replayed as: `client`, or under `auto` the mode's default."""
    if client == "auto":
        return DEFAULT_CLIENT[mode]
    if client not in CLIENTS:
        raise ConfigError(f"client: expected one of auto, {', '.join(CLIENTS)}, got {client!r}")
    return client


def sa_bench_lengths(tokens: int) -> dict:
    """SA-Bench's length distribution for a nominal length: uniform on [int(ratio x L), L] (fixed for L = 1)."""
    low = max(int(tokens * SA_BENCH_RANGE_RATIO), 1)
    return {"kind": "fixed", "value": tokens} if low == tokens else {"kind": "uniform", "low": low, "high": tokens}


def as_sa_bench(case):
    """`case` replayed as SA-Bench ran it: every user at once on an idle engine, SA_BENCH_REQUESTS_PER_USER requests
    each of uniformly drawn lengths, every request counted, requests reaching each pool's workers round-robin."""
    if case.scenario is None:
        return case
    row, sc = case.row, dict(case.scenario)
    users = sc["workload"]["users"]
    sc["workload"] = dict(sc["workload"], num_requests=users * SA_BENCH_REQUESTS_PER_USER,
                          prompt_tokens=sa_bench_lengths(row.isl), output_tokens=sa_bench_lengths(row.osl))
    sc["cluster"] = dict(sc.get("cluster") or {}, router={"kind": "round_robin"})
    return replace(case, scenario=sc, start="burst")
