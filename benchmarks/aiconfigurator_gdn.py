"""Each engine's measured Gated DeltaNet (linear-attention) kernels for the shipped models that have such layers,
from the database in the aiconfigurator 0.12.0 wheel, written as profiles/ops/<card>/gdn_<phase>_<engine>.csv.gz.

The wheel carries them (`aiconfigurator_core/systems/data/<gpu>/linear_attention/<engine>/<version>/gdn_perf.parquet`,
Apache-2.0, measured by NVIDIA) for the Qwen3.5 family: per layer, the short causal convolution over q, k and v
(`causal_conv1d_fn` on prompts, `causal_conv1d_update` on decodes) and the gated delta rule (chunked on prompts,
`chunk_gated_delta_rule[_flashinfer]`; recurrent on decodes, `fused_recurrent_gated_delta_rule_packed_decode`),
with the heads one GPU holds under tensor parallelism. This script keeps, per card and engine (its newest version
with rows for the shipped shapes):

- the shapes of the models under profiles/models with `linear_attention` (hidden size, key and value head dims)
  at the heads per GPU of every tp dividing their key heads;
- one latency per point, the convolution's and the delta rule's added (both run in every linear layer);
- context: `batch,seq_len,heads,kv_heads,head_dim,latency_us` with heads = key heads and kv_heads = value heads per
  GPU, head_dim the key head dim (the attention tables' schema, so sim.models.ops_tables reads them);
  generation: the same with kv_len 1 (a decode's state is fixed in size whatever its context);
- repeated measurements averaged, latencies in us to 4 significant digits.

Run it with the wheel's interpreter (pandas + pyarrow + pyyaml):

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_gdn.py --out profiles/ops
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiconfigurator_moe import (CARDS, REPO, _version_key, card_folders, wheel_args, wheel_note,  # noqa: E402
                               write_tables)

ENGINES = ("vllm", "sglang", "trtllm")
PHASES = {"context": "seq_len", "generation": "kv_len"}
NOTE = " Gated DeltaNet kernels (gdn_<phase>_<engine>.csv.gz):"


def gdn_shapes(models: Path) -> set[tuple[int, int, int, int, int]]:
    """(hidden, key heads per GPU, value heads per GPU, key head dim, value head dim) of the shipped linear-attention
    models at every tp dividing their key heads."""
    out = set()
    for path in sorted(models.glob("*.yaml")):
        p = yaml.safe_load(path.read_text())
        lin = p.get("linear_attention")
        if not lin:
            continue
        nk, nv = lin["num_key_heads"], lin["num_value_heads"]
        for tp in (t for t in range(1, nk + 1) if nk % t == 0):
            out.add((p["hidden_size"], nk // tp, nv // tp, lin["key_head_dim"], lin["value_head_dim"]))
    return out


def engine_rows(path: Path, shapes: set) -> tuple[dict[str, pd.DataFrame], set[str]]:
    """phase -> rows of `shapes` in the attention tables' schema, and the kernels added up."""
    d = pd.read_parquet(path)
    key = list(zip(d.d_model, d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim))
    d = d[[k in shapes for k in key]]
    out = {}
    for phase, length in PHASES.items():
        k = d[d.phase == phase]
        if k.empty:
            continue
        point = ["num_k_heads", "num_v_heads", "head_k_dim", "batch_size", "seq_len"]
        per_kernel = k.groupby(point + ["kernel_source"], as_index=False).latency.mean()
        # a point missing either kernel is dropped
        both = per_kernel.groupby(point).filter(lambda g: g.kernel_source.nunique() == 2)
        t = both.groupby(point, as_index=False).latency.sum()
        out[phase] = pd.DataFrame({"batch": t.batch_size.astype(int),
                                   length: t.seq_len.astype(int) if phase == "context" else 1,
                                   "heads": t.num_k_heads.astype(int), "kv_heads": t.num_v_heads.astype(int),
                                   "head_dim": t.head_k_dim.astype(int),
                                   "latency_us": [float(f"{v * 1000:.4g}") for v in t.latency]})
    return out, set(d.kernel_source)


def card_tables(data: Path, card: str, shapes: set) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """file stem -> rows, and one note per engine naming its version and kernels."""
    out, notes = {}, []
    for engine in ENGINES:
        versions = [p for p in (data / CARDS[card] / "linear_attention" / engine).glob("*")
                    if (p / "gdn_perf.parquet").exists()]
        for folder in sorted(versions, key=lambda p: _version_key(p.name), reverse=True):
            rows, kernels = engine_rows(folder / "gdn_perf.parquet", shapes)
            if rows:
                for phase, r in rows.items():
                    out[f"gdn_{phase}_{engine}"] = r.sort_values(["heads", "kv_heads", "batch", PHASES[phase]])
                notes.append(f"{engine} {folder.name} ({'/'.join(sorted(kernels))})")
                break
    return out, notes


def main(argv=None) -> int:
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: writes <card>/gdn_<phase>_<engine>.csv.gz", argv)
    shapes = gdn_shapes(REPO / "profiles" / "models")
    print(f"shapes: {sorted(shapes)}", file=sys.stderr)
    for card, folder in card_folders(args):
        tables, notes = card_tables(data, card, shapes)
        if not tables:
            print(f"{card}: no Gated DeltaNet kernel measured for these shapes; nothing written", file=sys.stderr)
            continue
        write_tables(folder, tables)
        wheel_note(folder, NOTE, CARDS[card], "each engine's Gated DeltaNet kernels",
                   "linear_attention/<engine>/<version>/gdn_perf.parquet",
                   "convolution and delta rule added per point, the shipped linear-attention models' heads per GPU",
                   notes, "aiconfigurator_gdn.py")
        print(f"{card}: {'; '.join(notes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
