"""Published serving measurements: read and check rows in the schema of AIConfigurator's
`silicon_sample.csv` (one real serving run per row: engine, card, model, precision, ISL/OSL,
client concurrency, parallelism, measured TTFT and TPOT).

Every problem is a ConfigError naming the file, the line (1 = the header) and the column.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from sim.io.errors import ConfigError
from sim.published.disagg import PoolShape, concurrency_from_source, pool_shape

REQUIRED = ("id", "backend", "model_path", "system", "mode", "isl", "osl", "batch_size", "tp_size",
            "silicon_ttft_ms", "silicon_tpot_ms")
"""Columns a file must have (the others of the schema are read when present)."""

BACKENDS = ("vllm", "sglang", "trtllm")

NODE_GPUS = {"h100_sxm": 8, "h200_sxm": 8, "b200_sxm": 8, "b300_sxm": 8}
"""GPUs of one node of the sample's HGX systems, where an agg row's replica is one node (InferenceX's runs on them
are single-node)."""


@dataclass(frozen=True)
class PublishedRow:
    """One measured serving run. Parallel sizes default to 1 where the file leaves them empty."""

    line: int
    id: str
    backend: str
    backend_version: str
    model_path: str
    system: str
    precision: str
    gemm_quant_mode: str
    mode: str
    isl: int
    osl: int
    concurrency: int
    """Client concurrency: the silicon_concurrency its source text states (2,824 of the sample's 2,836 agg rows
    state one), else the file's batch_size times attention_dp_size (batch_size is per attention data-parallel
    rank). The two agree on 2,794 agg rows; on 30 (a GB200 TensorRT-LLM collection whose batch_size is a
    fraction of the concurrency, the NVFP4 exports, five gpt-oss rows, one DeepSeek-R1 row) batch_size is not
    the client's concurrency. A disaggregated row's is its source text's."""
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    ttft_ms: float
    tpot_ms: float
    prefill: PoolShape | None = None
    """Disaggregated rows: the prefill pool (prefill_* columns); None for aggregated rows."""
    decode: PoolShape | None = None
    source: str = ""
    """Its silicon_data_source text: where the measurement comes from (sim.published.launches.inferencex)."""
    note: str = ""
    """Where the row's own columns disagree about what was run (its batch_size against its silicon_concurrency; a
    tp_size beyond its node, _node_layout), and what was read."""


def _text(row: dict, col: str) -> str:
    v = row.get(col)
    return "" if v is None else v.strip()


def integer_field(where: str, col: str, raw: str, default: int | None, minimum: int) -> int:
    """A whole number written as 8, 8.0 or 8e0; empty -> default (an error when there is none)."""
    if raw == "":
        if default is None:
            raise ConfigError(f"{where}, column {col}: empty; expected an integer >= {minimum}")
        return default
    try:
        x = float(raw)
    except ValueError:
        raise ConfigError(f"{where}, column {col}: expected an integer >= {minimum}, got {raw!r}") from None
    if not math.isfinite(x) or x != int(x) or x < minimum:
        raise ConfigError(f"{where}, column {col}: expected an integer >= {minimum}, got {raw!r}")
    return int(x)


def positive_field(where: str, col: str, raw: str) -> float:
    """A finite number > 0 (a measured time or rate)."""
    try:
        x = float(raw)
    except ValueError:
        raise ConfigError(f"{where}, column {col}: expected a positive number, got {raw!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{where}, column {col}: expected a positive number, got {raw!r}")
    return x


def parse_row(row: dict, where: str, line: int) -> PublishedRow:
    """Check one CSV record (a dict of column -> text) and build a PublishedRow."""
    for col in ("id", "backend", "model_path", "system", "mode"):
        if _text(row, col) == "":
            raise ConfigError(f"{where}, column {col}: empty; expected a value")
    backend = _text(row, "backend").lower()
    if backend not in BACKENDS:
        raise ConfigError(f"{where}, column backend: expected one of {', '.join(BACKENDS)}, got {_text(row, 'backend')!r}")
    mode = _text(row, "mode").lower()
    if mode not in ("agg", "disagg"):
        raise ConfigError(f"{where}, column mode: expected agg or disagg, got {_text(row, 'mode')!r}")
    # disaggregated rows describe their pools in prefill_* / decode_* columns: batch and tp may be empty
    pool = 0 if mode == "disagg" else None
    ints = {c: integer_field(where, c, _text(row, c), d, m) for c, d, m in (
        ("isl", None, 1), ("osl", None, 1), ("batch_size", pool, 1), ("tp_size", pool, 1), ("pp_size", 1, 0),
        ("attention_dp_size", 1, 0), ("moe_tp_size", 1, 0), ("moe_ep_size", 1, 0))}
    for c in ("pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"):
        ints[c] = max(ints[c], 1)  # the file writes 0 for "not used"
    pools, note = {}, ""
    if mode == "disagg":  # the pools' columns, and the concurrency the source text states
        pools = {p: pool_shape(row, p + "_", where, integer_field, _text) for p in ("prefill", "decode")}
        if ints["batch_size"] == 0:
            ints["batch_size"] = concurrency_from_source(_text(row, "silicon_data_source"), where)
    else:  # the client's concurrency where the source text states it, else the batch over all ranks
        stated = concurrency_from_source(_text(row, "silicon_data_source"), where)
        by_batch = ints["batch_size"] * ints["attention_dp_size"]
        if stated and stated != by_batch:
            note = (f"client concurrency {stated} from silicon_concurrency; batch_size x attention_dp_size = "
                    f"{ints['batch_size']} x {ints['attention_dp_size']} = {by_batch} disagrees")
        ints["batch_size"] = stated or by_batch
        note = "; ".join(n for n in (note, _node_layout(_text(row, "system").lower(), ints)) if n)
    return PublishedRow(
        line=line, id=_text(row, "id"), backend=backend, backend_version=_text(row, "backend_version"),
        model_path=_text(row, "model_path"), system=_text(row, "system").lower(),
        precision=_text(row, "precision").lower(), gemm_quant_mode=_text(row, "gemm_quant_mode").lower(),
        mode=mode, isl=ints["isl"], osl=ints["osl"], concurrency=ints["batch_size"], tp=ints["tp_size"],
        pp=ints["pp_size"], attention_dp=ints["attention_dp_size"], moe_tp=ints["moe_tp_size"],
        moe_ep=ints["moe_ep_size"], ttft_ms=positive_field(where, "silicon_ttft_ms", _text(row, "silicon_ttft_ms")),
        tpot_ms=positive_field(where, "silicon_tpot_ms", _text(row, "silicon_tpot_ms")),
        source=_text(row, "silicon_data_source"), note=note, **pools)


def _node_layout(system: str, ints: dict) -> str:
    """Read an HGX agg row whose tp_size, or attention_dp_size at tp 1, is its experts' moe_tp x moe_ep, more GPUs
    than its one node holds, as the node it ran on: tp_size (attention_dp_size) / moe_tp GPUs, the experts split
    moe_ep ways (moe_tp 1). The sample states 193 agg rows so at tp, on B200 and B300 under SGLang and TensorRT-LLM
    (165 DeepSeek-R1 / V3, 28 Qwen3.5): 106 at tp 64 (moe_tp 8 x moe_ep 8) and 87 at tp 16 (4 x 4). The 63 of them
    whose numbers another row of the file repeats exactly are stated there as tp 8, moe_tp 1, moe_ep 8 and tp 4,
    moe_tp 1, moe_ep 4. And 31 TensorRT-LLM B200 rows at attention dp (20 at dp 64 = 8 x 8, 11 at dp 16 = 4 x 4):
    InferenceX's B200 runs are single-node, so they read as dp 8 (4), moe_ep 8 (4). Changes `ints` in place;
    returns the row's note ("" when it reads as stated)."""
    node = NODE_GPUS.get(system)
    tp, dp, moe_tp, moe_ep = ints["tp_size"], ints["attention_dp_size"], ints["moe_tp_size"], ints["moe_ep_size"]
    field = "tp_size" if dp <= 1 else "attention_dp_size"
    gpus = tp if dp <= 1 else dp
    if node is None or gpus <= node or (dp > 1 and tp != 1) or min(moe_tp, moe_ep) < 2 or moe_tp * moe_ep != gpus \
            or gpus // moe_tp > node:
        return ""
    ints[field], ints["moe_tp_size"] = gpus // moe_tp, 1
    read = f"tp {ints['tp_size']}" if dp <= 1 else f"attention dp {ints['attention_dp_size']}, tp 1"
    how = ("as the same runs' rows elsewhere in the file state it" if dp <= 1 else
           "the single node InferenceX's B200 runs use, as its tp_size rows of the same form read")
    return f"{field} {gpus} = moe_tp {moe_tp} x moe_ep {moe_ep} exceeds one {node}-GPU node; read as {read}, " \
           f"moe_tp 1, moe_ep {moe_ep}, {how}"


def read_published(path: str | Path) -> list[PublishedRow]:
    """All rows of a silicon-sample-schema CSV; the first malformed row raises, naming line and column."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")  # a byte-order mark (Excel's CSV UTF-8) is skipped
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    rows: list[PublishedRow] = []
    seen: dict[str, int] = {}
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = reader.fieldnames or []
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: line 1: not a UTF-8 text file") from None
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise ConfigError(f"{path}: line 1: missing column(s) {', '.join(missing)}; expected the schema of "
                              "aiconfigurator's silicon_sample.csv")
        start = 2
        try:
            for rec in reader:
                where = f"{path}: line {start}"
                if None in rec:
                    raise ConfigError(f"{where}: {len(header) + len(rec[None])} fields, the header has {len(header)}")
                if all(v is None or v.strip() == "" for v in rec.values()):
                    start = reader.line_num + 1
                    continue
                if any(v is None for v in rec.values()):
                    short = [c for c, v in rec.items() if v is None]
                    raise ConfigError(f"{where}, column {short[0]}: missing (the row has fewer fields than the header)")
                row = parse_row(rec, where, start)
                if row.id in seen:
                    raise ConfigError(f"{where}, column id: {row.id!r} repeats line {seen[row.id]}")
                seen[row.id] = start
                rows.append(row)
                start = reader.line_num + 1
        except csv.Error as exc:
            raise ConfigError(f"{path}: line {reader.line_num}: malformed CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start} of a chunk cannot be decoded)") from None
    if not rows:
        raise ConfigError(f"{path}: no rows (only a header)")
    return rows


def multi_gpu_lines(path: str | Path) -> set[int]:
    """Lines of a silicon-sample file whose replica (or a pool's worker) spans several GPUs: tp, pp, moe_ep or
    attention_dp above 1 (issue [parallel]'s rows)."""
    return {r.line for r in read_published(path) if r.tp > 1 or r.pp > 1 or r.moe_ep > 1 or r.attention_dp > 1}
