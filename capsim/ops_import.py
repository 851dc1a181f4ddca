"""`capsim profile import-ops`: reduce AIConfigurator's kernel tables to what the `ops` model reads.

Input: the CSV conversions in ../shared/data/profiling/aiconfigurator (see ../shared/data/SOURCES.md
section 2.1). Output: profiles/ops/<card>/{gemm_bf16,gemm_fp8[,gemm_nvfp4],context_attention,generation_attention}.csv.gz,
nccl.csv and source.txt. Cuts (size): GEMM n and k below 256 and k = 65536 (no model needs them;
smaller shapes cost the smallest kept one), FP16 collectives all_reduce and all_gather only,
B200 context attention from the prefill kernel only; latencies in microseconds to 4 significant digits;
repeated measurements averaged.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from sim.io.errors import ConfigError

CARDS = {
    # aiconfigurator gpu id -> (profiles/ops folder, device, kernels, engine)
    "h100_sxm": ("h100-sxm", "NVIDIA H100 80GB HBM3", "attention FA3", "vLLM 0.24.0, NCCL 2.29.2"),
    "h200_sxm": ("h200-sxm", "NVIDIA H200", "attention FA3", "vLLM 0.24.0, NCCL 2.29.2"),
    "b200_sxm": ("b200", "NVIDIA B200", "attention FlashInfer TRT-LLM prefill/decode kernels", "vLLM 0.24.0, NCCL 2.29.2"),
    "a100_sxm": ("a100-80g-sxm", "NVIDIA A100-SXM4-80GB", "attention vllm_flash_attn", "vLLM 0.14.0, NCCL 2.27.3"),
    "l40s": ("l40s", "NVIDIA L40S", "attention FA2", "vLLM 0.24.0, NCCL 2.27.3"),
    "rtx_pro_6000_server": ("rtx-pro-6000-server", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "attention FA2",
                            "vLLM 0.24.0, NCCL 2.29.2"),
    # not in the snapshot: converted from the aiconfigurator 0.12.0 wheel by benchmarks/aiconfigurator_cards.py
    "b300_sxm": ("b300", "NVIDIA B300 SXM6 AC", "attention FlashInfer TRT-LLM prefill/decode kernels",
                 "vLLM 0.24.0, NCCL 2.29.2"),
    "gb200": ("gb200", "NVIDIA GB200", "attention FlashInfer TRT-LLM prefill/decode kernels", "vLLM 0.24.0, NCCL 2.29.2"),
    "gb300": ("gb300", "NVIDIA GB300", "attention FlashInfer TRT-LLM prefill/decode kernels", "vLLM 0.24.0, NCCL 2.29.2"),
}
PREFILL_KERNEL = {gpu: "vllm_flashinfer_trtllmprefill" for gpu in ("b200_sxm", "b300_sxm", "gb200", "gb300")}
"""Cards whose context-attention table also times the decode kernel on prompts: keep the prefill kernel's rows."""
TABLES = ["gemm_bf16.csv", "gemm_fp8.csv", "context_attention_bf16.csv", "generation_attention_bf16.csv", "nccl.csv"]
SOURCE = ("ai-dynamo/aiconfigurator @095f58a51c4ca8e61b66ec108d86f223f8d559ce, "
          "aic-core/src/aiconfigurator_core/systems/data/{gpu}/ (Apache-2.0), via ../shared/data/profiling/aiconfigurator")
MIN_NK = 256
DROP_K = 65536


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _write(path: Path, header: str, rows) -> int:
    lines = [header] + [",".join(r) for r in rows]
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        # mtime=0: the same tables give byte-identical files
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fh:
            fh.write(text.encode())
    else:
        path.write_text(text)
    return len(lines) - 1


def _gemm(df, gpu: str, out: Path) -> int:
    d = df[(df.gpu == gpu) & (df.n >= MIN_NK) & (df.k >= MIN_NK) & (df.k != DROP_K)]
    if d.empty:
        return 0
    d = d.groupby(["m", "n", "k"], as_index=False).latency_ms.mean().sort_values(["n", "k", "m"])
    rows = ((str(int(m)), str(int(n)), str(int(k)), _fmt(t * 1e3)) for m, n, k, t in
            zip(d.m, d.n, d.k, d.latency_ms))
    return _write(out, "m,n,k,latency_us", rows)


def _attention(df, gpu: str, out: Path, length: str, header_len: str) -> int:
    d = df[df.gpu == gpu]
    if gpu in PREFILL_KERNEL and "kernel_source" in d and length == "seq_len":
        d = d[d.kernel_source == PREFILL_KERNEL[gpu]]
    keys = ["num_heads", "num_key_value_heads", "head_dim", "batch_size", length]
    d = d.groupby(keys, as_index=False).latency_ms.mean().sort_values(keys)
    rows = ((str(int(b)), str(int(n)), str(int(h)), str(int(kv)), str(int(hd)), _fmt(t * 1e3)) for h, kv, hd, b, n, t in
            zip(d.num_heads, d.num_key_value_heads, d.head_dim, d.batch_size, d[length], d.latency_ms))
    return _write(out, f"batch,{header_len},heads,kv_heads,head_dim,latency_us", rows)


def _nccl(df, gpu: str, out: Path) -> int:
    d = df[(df.gpu == gpu) & (df.nccl_dtype == "half") & df.op_name.isin(["all_reduce", "all_gather"])]
    d = d.groupby(["op_name", "num_gpus", "message_size_bytes"], as_index=False).latency_ms.mean()
    rows = ((op, str(int(g)), str(int(b)), _fmt(t * 1e3)) for op, g, b, t in
            zip(d.op_name, d.num_gpus, d.message_size_bytes, d.latency_ms))
    return _write(out, "op,gpus,bytes,latency_us", rows)


def _more_fp8(path: Path, frame):
    """The snapshot's FP8 GEMM rows plus those of `path` (same schema) for GPUs the snapshot lacks."""
    import pandas as pd

    if not path.exists():
        raise ConfigError(f"{path}: not found (--gemm-fp8-more: write it with benchmarks/aiconfigurator_gemm_fp8.py)")
    more = pd.read_csv(path)
    cols = ["gpu", "m", "n", "k", "latency_ms"]
    if list(more.columns) != cols:
        raise ConfigError(f"{path}: expected the columns {','.join(cols)}, got {','.join(map(str, more.columns))}")
    both = sorted(set(more.gpu) & set(frame.gpu))
    if both:
        raise ConfigError(f"{path}: rows for {', '.join(both)}, which the snapshot's gemm_fp8.csv already has")
    return pd.concat([frame, more], ignore_index=True), set(more.gpu)


def _more_cards(folder: Path, frames: dict) -> set:
    """Add the rows of `folder`'s five CSVs (the snapshot's names and columns, written by
    benchmarks/aiconfigurator_cards.py) to `frames`; the GPUs they add. A GPU the snapshot has is refused."""
    import pandas as pd

    added: set = set()
    for name in TABLES:
        path = folder / name
        if not path.exists():
            raise ConfigError(f"{path}: not found (--more: write the folder with benchmarks/aiconfigurator_cards.py)")
        more = pd.read_csv(path)
        cols = list(frames[name].columns)
        if list(more.columns) != cols:
            raise ConfigError(f"{path}: expected the columns {','.join(cols)}, got {','.join(map(str, more.columns))}")
        both = sorted(set(more.gpu) & set(frames[name].gpu))
        if both:
            raise ConfigError(f"{path}: rows for {', '.join(both)}, which the snapshot's {name} already has")
        frames[name] = pd.concat([frames[name], more], ignore_index=True)
        added |= set(more.gpu)
    nvfp4 = folder / "gemm_nvfp4.csv"   # optional; the snapshot has no NVFP4 table, so any GPU may come from here
    if nvfp4.exists():
        more = pd.read_csv(nvfp4)
        cols = ["gpu", "m", "n", "k", "latency_ms"]
        if list(more.columns) != cols:
            raise ConfigError(f"{nvfp4}: expected the columns {','.join(cols)}, got {','.join(map(str, more.columns))}")
        frames["gemm_nvfp4.csv"] = more
    return added


def import_ops(src: Path, out: Path, cards: list[str] | None = None, progress=print,
               gemm_fp8_more: Path | None = None, more: Path | None = None) -> dict[str, dict[str, int]]:
    """Write profiles/ops/<card>/ for every card of CARDS found in `src` (with `gemm_fp8_more`, FP8 GEMM rows
    of more GPUs in gemm_fp8.csv's schema; with `more`, a folder of all five tables for GPUs the snapshot
    lacks); returns rows written per file."""
    import pandas as pd

    need = TABLES
    if not src.is_dir():
        raise ConfigError(f"{src}: {'is not a folder' if src.exists() else 'no such folder'} (expected the folder of "
                          "aiconfigurator CSVs, ../shared/data/profiling/aiconfigurator)")
    missing = [n for n in need if not (src / n).exists()]
    if missing:
        raise ConfigError(f"{src}: missing {', '.join(missing)} (expected the aiconfigurator CSVs of "
                          "../shared/data/profiling/aiconfigurator)")
    frames = {n: pd.read_csv(src / n) for n in need}
    fp8_from_more: set = set()
    if gemm_fp8_more is not None:
        frames["gemm_fp8.csv"], fp8_from_more = _more_fp8(gemm_fp8_more, frames["gemm_fp8.csv"])
    from_more = _more_cards(more, frames) if more is not None else set()
    written: dict[str, dict[str, int]] = {}
    for gpu, (name, device, kernels, engine) in CARDS.items():
        if (cards and name not in cards) or not (frames["gemm_bf16.csv"].gpu == gpu).any():
            continue
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        counts = {
            "gemm_bf16.csv.gz": _gemm(frames["gemm_bf16.csv"], gpu, folder / "gemm_bf16.csv.gz"),
            "gemm_fp8.csv.gz": _gemm(frames["gemm_fp8.csv"], gpu, folder / "gemm_fp8.csv.gz"),
            "context_attention.csv.gz": _attention(frames["context_attention_bf16.csv"], gpu,
                                                   folder / "context_attention.csv.gz", "seq_len", "seq_len"),
            "generation_attention.csv.gz": _attention(frames["generation_attention_bf16.csv"], gpu,
                                                      folder / "generation_attention.csv.gz", "kv_len", "kv_len"),
            "nccl.csv": _nccl(frames["nccl.csv"], gpu, folder / "nccl.csv"),
        }
        if "gemm_nvfp4.csv" in frames and (frames["gemm_nvfp4.csv"].gpu == gpu).any():
            counts["gemm_nvfp4.csv.gz"] = _gemm(frames["gemm_nvfp4.csv"], gpu, folder / "gemm_nvfp4.csv.gz")
        if not counts["gemm_fp8.csv.gz"]:
            (folder / "gemm_fp8.csv.gz").unlink(missing_ok=True)
            del counts["gemm_fp8.csv.gz"]
        notes = (f" Per-tensor FP8 GEMMs: the same database as shipped in the aiconfigurator 0.12.0 wheel "
                 f"(aiconfigurator_core/systems/data/{gpu}/gemm/vllm/0.24.0/gemm_perf.parquet), taken by "
                 "benchmarks/aiconfigurator_gemm_fp8.py, which checks that the wheel's H100 rows are the snapshot's."
                  if gpu in fp8_from_more and counts.get("gemm_fp8.csv.gz") else "")
        source = SOURCE.format(gpu=gpu)
        if gpu in from_more:
            source = source.replace("via ../shared/data/profiling/aiconfigurator",
                                    "as shipped in the aiconfigurator 0.12.0 wheel, converted by "
                                    "benchmarks/aiconfigurator_cards.py as the snapshot was (checked on B200)")
        if counts.get("gemm_nvfp4.csv.gz"):
            notes += (f" NVFP4 GEMMs (gemm_nvfp4.csv.gz): the same database as shipped in the aiconfigurator 0.12.0 "
                      f"wheel (aiconfigurator_core/systems/data/{gpu}/gemm/vllm/0.24.0/gemm_perf.parquet, "
                      "FlashInferCuteDslNvFp4LinearKernel), taken by benchmarks/aiconfigurator_cards.py.")
        (folder / "source.txt").write_text(
            f"{device} ({engine}; {kernels}); measured by NVIDIA, {source}; "
            f"reduced by `capsim profile import-ops`: GEMM n,k >= {MIN_NK}, k != {DROP_K}; latencies in us, "
            f"4 significant digits; repeated measurements averaged.{notes}\n")
        written[name] = counts
        progress(f"{folder}: " + ", ".join(f"{k} {v} rows" for k, v in counts.items()))
    return written
