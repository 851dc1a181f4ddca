"""capsim validate-published: replay published serving measurements and report the simulator's error."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capsim.argtypes import count
from sim.published.client import CLIENTS

CLIENT_HELP = ("the benchmark client a row is replayed as (sim.published.client): sa_bench (InferenceX's SA-Bench, "
               "the disaggregated rows' recorded client: every user at once, 10 requests each, lengths uniform on "
               "[0.8 x L, L], round-robin over each pool's workers), fixed (fixed lengths, shaped by --start, --rounds "
               "and --requests-per-user), or auto (default: sa_bench for disaggregated rows, fixed for agg rows; "
               "docs/disaggregation.md)")

PUBLISHED_FILES = ("report.json", "rows.csv", "summary.csv")


def add_parsers(sub) -> None:
    """Register `validate-published`."""
    p = sub.add_parser("validate-published",
                       help="simulate published serving runs (AIConfigurator silicon-sample schema) and report "
                            "predicted vs measured TTFT/TPOT")
    p.add_argument("file", help="CSV in the schema of aiconfigurator's silicon_sample.csv")
    p.add_argument("--backend", choices=["vllm", "sglang", "trtllm"], help="only rows of this engine")
    p.add_argument("--system", help="only rows of this card (the file's system column, e.g. h100_sxm)")
    p.add_argument("--mode", choices=["agg", "disagg"], help="only rows of this serving mode")
    p.add_argument("--json", action="store_true", help="print the report as JSON (rows and summary)")
    p.add_argument("--out", help="write report.json, rows.csv and summary.csv here")
    p.add_argument("--force", action="store_true", help="overwrite report.json, rows.csv and summary.csv in --out")
    p.add_argument("--workers", type=int, default=None,
                   help="Dask worker processes (default: one per core; 1 = in-process)")
    p.add_argument("--requests-per-user", type=int, default=None,
                   help="requests each simulated client sends (default 1 + ceil(16384 / OSL), 3 to 6; 2..1000)")
    _step_time_options(p)
    _per_engine(p, "--engine-config", ["defaults", "aic-benchmark"],
                help="how each row's engine was configured: each engine's choice (default; vLLM and TensorRT-LLM "
                     "the benchmark rules, SGLang its defaults, InferenceX's vLLM launches vLLM's defaults; "
                     "docs/fidelity.md), every engine's launch defaults, "
                     "or the limits AIConfigurator's generator writes for a benchmark deployment (max batch = the "
                     "row's batch size, token budget = batch + ISL + 1,500, CUDA graphs for every batch size)")
    p.add_argument("--frontend", default="engine", type=_frontend,
                   help="front-end time (client, HTTP, API server, tokenizer) added to every row's simulated "
                        "TTFT: each engine's, fitted on half the silicon sample (default: vLLM 25 ms + 0.4 ms per "
                        "user, SGLang 100 ms, TensorRT-LLM 90 ms + 1.5 ms per user; docs/fidelity.md), off, or "
                        "BASE_MS[+PER_USER_MS] for every row")
    p.add_argument("--client", choices=["auto", *CLIENTS], default="auto", help=CLIENT_HELP)
    p.add_argument("--start", choices=["cold", "staggered", "burst"], default="cold",
                   help="the fixed client: cold (default): the benchmark as run, --rounds requests per user, the "
                        "first wave sent at once to an idle engine, the later ones as the engine leaves them "
                        "(docs/fidelity.md); "
                        "staggered: the steady state alone (first requests spread over one request lifetime, not "
                        "counted); burst: all users start together, every request counts, lock-step")
    p.add_argument("--rounds", default=None,
                   help="--start cold: requests per user in the replayed benchmark, an integer or `dynamo` "
                        "(Dynamo's benchmark utility: max(3 x concurrency, 10) requests, no warm-up); default 10 on "
                        "agg rows (AIConfigurator's N x concurrency), dynamo on disaggregated ones under --client "
                        "fixed (docs/disaggregation.md)")
    for flag, values, text in DISAGG_AND_SCHEDULE_FLAGS:
        _per_engine(p, flag, values, help=text)
    p.add_argument("--attention-dp-pools", choices=["both", "prefill", "decode"], default="both",
                   help="disaggregated rows: which pools --attention-dp-routing applies to (default both; the others "
                        "keep one shared queue)")
    p.add_argument("--seed", type=count(0, 2**32 - 1), default=0,
                   help="every replayed row's scenario seed (default 0); only what is drawn depends on it "
                        "(SA-Bench's prompt and output lengths, --phases random)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _step_time_options(p) -> None:
    """validate-published's options of every row's step-time model (step_time.model.*)."""
    p.add_argument("--mixed", choices=["one_pass", "sum"], default="one_pass",
                   help="a chunked iteration (decodes + prefill chunks) as one forward pass (default) or as a "
                        "decode iteration plus a prefill iteration (step_time.model.mixed)")
    _per_engine(p, "--moe-kernels", ["own", "vllm", "sglang", "trtllm", "composed"],
                help="MoE layers' routed experts: each engine's default (vLLM and SGLang: their own measured "
                     "fused-MoE kernels; TensorRT-LLM: composed from GEMMs; chosen on half the silicon sample, "
                     "docs/fidelity.md), every row's own engine's kernels, one engine's kernels for every row, "
                     "or composed (step_time.model.moe_kernels)")
    _per_engine(p, "--mla-kernels", ["own", "composed", "sglang", "trtllm"],
                help="MLA models' attention (DeepSeek-V3/R1, Kimi-K2.5): each engine's default "
                     "(EngineDefaults.mla_kernels), every row's own engine's measured MLA kernels (vLLM: composed, "
                     "it has no kernel table), one engine's for every row, or composed from the GQA tables "
                     "(step_time.model.mla_kernels)")
    _per_engine(p, "--moe-routing", ["balanced", "power_law_1.2"],
                help="which measured routing of the fused-MoE kernels: each engine's default (vLLM power_law_1.2, "
                     "SGLang balanced), tokens spread evenly over the experts, or a power law "
                     "(step_time.model.moe_routing)")
    _per_engine(p, "--all-reduce", ["own", "nccl", "vllm", "sglang", "trtllm"],
                help="whose all-reduce times tensor parallelism: each engine's default (docs/fidelity.md), every "
                     "row's own engine's measured one, NCCL's, or one engine's for every row "
                     "(step_time.model.all_reduce)")
    p.add_argument("--host-overhead-ms", type=float, default=None,
                   help="per-iteration host time of every row's step (default: each engine's, else "
                        "sim.io.ops_schema's fitted 0.228 ms)")
    p.add_argument("--host-per-sequence-ms", type=float, default=None,
                   help="host time per sequence of every row's iterations, ms (default: each engine's for the row's "
                        "version: vLLM before 0.14, which schedules synchronously, its fitted value; else 0)")
    _per_engine(p, "--kv-cache", ["bf16", "quantized", "checkpoint"],
                help="which rows' KV cache is FP8 (the file does not say): each engine's choice (default), bf16 for "
                     "none, quantized for every FP8 and FP4 row (AIConfigurator's inference), checkpoint for the FP4 "
                     "rows (NVIDIA's NVFP4 checkpoints state an FP8 KV cache)")
    p.add_argument("--shared-experts-overlap", default="engine", type=_overlap,
                   help="when MoE layers' shared experts run on a second stream beside the routed ones: each "
                        "engine's (default: vLLM at most 256 tokens a pass, TensorRT-LLM decode-only passes, SGLang "
                        "off), or off, decode, fused (into the routed kernel, without expert parallelism), or a token "
                        "count for every row (step_time.model.shared_experts_overlap)")


DISAGG_AND_SCHEDULE_FLAGS = (
    ("--pool-batch", ["stated", "defaults", "decode"],
     "disaggregated rows: how many requests a pool's worker runs at once: each engine's (default: its launch "
     "limits; a row's stated batch sizes are its concurrency divided, docs/disaggregation.md), the row's "
     "prefill_batch_size / decode_batch_size per attention-DP rank, the engine's launch default, or the stated batch "
     "on the decode pool and the launch default on the prefill pool"),
    ("--frontend-users", ["decode_worker", "none"],
     "disaggregated rows: whose users the front end's per-user term counts: each engine's (default: "
     "decode_worker for every engine since the rows replay as their recorded client; docs/disaggregation.md), the "
     "users of one decode worker, or none (the base time alone)"),
    ("--attention-dp-routing", ["shared_queue", "random", "round_robin", "least_loaded"],
     "replicas and pools of attention data parallelism: how the ranks get their requests "
     "(parallel.attention_dp_routing): each engine's (default, docs/disaggregation.md), one queue spread evenly over "
     "the ranks every pass, or each request bound at arrival to a random rank, to the ranks in turn, or to the rank "
     "holding the fewest"),
    ("--async-scheduling", ["on", "off"],
     "whether each row's engine plans an iteration while the one before runs, so a request that arrives meanwhile "
     "joins one iteration later (scheduler.async_scheduling): each engine's choice (default, docs/fidelity.md), or "
     "on / off for every row"),
    ("--first-token", ["prefill", "decode_admission", "decode_step", "decode_recompute"],
     "disaggregated rows: where the client's first token comes from (disaggregation.first_token, "
     "docs/disaggregation.md): each engine's (default: vLLM decode_recompute, SGLang decode_admission, TensorRT-LLM "
     "decode_step, as their code does), or one for every row"),
    ("--prefill-response", ["at_once", "wait"],
     "disaggregated rows: whether the client's stream also waits for the prefill server's answer, sent between its "
     "iterations once the KV has gone (disaggregation.wait_for_prefill_response): each engine's (default: SGLang "
     "wait, as its router does; the others at_once), or one for every row"),
    ("--handshake", ["none", "preallocate", "recipes"],
     "disaggregated rows: whether the prefill waits for the decode server to take the request (pre-allocate its KV) "
     "and how often the engines take new requests (disaggregation.decode_preallocation, scheduler.recv_interval): "
     "each engine's (default: SGLang recipes, its bootstrap with its recipes' --scheduler-recv-interval; the others "
     "none), none, preallocate (every pass takes new requests), or recipes (docs/disaggregation.md)"),
    ("--prefill-batches", ["mixed", "separate"],
     "agg rows whose engine schedules chunked prefill: whether an iteration mixes decodes with prefill chunks "
     "(scheduler.prefill_batches): each engine's (default, docs/fidelity.md), mixed, or separate (an iteration with "
     "prefill work runs it alone, the decodes wait)"),
    ("--phases", ["even", "random"],
     "the steady state's users (--start cold's later waves, staggered): each engine's choice (default; agg rows: "
     "vLLM random, the others even; disaggregated rows: TensorRT-LLM and vLLM random; docs/fidelity.md), or first "
     "requests spread evenly over one request lifetime, or at random times within it"),
)
"""validate-published's per-engine choices of the disaggregated pools, the schedule and the steady state, in --help's
order: (flag, values besides `engine`, help)."""


def _per_engine(p, flag: str, values: list[str], help: str) -> None:
    """A choice made per engine by default: `engine` (each row's engine's, sim.published.engines) or one of `values`
    for every row."""
    p.add_argument(flag, choices=["engine", *values], default="engine", help=help)


def _overlap(text: str) -> str | int:
    """--shared-experts-overlap: engine, off, decode, fused or a positive token count."""
    if text in ("engine", "off", "decode", "fused"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected engine, off, decode, fused or a positive token count, got {text!r}")


def _rounds(text: str | None):
    """--rounds: None (each mode's default), an integer >= 1 or `dynamo` (sim.published.predict.benchmark_rounds)."""
    from sim.io.errors import ConfigError
    if text is None or text == "dynamo":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(f"--rounds: expected an integer >= 1 (requests per user of the benchmark) or dynamo, got {text!r}")


def _frontend(text: str):
    """--frontend: engine, off, or BASE_MS[+PER_USER_MS] (non-negative numbers)."""
    if text in ("engine", "off"):
        return text
    parts = text.split("+")
    try:
        values = tuple(float(x) for x in parts)
    except ValueError:
        values = ()
    if len(parts) > 2 or len(values) != len(parts) or any(not v >= 0 or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"expected engine, off or BASE_MS[+PER_USER_MS] (numbers >= 0, e.g. 30+0.5), "
                                         f"got {text!r}")
    return (values[0], values[1] if len(values) > 1 else 0.0)


def run(args) -> int:
    """Run validate-published with the parsed arguments."""
    from sim.io.errors import ConfigError
    from sim.published.report import print_report, validate_published, write_report
    if args.requests_per_user is not None and not 2 <= args.requests_per_user <= 1000:
        raise ConfigError(f"--requests-per-user: expected an integer in 2..1000 (the first is a warm-up), "
                          f"got {args.requests_per_user}")
    if args.host_overhead_ms is not None and not 0 <= args.host_overhead_ms <= 1e6:
        raise ConfigError(f"--host-overhead-ms: expected a number in 0..1e6 (ms), got {args.host_overhead_ms}")
    if args.host_per_sequence_ms is not None and not 0 <= args.host_per_sequence_ms <= 1e3:
        raise ConfigError(f"--host-per-sequence-ms: expected a number in 0..1000 (ms), got {args.host_per_sequence_ms}")
    if args.out:  # a folder it can write its three files in (replaced only with --force), checked before any row runs
        from sim.io.outputs import check_out_dir
        check_out_dir(args.out, args.force, PUBLISHED_FILES)
    rounds = _rounds(args.rounds)
    if args.rounds is not None and args.start != "cold":
        raise ConfigError(f"--rounds: only with --start cold (got --start {args.start})")
    report = validate_published(args.file, args.backend, args.system, args.mode, workers=args.workers,
                                progress=not args.no_progress, per_user=args.requests_per_user, start=args.start,
                                mixed=args.mixed, rounds=rounds, moe_kernels=args.moe_kernels,
                                moe_routing=args.moe_routing, all_reduce=args.all_reduce,
                                engine_config=args.engine_config.replace("-", "_"),
                                host_overhead_s=None if args.host_overhead_ms is None else args.host_overhead_ms / 1e3,
                                shared_experts_overlap=args.shared_experts_overlap, frontend=args.frontend,
                                pool_batch=args.pool_batch, async_scheduling=args.async_scheduling,
                                first_token=args.first_token, phases=args.phases, seed=args.seed,
                                host_per_sequence_s=None if args.host_per_sequence_ms is None
                                else args.host_per_sequence_ms / 1e3, kv_cache=args.kv_cache,
                                prefill_batches=args.prefill_batches, prefill_response=args.prefill_response,
                                mla_kernels=args.mla_kernels, frontend_users=args.frontend_users,
                                attention_dp_routing=args.attention_dp_routing,
                                attention_dp_pools=args.attention_dp_pools, client=args.client,
                                handshake=args.handshake)
    if args.out:  # written whole or not at all
        from sim.io.outputs import staged_output
        with staged_output(args.out, args.force, PUBLISHED_FILES) as stage:
            names = [p.name for p in write_report(report, stage)]
        for name in names:
            print(f"wrote {Path(args.out) / name}", file=sys.stderr)
    if args.json:
        print(json.dumps({key: report[key] for key in ("rows", "summary", "engines", "derived") if key in report},
                         indent=1))
    else:
        print_report(report)
    if report["rows"] and all("skipped" in r for r in report["rows"]):
        print(f"error: none of the {len(report['rows'])} selected rows could be simulated (each row's reason is above)",
              file=sys.stderr)
        return 1
    return 0
