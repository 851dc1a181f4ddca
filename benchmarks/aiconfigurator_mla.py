"""SGLang's and TensorRT-LLM's measured MLA attention kernels, from the database in the aiconfigurator 0.12.0 wheel,
written as profiles/ops/<card>/mla_<phase>_<engine>_<kv>.csv.gz.

The ops model had no MLA kernel: it timed DeepSeek-V3's and Kimi-K2.5's decode attention as the card's measured
GQA kernel (vLLM 0.24.0's) with one KV head over the latent's 2.25 times the bytes, and their prefill attention as
MHA scaled by the head dims (sim/models/parallel_ops.py). The wheel carries the MLA kernels themselves
(`aiconfigurator_core/systems/data/<gpu>/mla/<engine>/<version>/{context,generation}_mla_perf.parquet`,
Apache-2.0, measured by NVIDIA): SGLang 0.5.14's attention backend of the card (`trtllm_mla` on Blackwell,
`flash_attention` on Hopper, `triton` elsewhere) and TensorRT-LLM's (1.3.0rc20; 1.0.0 on A100 and L40S), with a
BF16 and an FP8 KV cache, 1-128 heads per GPU. This script keeps, per card, engine, phase and KV dtype:

- generation: `batch,kv_len,heads,kv_heads,head_dim,latency_us`, kv_len = isl + step (the cached tokens the new
  token attends to), the schema of generation_attention.csv.gz;
- context: `batch,seq_len,heads,kv_heads,head_dim,latency_us`, seq_len = isl (no cached prefix);
- kv_heads 1 and head_dim 576 (the latent's 512 + the shared RoPE key's 64): one slice per head count;
  heads = num_heads (heads per GPU: the database sweeps 64 and 128-head models over tp, num_heads x tp_size);
- repeated measurements averaged, latencies in us to 4 significant digits.

vLLM's database has no kernel-level MLA table (only whole-module timings), so it has no file here.

Run it with the wheel's interpreter (pandas + pyarrow):

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_mla.py --out profiles/ops
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiconfigurator_moe import CARDS, _version_key, card_folders, wheel_args, wheel_note, write_tables  # noqa: E402

ENGINES = ("sglang", "trtllm")
PHASES = {"generation": "kv_len", "context": "seq_len"}
KV = {"bfloat16": "bf16", "fp8": "fp8"}
LATENT_DIM = 512 + 64
NOTE = " MLA attention kernels (mla_<phase>_<engine>_<kv>.csv.gz):"


def phase_rows(path: Path, phase: str) -> dict[str, pd.DataFrame]:
    """KV dtype -> one phase's rows in the attention tables' schema."""
    d = pd.read_parquet(path)
    d = d[d.mla_dtype == "bfloat16"]
    length = d.isl + d.step if phase == "generation" else d.isl
    d = d.assign(length=length.astype(int))
    out = {}
    for kv, name in KV.items():
        k = d[d.kv_cache_dtype == kv].groupby(["batch_size", "length", "num_heads"], as_index=False).latency.mean()
        if len(k):
            out[name] = pd.DataFrame({"batch": k.batch_size.astype(int), PHASES[phase]: k.length.astype(int),
                                      "heads": k.num_heads.astype(int), "kv_heads": 1, "head_dim": LATENT_DIM,
                                      "latency_us": [float(f"{v * 1000:.4g}") for v in k.latency]})
    return out


def card_tables(data: Path, card: str) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """file stem -> rows, and one note per engine naming its version and kernel."""
    out, notes = {}, []
    for engine in ENGINES:
        versions = [p for p in (data / CARDS[card] / "mla" / engine).glob("*")
                    if (p / "generation_mla_perf.parquet").exists() and (p / "context_mla_perf.parquet").exists()]
        if not versions:
            continue
        folder = max(versions, key=lambda p: _version_key(p.name))
        kernels = set()
        for phase in PHASES:
            path = folder / f"{phase}_mla_perf.parquet"
            kernels |= set(pd.read_parquet(path, columns=["kernel_source"]).kernel_source)
            for kv, rows in phase_rows(path, phase).items():
                out[f"mla_{phase}_{engine}_{kv}"] = rows.sort_values(["heads", "batch", PHASES[phase]])
        kvs = sorted({s.rsplit("_", 1)[1] for s in out if f"_{engine}_" in s})
        notes.append(f"{engine} {folder.name} ({'/'.join(sorted(kernels))}; KV {', '.join(kvs)})")
    return out, notes


def main(argv=None) -> int:
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: writes <card>/mla_<phase>_<engine>_<kv>.csv.gz",
                            argv)
    for card, folder in card_folders(args):
        tables, notes = card_tables(data, card)
        if not tables:
            print(f"{card}: no MLA kernel measured; nothing written", file=sys.stderr)
            continue
        write_tables(folder, tables)
        wheel_note(folder, NOTE, CARDS[card], "SGLang's and TensorRT-LLM's MLA attention kernels",
                   "mla/<engine>/<version>/{context,generation}_mla_perf.parquet", "BF16 or FP8 KV cache, heads per GPU",
                   notes, "aiconfigurator_mla.py")
        print(f"{card}: {'; '.join(notes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
