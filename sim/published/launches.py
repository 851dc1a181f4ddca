"""What InferenceX's launch scripts set for the engines of its runs, where it departs from the engine defaults
(sim.published.engines) and moves a replay.

Read in SemiAnalysisAI/InferenceX, not fitted:

- `benchmarks/70b_fp8_b200_trt_slurm.sh` and `70b_fp4_b200_trt_slurm.sh` (Llama-3.3-70B on B200, TensorRT-LLM):
  for ISL 1024, OSL 1024 and TP < 8 their llama-config.yml sets `batch_wait_max_tokens_ratio: 0.9` and
  `batch_wait_timeout_iters: 20` ("will improve the performance, by default they are all zeros"); the FP8 script
  launches `--max_num_tokens 16384`, the FP4 one `--max_num_tokens $MAX_MODEL_LEN`, which its 1k/1k sweep sets to
  2,048 (`.github/workflows/full-sweep-tmpl.yml`, job `_70b-1k1k`). TensorRT-LLM holds new prompts while requests
  decode until the held prompts' and the decodes' tokens reach ratio x max_num_tokens or `timeout` passes have held
  them (PyExecutor._waiting_requests, not with attention DP): scheduler.batch_wait_iters, batch_wait_tokens.
- Both scripts launch `--num_postprocess_workers 2`, and the gpt-oss-120b ones set `num_postprocess_workers: 4`
  (benchmarks/gptoss_fp4_b200_trt*.sh): responses are detokenized and streamed by worker processes beside the
  server's own. The DeepSeek-R1 scripts (benchmarks/dsr1_*_b200_trt*.sh) set none. POSTPROCESS_WORKERS.
- SGLang's single-node scripts for DeepSeek-R1 and Qwen3.5-397B-A17B on B200 and B300
  (benchmarks/single_node/dsr1_fp4_b200.sh, dsr1_fp8_b200.sh, qwen3.5_{bf16,fp8,fp4}_{b200,b300}.sh) launch
  `--scheduler-recv-interval` 30 at 16 users or more, else 10; qwen3.5_fp4_b200.sh 30 always, qwen3.5_fp8_b300.sh
  10 always, dsr1_fp8_b200.sh's TP 4 branch 10: scheduler.recv_interval (sim.core.engine.RecvGate). The server then
  takes new requests only every N decode passes, so requests that reach it apart enter together: the crowding the
  replay's SGLang cohort (EngineDefaults.later_waves) had stood in for, so these rows' later waves are spread.
"""

from __future__ import annotations

from sim.published.rows import PublishedRow

INFERENCEX_SOURCES = ("source_file=2026-03-25.csv", "source_file=2026-04-06.csv", "db-dump",
                      "source_file=qwen3.5-397b-gap-analysis.csv", "source_file=kimi-k2.5-gap-analysis.csv")
"""How the silicon sample's silicon_data_source starts for InferenceX's runs: two exports of its results database,
rows read from the database itself (docs/fidelity.md, "The agg rows' provenance, read again"), and two files whose
every row (61 Qwen3.5-397B-A17B, 32 Kimi-K2.5) repeats an InferenceX row's TTFT to 1e-4."""

LLAMA_70B = ("meta-llama/llama-3.1-70b", "meta-llama/llama-3.3-70b")

BATCH_WAIT_ITERS = 20
BATCH_WAIT_RATIO = 0.9
LLAMA_MAX_NUM_TOKENS = {"fp8": 16384, "fp4": 2048}
"""max_num_tokens of InferenceX's TensorRT-LLM Llama-70B launches at ISL 1024, OSL 1024, by precision."""

POSTPROCESS_WORKERS = {"openai/gpt-oss-120b": 4, "llama-70b": 2}
"""num_postprocess_workers of InferenceX's TensorRT-LLM launches on B200, by model (Llama-3.1 / 3.3 70B as
`llama-70b`; absent: none)."""


def inferencex(row: PublishedRow) -> bool:
    """Whether `row` is one of InferenceX's runs (its silicon_data_source)."""
    return row.source.startswith(INFERENCEX_SOURCES)


def _llama_70b(row: PublishedRow) -> bool:
    return row.model_path.lower().startswith(LLAMA_70B)


SGLANG_RECV_MODELS = ("deepseek-ai/deepseek-r1", "deepseek-ai/deepseek-v3", "qwen/qwen3.5-397b-a17b")
SGLANG_RECV_CARDS = ("b200_sxm", "b300_sxm")
SGLANG_RECV_FIXED = {("qwen/qwen3.5-397b-a17b", "fp4", "b200_sxm"): 30, ("qwen/qwen3.5-397b-a17b", "fp8", "b300_sxm"): 10}
"""SGLang launches whose receive interval does not depend on the users: (model, precision, card) -> interval."""


def sglang_recv_interval(row: PublishedRow) -> int:
    """`--scheduler-recv-interval` of InferenceX's single-node SGLang launch of `row` (0 where none is known)."""
    model = row.model_path.lower()
    if not (row.backend == "sglang" and row.mode == "agg" and inferencex(row) and model in SGLANG_RECV_MODELS
            and row.system in SGLANG_RECV_CARDS):
        return 0
    if (model, row.precision, row.system) in SGLANG_RECV_FIXED:
        return SGLANG_RECV_FIXED[model, row.precision, row.system]
    if model.startswith("deepseek") and row.precision == "fp8" and row.tp == 4:
        return 10
    return 30 if row.concurrency >= 16 else 10


def later_waves(row: PublishedRow, default: str) -> str:
    """How `row`'s later waves follow its cold first wave (EngineDefaults.later_waves): `spread` where its launch's
    receive interval is replayed (it makes the crowding a cohort stood in for), else `default`."""
    return "spread" if sglang_recv_interval(row) else default


def launch_scheduler(row: PublishedRow) -> dict:
    """Scheduler settings `row`'s launch adds to its engine's (empty where it adds none): TensorRT-LLM's batch
    waiting for InferenceX's Llama-70B runs at ISL = OSL = 1024 and TP < 8, SGLang's receive interval."""
    if every := sglang_recv_interval(row):
        return {"recv_interval": every}
    if not (row.backend == "trtllm" and row.mode == "agg" and inferencex(row) and _llama_70b(row)
            and row.isl == row.osl == 1024 and row.tp < 8 and row.attention_dp <= 1
            and row.precision in LLAMA_MAX_NUM_TOKENS):
        return {}
    return {"batch_wait_iters": BATCH_WAIT_ITERS,
            "batch_wait_tokens": int(BATCH_WAIT_RATIO * LLAMA_MAX_NUM_TOKENS[row.precision])}


def launch_config(row: PublishedRow, default: str) -> str:
    """How `row`'s engine was configured (sim.published.engines.ENGINE_CONFIGS) where its launch is known, else
    `default`: InferenceX's vLLM scripts launch `vllm serve` with their own flags, not AIConfigurator's generated
    benchmark limits, and leave the scheduler's token budget and sequence limit at vLLM's defaults or at 8,192 tokens
    (`defaults`)."""
    return "defaults" if row.backend == "vllm" and row.mode == "agg" and inferencex(row) else default


def postprocess_workers(row: PublishedRow) -> int:
    """TensorRT-LLM's num_postprocess_workers in `row`'s launch (0 where none is set or the launch is not known)."""
    if row.backend != "trtllm" or not inferencex(row):
        return 0
    return POSTPROCESS_WORKERS.get("llama-70b" if _llama_70b(row) else row.model_path.lower(), 0)


def launch_of(row: PublishedRow) -> dict:
    """What `row`'s launch sets that its replay follows (a report row's `launch`; empty where nothing is known)."""
    out = dict(launch_scheduler(row))
    if (config := launch_config(row, "")):
        out["engine_config"] = config
    if workers := postprocess_workers(row):
        out["postprocess_workers"] = workers
    if "recv_interval" in out:
        out["later_waves"] = later_waves(row, "")
    return out
