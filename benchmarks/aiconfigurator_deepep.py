"""SGLang's DeepEP path for wide expert parallelism, from the database in the aiconfigurator 0.12.0 wheel, written as
profiles/ops/<card>/moe_deepep_<phase>.csv.gz and deepep_<mode>.csv.gz.

With `--moe-a2a-backend deepep` (its wide-EP recipes' setting on attention-DP workers, sim.published.disagg) SGLang
runs a MoE layer as DeepEP's dispatch of each rank's tokens to their experts' GPUs, the local experts' grouped GEMMs
(DeepGEMM), and DeepEP's combine back. The wheel measures both (Apache-2.0, measured by NVIDIA):

- `moe/sglang/<version>/wideep_{generation,context}_moe_perf.parquet`: the experts' step on one GPU of moe_ep for
  num_tokens tokens over the whole expert group (kernel `deepepmoe`: DeepGEMM's masked grouped GEMM on decodes,
  contiguous on prompts), uniform or power-law routing. Written in the fused-MoE tables' schema
  (sim.models.moe_tables), engine `sglang`, `uniform` as `balanced`, one file per phase;
- `comm/sglang/<version>/wideep_deepep_{ll,normal}_perf.parquet`: DeepEP's dispatch and combine on one node for
  num_token tokens per rank (low-latency mode on decodes, normal mode on prompts: its transmit and notify times at
  the fastest SM count measured). Written as `hidden,topk,experts,tokens,dispatch_us,combine_us`.

Only the shapes of the MoE models under profiles/models; each card's newest version with rows for them.

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_deepep.py --out profiles/ops
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiconfigurator_moe import (COLUMNS, REPO, _version_key, card_folders, moe_shapes, wheel_args,  # noqa: E402
                               wheel_note, write_tables)

ROUTING = {"uniform": "balanced", "power_law_1.2": "power_law_1.2"}
MODES = ("ll", "normal")
DEEPEP_COLUMNS = ["hidden", "topk", "experts", "tokens", "dispatch_us", "combine_us"]
NOTE = " SGLang's DeepEP path (moe_deepep_<phase>.csv.gz, deepep_<mode>.csv.gz):"


def _sig(v: float) -> float:
    return float(f"{v:.4g}")


def moe_rows(path: Path, shapes) -> pd.DataFrame:
    """A wide-EP MoE parquet's rows of `shapes` in the fused-MoE tables' schema."""
    d = pd.read_parquet(path)
    d = d[d.distribution.isin(ROUTING)]
    key = list(zip(d.hidden_size, d.inter_size, d.topk, d.num_experts))
    d = d[[k in shapes for k in key]]
    group = ["moe_dtype", "distribution", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
             "moe_ep_size", "num_tokens"]
    d = d.groupby(group, as_index=False).latency.mean()
    out = pd.DataFrame({"engine": "sglang", "dtype": d.moe_dtype, "routing": d.distribution.map(ROUTING),
                        "hidden": d.hidden_size.astype(int), "inter": d.inter_size.astype(int),
                        "topk": d.topk.astype(int), "experts": d.num_experts.astype(int),
                        "moe_tp": d.moe_tp_size.astype(int), "moe_ep": d.moe_ep_size.astype(int),
                        "tokens": d.num_tokens.astype(int), "latency_us": [_sig(v * 1000) for v in d.latency]})
    return out[COLUMNS].sort_values(COLUMNS[:-1]).reset_index(drop=True)


def deepep_rows(path: Path, shapes) -> pd.DataFrame:
    """A DeepEP parquet's one-node rows of `shapes`' (hidden, topk, experts): low-latency mode's averages, normal
    mode's transmit + notify times at the fastest SM count measured (each side on its own, as the engine's DeepEP
    config tunes them)."""
    d = pd.read_parquet(path)
    keep = {(h, k, e) for h, _, k, e in shapes}
    d = d[d.node_num == 1] if "node_num" in d else d.iloc[0:0]
    d = d[[k in keep for k in zip(d.hidden_size, d.num_topk, d.num_experts)]].copy()
    if "dispatch_avg_t_us" not in d:
        d["dispatch_avg_t_us"] = d.dispatch_transmit_us + d.dispatch_notify_us
        d["combine_avg_t_us"] = d.combine_transmit_us + d.combine_notify_us
    d = d.groupby(["hidden_size", "num_topk", "num_experts", "num_token"], as_index=False).agg(
        dispatch=("dispatch_avg_t_us", "min" if "dispatch_sms" in d else "mean"),
        combine=("combine_avg_t_us", "min" if "combine_sms" in d else "mean"))
    out = pd.DataFrame({"hidden": d.hidden_size.astype(int), "topk": d.num_topk.astype(int),
                        "experts": d.num_experts.astype(int), "tokens": d.num_token.astype(int),
                        "dispatch_us": [_sig(v) for v in d["dispatch"]], "combine_us": [_sig(v) for v in d["combine"]]})
    return out.sort_values(DEEPEP_COLUMNS[:4]).reset_index(drop=True)


def newest(folder: Path, name: str, read, shapes) -> tuple[pd.DataFrame | None, str | None]:
    """The rows of the newest version under `folder` whose `name` file has rows of `shapes`."""
    best = (None, None)
    for path in sorted(folder.glob(f"*/{name}"), key=lambda p: _version_key(p.parent.name)):
        rows = read(path, shapes)
        if len(rows):
            best = (rows, path.parent.name)
    return best


def main(argv=None) -> int:
    from aiconfigurator_moe import CARDS
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: writes <card>/moe_deepep_<phase>.csv.gz and "
                                                    "<card>/deepep_<mode>.csv.gz and notes the source", argv)
    shapes = set(moe_shapes(REPO / "profiles" / "models"))
    for card, folder in card_folders(args):
        system = data / CARDS[card]
        tables, notes = {}, []
        for phase in ("generation", "context"):
            rows, version = newest(system / "moe" / "sglang", f"wideep_{phase}_moe_perf.parquet", moe_rows, shapes)
            if rows is not None:
                tables[f"moe_deepep_{phase}"] = rows
                notes.append(f"moe_deepep_{phase} from sglang {version} ({len(rows)} rows)")
        for mode in MODES:
            rows, version = newest(system / "comm" / "sglang", f"wideep_deepep_{mode}_perf.parquet", deepep_rows,
                                   shapes)
            if rows is not None:
                tables[f"deepep_{mode}"] = rows
                notes.append(f"deepep_{mode} from sglang {version} ({len(rows)} rows)")
        if not tables:
            print(f"{card}: no DeepEP measurements of the shipped shapes", file=sys.stderr)
            continue
        write_tables(folder, tables)
        wheel_note(folder, NOTE, CARDS[card], "SGLang's DeepEP MoE kernels and dispatch / combine",
                   "moe/sglang and comm/sglang", "wideep_*_moe_perf and wideep_deepep_*_perf", notes,
                   "aiconfigurator_deepep.py")
        print(f"{card}: {'; '.join(notes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
