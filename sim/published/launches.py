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
"""

from __future__ import annotations

from sim.published.rows import PublishedRow

INFERENCEX_SOURCES = ("source_file=2026-03-25.csv", "source_file=2026-04-06.csv", "db-dump")
"""How the silicon sample's silicon_data_source starts for InferenceX's runs: two exports of its results database and
rows read from the database itself (docs/fidelity.md, "The agg rows' provenance, read again")."""

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


def launch_scheduler(row: PublishedRow) -> dict:
    """Scheduler settings `row`'s launch adds to its engine's (empty where it adds none): TensorRT-LLM's batch
    waiting for InferenceX's Llama-70B runs at ISL = OSL = 1024 and TP < 8."""
    if not (row.backend == "trtllm" and row.mode == "agg" and inferencex(row) and _llama_70b(row)
            and row.isl == row.osl == 1024 and row.tp < 8 and row.attention_dp <= 1
            and row.precision in LLAMA_MAX_NUM_TOKENS):
        return {}
    return {"batch_wait_iters": BATCH_WAIT_ITERS,
            "batch_wait_tokens": int(BATCH_WAIT_RATIO * LLAMA_MAX_NUM_TOKENS[row.precision])}


def postprocess_workers(row: PublishedRow) -> int:
    """TensorRT-LLM's num_postprocess_workers in `row`'s launch (0 where none is set or the launch is not known)."""
    if row.backend != "trtllm" or not inferencex(row):
        return 0
    return POSTPROCESS_WORKERS.get("llama-70b" if _llama_70b(row) else row.model_path.lower(), 0)


def launch_of(row: PublishedRow) -> dict:
    """What `row`'s launch sets that its replay follows (a report row's `launch`; empty where nothing is known)."""
    out = dict(launch_scheduler(row))
    if workers := postprocess_workers(row):
        out["postprocess_workers"] = workers
    return out
