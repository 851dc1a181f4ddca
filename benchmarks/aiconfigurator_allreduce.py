"""Each serving engine's own measured all-reduce, from the database in the aiconfigurator 0.12.0 wheel,
written as profiles/ops/<card>/all_reduce_<engine>.csv.

The ops model has timed a tensor-parallel all-reduce with NCCL's (nccl.csv, nccl-tests). The engines do not
call NCCL for the small messages of a decode step: vLLM and SGLang run their own one-shot / two-shot custom
all-reduce over NVLink peer memory inside the CUDA graph, TensorRT-LLM its AllReduce plugin, and fall back
to NCCL for large messages. At the 64 KB of a 4-sequence Llama-3.1-70B decode on 8 GPUs that is 6.4 us
(vLLM, H100) against NCCL's 18.4 us, 160 times a step. The wheel carries those timings
(`aiconfigurator_core/systems/data/<gpu>/comm/<engine>/<version>/custom_allreduce_perf.parquet`, Apache-2.0,
measured by NVIDIA; message_size counts BF16 elements: at 64 M elements the vLLM path takes what NCCL takes
for the same 128 MiB). This script keeps, per card and engine:

- vLLM: the version of the card's other tables (0.24.0; A100: 0.14.0), as benchmarks/aiconfigurator_moe.py
  does; SGLang and TensorRT-LLM: their newest version;
- vLLM and SGLang: the CUDA-graph measurement (`*_graph`; decode steps replay a captured graph, and at the
  large messages of a prefill pass the eager and graph timings converge), TensorRT-LLM: its one
  measurement;
- bytes = 2 x message_size (BF16), repeated measurements averaged, latencies in us to 4 significant digits,
  in nccl.csv's format (`op,gpus,bytes,latency_us`, op all_reduce) so the same loader reads both.

Run it with the wheel's interpreter (pandas + pyarrow):

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_allreduce.py --out profiles/ops
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiconfigurator_moe import CARDS, VLLM_VERSION, _version_key, card_folders, wheel_args, wheel_note  # noqa: E402

ENGINES = ("vllm", "sglang", "trtllm")
NOTE = " Engine all-reduce (all_reduce_<engine>.csv):"


def engine_rows(path: Path) -> pd.DataFrame:
    """One engine's graph-mode all-reduce rows as `op,gpus,bytes,latency_us`."""
    d = pd.read_parquet(path)
    d = d[(d.op_name == "all_reduce") & (d.allreduce_dtype == "bfloat16")]
    if "backend" in d.columns:
        d = d[d.backend.str.endswith("_graph")]
    d = d.groupby(["num_gpus", "message_size"], as_index=False).latency.mean()
    return pd.DataFrame({"op": "all_reduce", "gpus": d.num_gpus.astype(int),
                         "bytes": (2 * d.message_size).astype("int64"),
                         "latency_us": [float(f"{v * 1000:.4g}") for v in d.latency]})


def card_tables(data: Path, card: str) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """engine -> its rows on this card, and one note per engine naming the version."""
    out, notes = {}, []
    for engine in ENGINES:
        paths = sorted((data / CARDS[card] / "comm" / engine).glob("*/custom_allreduce_perf.parquet"))
        if engine == "vllm":
            paths = [p for p in paths if p.parent.name == VLLM_VERSION.get(card, "0.24.0")]
        if not paths:
            continue
        path = max(paths, key=lambda p: _version_key(p.parent.name))
        rows = engine_rows(path)
        if len(rows):
            out[engine] = rows.sort_values(["gpus", "bytes"]).reset_index(drop=True)
            notes.append(f"{engine} {path.parent.name} ({len(rows)} rows, GPUs {', '.join(str(int(g)) for g in sorted(rows.gpus.unique()))})")
    return out, notes


def main(argv=None) -> int:
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: writes <card>/all_reduce_<engine>.csv", argv)
    for card, folder in card_folders(args):
        tables, notes = card_tables(data, card)
        for engine, rows in tables.items():
            rows.to_csv(folder / f"all_reduce_{engine}.csv", index=False)
        if not tables:
            print(f"{card}: no engine all-reduce measured; nothing written", file=sys.stderr)
            continue
        wheel_note(folder, NOTE, CARDS[card], "each engine's custom all-reduce",
                   "comm/<engine>/<version>/custom_allreduce_perf.parquet",
                   "BF16, CUDA-graph mode where measured both ways", notes, "aiconfigurator_allreduce.py")
        print(f"{card}: {'; '.join(notes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
