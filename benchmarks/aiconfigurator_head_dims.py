"""Attention at head_dim 256 (Qwen3.5's full-attention layers) for capsim's kernel tables, from the database in the
aiconfigurator 0.12.0 wheel, added to profiles/ops/<card>/{context,generation}_attention.csv.gz.

The cards' attention tables come from ../shared/data/profiling/aiconfigurator, whose conversion cut head dims to 64
and 128 (SOURCES.md section 2.1; benchmarks/aiconfigurator_cards.py converts the cards it lacks the same way). The
wheel ships the same vLLM tables uncut. This script converts a card's rows of the head dims asked for exactly as
aiconfigurator_cards.py converts the others (BF16 KV and attention, no window, beam 1; vLLM 0.24.0, A100 0.14.0)
and reduces them as `capsim profile import-ops` does (the prefill kernel's rows on Blackwell, repeats averaged,
microseconds to 4 significant digits). It first reduces the card's head_dim-128 rows the same way and checks them
against the table's own (every key present, latencies within 1e-3 relative: the 4 digits), so the rows added come
from the same database through the same cuts; then it writes the table back with the new head dims' rows in
their sorted place (rows of those head dims already there are replaced, so it can run again).

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_head_dims.py --out profiles/ops --head-dims 256
"""

from __future__ import annotations

import gzip
import io
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aiconfigurator_cards import _attention, same_rows  # noqa: E402
from aiconfigurator_moe import CARDS, VLLM_VERSION, card_folders, wheel_args, wheel_note  # noqa: E402
from capsim.ops_import import _attention as reduce_attention  # noqa: E402

PHASES = {"context": "seq_len", "generation": "kv_len"}
KEYS = ["heads", "kv_heads", "head_dim", "batch"]
NOTE = " Attention at head_dim 256:"


def reduced(data: Path, card: str, phase: str, head_dims: tuple[int, ...]) -> pd.DataFrame:
    """The card's rows of `head_dims` in the table's schema, reduced as import-ops reduces them."""
    raw = _attention(data, CARDS[card], phase, head_dims, VLLM_VERSION.get(card, "0.24.0"))
    buf = Path(f"/tmp/capsim_head_dims_{card}_{phase}.csv")
    reduce_attention(raw, CARDS[card], buf, PHASES[phase], PHASES[phase])
    out = pd.read_csv(buf)
    buf.unlink()
    return out


def main(argv=None) -> int:
    import argparse
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--head-dims", default="256")
    known, rest = pre.parse_known_args(argv)
    head_dims = tuple(int(x) for x in known.head_dims.split(","))
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: adds rows to <card>/*_attention.csv.gz", rest)
    for card, folder in card_folders(args):
        notes = []
        for phase, length in PHASES.items():
            path = folder / f"{phase}_attention.csv.gz"
            table = pd.read_csv(path)
            old = table[table.head_dim == 128]   # reduced to 4 digits on both sides: within 1e-3
            checked = same_rows(old, reduced(data, card, phase, (128,)), [c for c in old.columns if c != "latency_us"],
                                f"{card} {phase} head_dim 128", 1e-3, "latency_us")
            new = reduced(data, card, phase, head_dims)
            if new.empty:
                notes.append(f"{phase}: none measured")
                continue
            both = pd.concat([table[~table.head_dim.isin(head_dims)], new], ignore_index=True)
            both = both.sort_values(KEYS + [length], kind="stable")
            text = io.StringIO()
            both.to_csv(text, index=False, float_format="%.4g", lineterminator="\n")
            with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fh:
                fh.write(text.getvalue().encode())
            notes.append(f"{phase} {len(new)} rows ({checked} head_dim-128 rows checked equal)")
        wheel_note(folder, NOTE, CARDS[card], "vLLM's attention kernels at head_dim "
                   + "/".join(map(str, head_dims)), "attention/vllm/<version>/{context,generation}_attention_perf.parquet",
                   "converted and reduced as the table's other rows", notes, "aiconfigurator_head_dims.py")
        print(f"{card}: {'; '.join(notes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
