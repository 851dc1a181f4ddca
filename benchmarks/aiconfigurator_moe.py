"""Measured fused-MoE kernel timings for the MoE models capsim ships, from the database in the aiconfigurator
0.12.0 wheel, written as profiles/ops/<card>/moe.csv.gz.

../shared/data/profiling/aiconfigurator has GEMM, attention and NCCL tables but no MoE kernels, so capsim's
ops model has composed a MoE layer from GEMM timings (the touched experts' share of one grouped GEMM). The
wheel carries each engine's own fused-MoE timings (`aiconfigurator_core/systems/data/<gpu>/moe/<engine>/
<version>/moe_perf.parquet`, Apache-2.0, measured by NVIDIA): latency of the whole routed-expert step
(gate/up, the activation, down, the weighted sum) for `num_tokens` tokens entering one GPU that holds
num_experts / moe_ep experts each split moe_tp ways. MoE kernels differ much more between engines than
GEMMs do (vLLM's Triton / FlashInfer kernels, TensorRT-LLM's CUTLASS ones, SGLang's), so every engine's
table is kept. This script keeps, per card and engine:

- vLLM: the version the card's other tables were measured with (0.24.0; A100: 0.14.0), so that one card's
  kernels come from one vLLM; SGLang and TensorRT-LLM: their newest version with rows for the shipped
  shapes. (A first extraction took the version with the most rows, which chose vLLM 0.19.0 on B200 and
  H200: its Triton fused-MoE timings are much slower than 0.24.0's FlashInfer kernels, and the published
  MiniMax-M2.5 TPOT on B200 came out +19.6% instead of +2.8%; docs/fidelity.md);
- the shapes of the MoE models under profiles/models (hidden, expert width, top-k, experts), every
  (moe_tp, moe_ep) and dtype measured (bfloat16, fp8 per tensor, fp8_block, nvfp4, w4a16_mxfp4,
  w4a8_mxfp4_mxfp8);
- two routing distributions: `balanced` (uniform routing, capsim's default assumption) and
  `power_law_1.2` (AIConfigurator's default: token counts per expert follow a power law, so the busiest
  expert GPU gets more than its share; `power_law_1.01` is not taken);
- where one point was measured with several kernels, the fastest (each engine picks or autotunes its
  MoE backend); the kernels are listed in source.txt.

Run it with the wheel's interpreter (pandas + pyarrow + pyyaml):

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_moe.py --out profiles/ops
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parent.parent
CARDS = {"h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "b200": "b200_sxm", "l40s": "l40s",
         "rtx-pro-6000-server": "rtx_pro_6000_server", "a100-80g-sxm": "a100_sxm", "b300": "b300_sxm", "gb200": "gb200",
         "gb300": "gb300"}
"""capsim table set -> the database's system folder."""
VLLM_VERSION = {"a100-80g-sxm": "0.14.0"}
"""vLLM version of each card's GEMM / attention / NCCL tables (profiles/ops/README.md): 0.24.0 unless named."""
ENGINES = ("vllm", "sglang", "trtllm")
ROUTINGS = ("balanced", "power_law_1.2")
DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
"""The weight dtypes kept: w4a16_mxfp4 and w4a8_mxfp4_mxfp8 are gpt-oss's checkpoint (MXFP4 experts) run with BF16
or MXFP8 activations."""
COLUMNS = ["engine", "dtype", "routing", "hidden", "inter", "topk", "experts", "moe_tp", "moe_ep", "tokens", "latency_us"]


def moe_shapes(models: Path) -> dict[tuple[int, int, int, int], list[str]]:
    """(hidden, expert width, top-k, experts) -> the shipped models with that shape."""
    out: dict[tuple[int, int, int, int], list[str]] = {}
    for path in sorted(models.glob("*.yaml")):
        p = yaml.safe_load(path.read_text())
        m = p.get("moe")
        if m:
            key = (p["hidden_size"], m["expert_intermediate_size"], m["experts_per_token"], m["num_experts"])
            out.setdefault(key, []).append(p["name"])
    return out


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in v.replace("rc", ".").replace("post", ".").split("."))


def _rows(path: Path, engine: str, shapes) -> tuple[pd.DataFrame, list[str]]:
    d = pd.read_parquet(path)
    d = d[d.distribution.isin(ROUTINGS) & d.moe_dtype.isin(DTYPES)]
    keep = pd.Series(False, index=d.index)
    for h, i, k, e in shapes:
        keep |= (d.hidden_size == h) & (d.inter_size == i) & (d.topk == k) & (d.num_experts == e)
    d = d[keep]
    if d.empty:
        return pd.DataFrame(columns=COLUMNS), []
    key = ["moe_dtype", "distribution", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "num_tokens"]
    # per kernel the mean of repeated measurements, then the fastest kernel of each point
    d = d.groupby(key + ["kernel_source"], as_index=False).latency.mean()
    d = d.sort_values("latency").groupby(key, as_index=False).first()
    out = pd.DataFrame({"engine": engine, "dtype": d.moe_dtype, "routing": d.distribution,
                        "hidden": d.hidden_size.astype(int),
                        "inter": d.inter_size.astype(int), "topk": d.topk.astype(int),
                        "experts": d.num_experts.astype(int), "moe_tp": d.moe_tp_size.astype(int),
                        "moe_ep": d.moe_ep_size.astype(int), "tokens": d.num_tokens.astype(int),
                        "latency_us": [float(f"{v * 1000:.4g}") for v in d.latency]})
    return out, sorted(d.kernel_source.unique())


def card_rows(data: Path, card: str, shapes) -> tuple[pd.DataFrame, list[str]]:
    """Every engine's rows for one card, and one line per engine saying which version and kernels."""
    system = CARDS[card]
    tables, notes = [], []
    for engine in ENGINES:
        best = None
        for path in sorted((data / system / "moe" / engine).glob("*/moe_perf.parquet")):
            version = path.parent.name
            if engine == "vllm" and version != VLLM_VERSION.get(card, "0.24.0"):
                continue
            rows, kernels = _rows(path, engine, shapes)
            if len(rows) and (best is None or _version_key(version) > _version_key(best[1])):
                best = (rows, version, kernels)
        if best is not None:
            tables.append(best[0])
            notes.append(f"{engine} {best[1]} ({len(best[0])} rows; {', '.join(best[2])})")
    if not tables:
        return pd.DataFrame(columns=COLUMNS), notes
    out = pd.concat(tables, ignore_index=True)
    return out.sort_values(COLUMNS[:-1]).reset_index(drop=True), notes


NOTES = (" Fused-MoE kernels (moe.csv.gz):", " Engine all-reduce (all_reduce_<engine>.csv):",
         " MLA attention kernels (mla_<phase>_<engine>_<kv>.csv.gz):",
         " Gated DeltaNet kernels (gdn_<phase>_<engine>.csv.gz):", " Attention at head_dim 256:",
         " SGLang's DeepEP path (moe_deepep_<phase>.csv.gz, deepep_<mode>.csv.gz):",
         " TensorRT-LLM's NVLink all-to-all (alltoall_trtllm.csv.gz):")
"""The notes these scripts append to a card's source.txt, each starting with its marker."""


def set_note(src: Path, note: str) -> None:
    """Replace (or add) the note in `src` that starts with `note`'s marker, keeping every other note."""
    marker = next(m for m in NOTES if note.startswith(m))
    text = src.read_text().rstrip("\n")
    cuts = sorted((text.find(m), m) for m in NOTES if m in text)
    head = text[:cuts[0][0]] if cuts else text
    notes = {m: text[i:(cuts[k + 1][0] if k + 1 < len(cuts) else len(text))] for k, (i, m) in enumerate(cuts)}
    notes[marker] = note
    src.write_text(head + "".join(notes[m] for m in NOTES if m in notes) + "\n")


def wheel_note(folder: Path, marker: str, system: str, what: str, path: str, detail: str, notes: list[str],
               script: str) -> None:
    """Set the note `marker` in `folder`/source.txt: `what` in the wheel's `path` under the system's data folder,
    `detail`, then each engine's or table's `notes` and the `script` that took them."""
    set_note(folder / "source.txt", f"{marker} {what} in the aiconfigurator 0.12.0 wheel (aiconfigurator_core/systems/"
                                    f"data/{system}/{path}), {detail}: {'; '.join(notes)}; taken by benchmarks/{script}.")


def write_tables(folder: Path, tables: dict) -> None:
    """Each `stem -> rows` table as folder/<stem>.csv.gz, byte-identical for the same rows (gzip mtime 0)."""
    for stem, rows in tables.items():
        rows.to_csv(folder / f"{stem}.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})


def card_folders(args: argparse.Namespace):
    """(card, its table-set folder under --out) for each of --cards, refusing an unknown card or a missing folder."""
    for card in args.cards.split(","):
        if card not in CARDS:
            raise SystemExit(f"--cards: unknown card {card!r}; expected some of {', '.join(CARDS)}")
        folder = Path(args.out) / card
        if not folder.is_dir():
            raise SystemExit(f"{folder}: no such table set")
        yield card, folder


def wheel_args(description: str, out_help: str, argv=None) -> tuple[argparse.Namespace, Path]:
    """--data / --out / --cards of a script reading the aiconfigurator wheel's database, and that database."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", help="the wheel's systems/data folder (default: found from the installed package)")
    ap.add_argument("--out", required=True, help=out_help)
    ap.add_argument("--cards", default=",".join(CARDS))
    args = ap.parse_args(argv)
    if args.data:
        return args, Path(args.data)
    import aiconfigurator_core
    return args, Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def main(argv=None) -> int:
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: writes <card>/moe.csv.gz and notes the source", argv)
    shapes = moe_shapes(REPO / "profiles" / "models")
    print(f"shapes: {shapes}", file=sys.stderr)
    for card in args.cards.split(","):
        if card not in CARDS:
            raise SystemExit(f"--cards: unknown card {card!r}; expected some of {', '.join(CARDS)}")
        system = CARDS[card]
        rows, notes = card_rows(data, card, shapes)
        if rows.empty:
            print(f"{card}: no rows for these shapes in any engine's table; nothing written", file=sys.stderr)
            continue
        folder = Path(args.out) / card
        if not folder.is_dir():
            raise SystemExit(f"{folder}: no such table set")
        write_tables(folder, {"moe": rows})
        wheel_note(folder, NOTES[0], system, "each engine's table", "moe/<engine>/<version>/moe_perf.parquet",
                   "balanced and power_law_1.2 routing, the shipped MoE models' shapes, the fastest kernel per point",
                   notes, "aiconfigurator_moe.py")
        print(f"{card}: {len(rows)} rows: {'; '.join(notes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
