"""`capsim fit`: fit a profile from a serving engine's per-iteration log (or a calibration points CSV,
or splitwise-sim's perf_model.csv). No torch.

Iteration log columns (names mappable with --columns OURS=THEIRS):

    duration_ms | duration_s   iteration wall time (required, one of the two)
    prefill_tokens             new tokens of the sequences in prefill (whole prompts or chunks)   [0]
    prefill_seqs               sequences in prefill                         [1 if prefill_tokens]
    prefill_cached_tokens      tokens already cached for those sequences, summed                  [0]
    prefill_completions        of those, the ones whose prompt completes (sampling its first token;
                               optional: all of them; with it the per-completion term is fitted)
    decode_seqs                sequences decoding one token each                                  [0]
    decode_context_tokens      tokens already cached for the decoding sequences, summed           [0]
    pairs                      causal query-key pairs of the iteration (optional; otherwise derived,
                               taking the prefill sequences as equally long)
    max_context                longest sequence context (optional; for the valid range)
    shared_kv_tokens           of the cached tokens above, those in the sequences' prefix-cache hits
                               (optional [0]; with some, their own per-token cost is fitted)

Rows with the same features are merged (median duration) before fitting.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from calibration import fit as fitmod
from calibration.points import read_points
from sim.api import ModelSpec
from sim.api import HardwareProfile, ModelProfile

CANONICAL = ("duration_ms", "duration_s", "prefill_tokens", "prefill_seqs", "prefill_cached_tokens", "decode_seqs",
             "decode_context_tokens", "pairs", "max_context", "prefill_completions", "shared_kv_tokens")


@dataclass
class FitLogConfig:
    """One `capsim fit`: the log, its format and column mapping, the model and the peaks."""

    log: Path
    model: ModelProfile
    out: Path
    columns: dict[str, str] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    fmt: str | None = None
    hardware: HardwareProfile | None = None
    devices: int | None = None
    dtype: str = "bf16"
    peak_tflops: float | None = None
    bandwidth_gbs: float | None = None
    cuda_graphs: bool = False
    source: str | None = None
    command: str | None = None
    shape_cache_entries: int | None = None
    """The engine's kernel cache size (sim.io.profiles.ShapeCache; vLLM 0.32's CPU build keeps 32): with it,
    the cost of an iteration whose token count was not kept is fitted (`vllm` format only)."""
    shared_kv_form: str = "rereads"
    """Which prefix-cache-hit KV tokens the `vllm` format's shared-KV feature counts: "rereads" (those another
    sequence of the iteration reads too) or "hits" (every one); the profile records it (LinearStepTime)."""


@dataclass
class FitLogResult:
    """What `capsim fit` wrote: the profile, the fit report and the notes on the rows."""

    path: Path
    profile: object
    report: fitmod.FitReport
    extra: list[str]


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        raise ValueError(f"{path}: file not found")
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, expected a log CSV")
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            lines = [line for line in fh if not line.startswith("#")]
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file; expected a log CSV") from None
    try:
        rows = list(csv.DictReader(lines))
    except csv.Error as exc:
        raise ValueError(f"{path}: malformed CSV ({exc})") from None
    for i, row in enumerate(rows, start=2):
        if None in row or any(v is None for v in row.values()):  # DictReader's marks of a ragged row
            header = [k for k in row if k is not None]
            cells = sum(row[k] is not None for k in header) + len(row.get(None) or [])
            raise ValueError(f"{path}: data row {i - 1}: {cells} cells, but the header has {len(header)} columns")
    return rows


def _filter(rows: list[dict[str, str]], where: dict[str, str], path: Path) -> list[dict[str, str]]:
    if not rows:
        raise ValueError(f"{path}: no rows")
    for col in where:
        if col not in rows[0]:
            raise ValueError(f"{path}: --where {col}: no such column; columns: {', '.join(rows[0])}")
    kept = [r for r in rows if all(_same(r[c], v) for c, v in where.items())]
    if not kept:
        asked = " ".join(f"{c}={v}" for c, v in where.items())
        seen = "; ".join(f"{c}: {', '.join(sorted({r[c] for r in rows})[:8])}" for c in where)
        raise ValueError(f"{path}: --where {asked}: no row matches (the file has {seen})")
    return kept


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


def _num(row: dict, col: str, path: Path, default=None, at: str = "", whole: bool = False) -> float:
    """The number in `row[col]` (`at`, e.g. "data row 7: ", says where; `whole`: a count, no fraction)."""
    v = row.get(col)
    if v is None or v == "":
        if default is None:
            raise ValueError(f"{path}: {at}column {col!r} missing or empty")
        return default
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"{path}: {at}column {col!r}: not a number: {v!r}") from None
    if not math.isfinite(f) or f < 0 or f > 1e15:
        raise ValueError(f"{path}: {at}column {col!r}: expected a finite number >= 0, got {v!r}")
    if whole and f != int(f):
        raise ValueError(f"{path}: {at}column {col!r}: expected a whole number (a count of tokens or sequences), "
                         f"got {v!r}")
    return f


@dataclass
class RowCount:
    """What became of a log's rows: read, kept by --where, used, and why the others were dropped."""

    read: int = 0
    kept_by_where: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    ignored_columns: list[str] = field(default_factory=list)

    def drop(self, why: str) -> None:
        """Count one dropped row under its reason."""
        self.dropped[why] = self.dropped.get(why, 0) + 1

    @property
    def used(self) -> int:
        return self.kept_by_where - sum(self.dropped.values())

    def line(self) -> str:
        """`16,417 rows read, 2,535 used; dropped: ...; columns ignored: ...`."""
        parts = [f"{self.read:,} rows read, {self.used:,} used"]
        if self.kept_by_where != self.read:
            parts.append(f"{self.read - self.kept_by_where:,} not matching --where")
        if self.dropped:
            parts.append("dropped: " + ", ".join(f"{n:,} {why}" for why, n in self.dropped.items()))
        if self.ignored_columns:
            parts.append("columns ignored (not ours; map one with --columns OURS=THEIRS): "
                         + ", ".join(self.ignored_columns))
        return "; ".join(parts)


def iteration_observation(prefill_tokens: int, prefill_seqs: int, prefill_cached: int, decode_seqs: int,
                          decode_context: int, time_s: float, pairs: int | None = None,
                          max_context: int | None = None, completions: int | None = None,
                          shape_miss: int = 0, shared_kv: int = 0) -> fitmod.Observation:
    """Features of one logged iteration, in the simulator's terms (`completions`: the prefill sequences
    completing their prompt; None when the log cannot tell, then all of them; `shape_miss`: 1 when the
    engine had to build kernels for the iteration's token count, sim.io.profiles.ShapeCache; `shared_kv`: the
    KV tokens read in the sequences' prefix-cache hits, StepPlan.shared_kv_tokens)."""
    if prefill_tokens and not prefill_seqs:
        prefill_seqs = 1
    if not 0 <= shared_kv <= prefill_cached + decode_context:
        raise ValueError(f"shared_kv_tokens {shared_kv} must lie between 0 and the cached tokens read "
                         f"({prefill_cached} prefill + {decode_context} decode context)")
    if completions is not None and completions > prefill_seqs:
        raise ValueError(f"prefill_completions {completions} > prefill_seqs {prefill_seqs} (only a sequence in "
                         "prefill can complete its prompt)")
    if prefill_seqs:
        n, h = prefill_tokens / prefill_seqs, prefill_cached / prefill_seqs
        prefill_pairs = round(prefill_seqs * (n * h + n * (n + 1) / 2))
    else:
        n = h = 0
        prefill_pairs = 0
    decode_pairs = decode_context + decode_seqs   # a decode token with h cached has h + 1 pairs
    if pairs is not None:
        prefill_pairs = pairs - decode_pairs
        if prefill_pairs < 0:
            raise ValueError(f"pairs {pairs} < decode pairs {decode_pairs} (decode context + decode sequences)")
    if max_context is None:
        max_context = round(max(h + n if prefill_seqs else 0, decode_context / decode_seqs + 1 if decode_seqs else 0))
    kind = "decode" if not prefill_tokens else "prefill" if not decode_seqs else "mixed"
    return fitmod.Observation(
        kind=kind, time_s=time_s, new_tokens=prefill_tokens + decode_seqs, pairs=prefill_pairs + decode_pairs,
        kv_tokens_read=prefill_cached + decode_context, num_seqs=prefill_seqs + decode_seqs, decode_seqs=decode_seqs,
        decode_kv_tokens=decode_context, prefill_seqs=prefill_seqs, prefill_tokens=prefill_tokens,
        prefill_pairs=prefill_pairs, prefill_cached_tokens=prefill_cached, max_context=max(1, max_context),
        prefill_completions=completions, shape_miss=shape_miss, shared_kv_tokens=shared_kv)


def read_iterations(path: Path, columns: dict[str, str], where: dict[str, str],
                    count: RowCount | None = None) -> list[fitmod.Observation]:
    """Observations of a per-iteration log CSV; `count` (if given) learns what became of each row."""
    count = count if count is not None else RowCount()
    unknown = set(columns) - set(CANONICAL)
    if unknown:
        raise ValueError(f"--columns: unknown column(s) {sorted(unknown)}; ours are: {', '.join(CANONICAL)}")
    all_rows = _read_csv(path)
    rows = _filter(all_rows, where, path)
    missing = [f"--columns {ours}={theirs}: no column {theirs!r} in the file"
               for ours, theirs in columns.items() if theirs not in all_rows[0]]
    if missing:  # else named as a missing column of ours (`needs a duration_ms column`), which the file may have
        raise ValueError(f"{path}: {'; '.join(missing)}; columns: {', '.join(all_rows[0])}")
    count.read, count.kept_by_where = len(all_rows), len(rows)
    name = {c: columns.get(c, c) for c in CANONICAL}
    count.ignored_columns = [c for c in (all_rows[0] if all_rows else {})
                             if c not in set(name.values()) and c not in where]
    header = set(rows[0]) if rows else set()
    if name["duration_ms"] not in header and name["duration_s"] not in header:
        raise ValueError(f"{path}: needs a duration_ms or duration_s column (map yours with --columns "
                         f"duration_ms=NAME); columns: {', '.join(sorted(header))}")
    if not ({name["prefill_tokens"], name["decode_seqs"]} & header):
        raise ValueError(f"{path}: needs prefill_tokens and/or decode_seqs columns (map with --columns); "
                         f"columns: {', '.join(sorted(header))}")
    obs = []
    row_of = {id(r): n for n, r in enumerate(all_rows, start=1)}  # a row's place in the file, whatever --where kept
    for r in rows:
        at = f"data row {row_of[id(r)]}: "

        def get(c, default=0.0):
            return _num(r, name[c], path, default, at, whole=c not in ("duration_s", "duration_ms")) \
                if name[c] in r else default
        t = get("duration_s", None) if name["duration_s"] in r and r[name["duration_s"]] != "" else \
            _num(r, name["duration_ms"], path, None, at) / 1e3
        if not t or t <= 0:
            count.drop("with a zero duration")
            continue
        pairs = int(get("pairs")) if name["pairs"] in r and r[name["pairs"]] != "" else None
        maxc = int(get("max_context")) if name["max_context"] in r and r[name["max_context"]] != "" else None
        done = (int(get("prefill_completions")) if name["prefill_completions"] in r
                and r[name["prefill_completions"]] != "" else None)
        pf, ds = int(get("prefill_tokens")), int(get("decode_seqs"))
        if pf == 0 and ds == 0:
            count.drop(f"with neither {name['prefill_tokens']} nor {name['decode_seqs']} > 0")
            continue
        try:
            obs.append(iteration_observation(pf, int(get("prefill_seqs")), int(get("prefill_cached_tokens")), ds,
                                             int(get("decode_context_tokens")), t, pairs, maxc, done,
                                             shared_kv=int(get("shared_kv_tokens"))))
        except ValueError as exc:
            raise ValueError(f"{path}: {at}{exc}") from None
    return obs


def read_splitwise(path: Path, where: dict[str, str]) -> tuple[list[fitmod.Observation], dict[str, str]]:
    """splitwise-sim's perf_model.csv: each row is one request batch; it gives a prefill iteration
    (batch_size x prompt_size new tokens, prompt_time ms) and the mean decode iteration over
    token_size outputs (batch_size sequences, token_time ms; cached context prompt + (token_size - 2)/2
    on average, p + token_size - 1 at most). One (model, hardware, tensor_parallel) group at a time."""
    all_rows = _read_csv(path)
    need = ("model", "hardware", "tensor_parallel", "batch_size", "prompt_size", "token_size", "prompt_time",
            "token_time")
    missing = [c for c in need if c not in (all_rows[0] if all_rows else {})]
    if missing:
        raise ValueError(f"{path}: not a splitwise perf_model.csv: no {', '.join(missing)} column(s) (--format "
                         "splitwise expects " + ", ".join(need) + "; an iteration log is --format iterations)")
    rows = _filter(all_rows, where, path)
    groups = sorted({(r["model"], r["hardware"], r["tensor_parallel"]) for r in rows})
    if len(groups) != 1:
        listing = "; ".join(f"model={m} hardware={h} tensor_parallel={t}" for m, h, t in groups) or "none"
        raise ValueError(f"{path}: select one group with --where (found {len(groups)}: {listing})")
    obs = []
    row_of = {id(r): n for n, r in enumerate(all_rows, start=1)}
    for r in rows:
        at = f"data row {row_of[id(r)]}: "
        b, p, t = (int(_num(r, c, path, None, at, whole=True)) for c in ("batch_size", "prompt_size", "token_size"))
        prompt_s, token_s = (_num(r, c, path, None, at) / 1e3 for c in ("prompt_time", "token_time"))
        if b < 1 or p < 1 or t < 2 or prompt_s <= 0 or token_s <= 0:
            raise ValueError(f"{path}: {at}expected batch_size >= 1, prompt_size >= 1, token_size >= 2 and positive "
                             f"prompt_time / token_time, got {b}, {p}, {t}, {r['prompt_time']!r}, {r['token_time']!r}")
        obs.append(iteration_observation(b * p, b, 0, 0, 0, prompt_s))
        mean_h = p + (t - 2) / 2
        obs.append(iteration_observation(0, 0, 0, b, round(b * mean_h), token_s, max_context=p + t - 1))
    m, h, tp = groups[0]
    return obs, dict(model=m, hardware=h, tensor_parallel=tp)


def merge_duplicates(obs: list[fitmod.Observation]) -> list[fitmod.Observation]:
    """One observation per distinct feature set (median time), ordered by kind and size."""
    groups: dict[tuple, list[fitmod.Observation]] = {}
    for o in obs:
        k = (o.kind, o.new_tokens, o.pairs, o.kv_tokens_read, o.num_seqs, o.decode_seqs, o.prefill_tokens,
             o.prefill_cached_tokens, o.max_context, o.completions, o.shape_miss, o.shared_kv_tokens)
        groups.setdefault(k, []).append(o)
    out = []
    for k in sorted(groups, key=lambda k: (("prefill", "decode", "mixed").index(k[0]), k[4], k[1], k[3])):
        first = groups[k][0]
        out.append(fitmod.Observation(**{**first.__dict__,
                                         "time_s": statistics.median(o.time_s for o in groups[k])}))
    return out


def _check_text_file(path: Path) -> None:
    """An engine log that exists, is a file and is UTF-8 text all through (else a ValueError naming it)."""
    if not path.exists():
        raise ValueError(f"{path}: file not found")
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, expected an engine log file")
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):  # line by line: a UTF-8 character never spans a newline
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}: line {n}: not UTF-8 text; expected an engine log (CSV or JSONL)") from None


def _read_observations(cfg: FitLogConfig) -> tuple[list, str, list[str], int | None, dict]:
    """The log's observations in its format (given or sniffed): (observations, format, notes, devices,
    points meta)."""
    path, fmt = cfg.log, cfg.fmt
    _check_text_file(path)
    if fmt is None:
        head = path.read_text()[:64] if path.exists() else ""
        fmt = "points" if head.startswith("# format=capsim") else "iterations"
        if fmt == "iterations" and path.exists():
            from calibration.engines.vllm_logs import sniff
            fmt = sniff(path) or fmt
    if cfg.columns and fmt != "iterations":
        raise ValueError(f"{path}: --columns maps the columns of a per-iteration log CSV (--format iterations); "
                         f"this file is read as {fmt!r}, whose columns are fixed")
    if cfg.shape_cache_entries and fmt != "vllm":
        raise ValueError(f"{path}: --shape-cache needs the iterations in the order they ran, which only the `vllm` "
                         f"format (the replay driver's iterations.jsonl) has; this log is read as {fmt!r}")
    extra, devices, meta = [], cfg.devices, {}
    if fmt == "points":
        pts = read_points(path)
        obs = [fitmod.Observation.from_row(r) for r in pts.ok_rows
               if all(_same(str(r.get(c)), v) for c, v in cfg.where.items())]
        meta = pts.meta
        if meta.get("model") and meta["model"] != cfg.model.name:
            raise ValueError(f"{path}: points are for model {meta['model']!r}, not {cfg.model.name!r}")
        raw = len(obs)
    elif fmt == "splitwise":
        obs, grp = read_splitwise(path, cfg.where)
        raw = len(obs)
        obs = merge_duplicates(obs)
        if devices is None:
            devices = int(grp["tensor_parallel"])
        extra.append("splitwise group " + " ".join(f"{k}={v}" for k, v in grp.items())
                     + f": {raw} iterations from {raw // 2} rows, {len(obs)} distinct shapes")
    elif fmt in ("vllm", "vllm-log"):
        from calibration.engines.vllm_logs import read_vllm_iterations, read_vllm_log
        rows = (read_vllm_iterations(path, cfg.shape_cache_entries, cfg.shared_kv_form) if fmt == "vllm"
                else read_vllm_log(path))
        obs = [iteration_observation(*row) for row in rows]
        raw = len(obs)
        obs = merge_duplicates(obs)
        extra.append(f"{raw} vLLM iterations ({fmt} format), {len(obs)} distinct shapes")
        if fmt == "vllm-log":
            extra.append("vLLM's iteration-details lines carry no KV context: per-KV-token and pair terms assume "
                         "chunks at position 0 and decodes without context")
    else:
        count = RowCount()
        obs = read_iterations(path, cfg.columns, cfg.where, count)
        raw = len(obs)
        obs = merge_duplicates(obs)
        extra.append(count.line())
        extra.append(f"{raw} logged iterations, {len(obs)} distinct shapes")
    return obs, fmt, extra, devices, meta


def fit_log(cfg: FitLogConfig) -> FitLogResult:
    """Fit a profile from an engine log or points file (cfg) and write it to cfg.out."""
    path = cfg.log
    obs, fmt, extra, devices, meta = _read_observations(cfg)
    if len(obs) < 2:
        raise ValueError(f"{path}: fewer than 2 usable iterations after filtering")
    devices = devices or 1

    peak = bw = None
    if cfg.peak_tflops:
        peak = cfg.peak_tflops * 1e12 * devices
    elif cfg.hardware is not None and cfg.dtype in ("bf16", "fp16"):
        peak = cfg.hardware.peak_flops_per_s(cfg.dtype) * devices
    elif meta.get("matmul_tflops"):
        peak = float(meta["matmul_tflops"]) * 1e12
    if cfg.bandwidth_gbs:
        bw = cfg.bandwidth_gbs * 1e9 * devices
    elif cfg.hardware is not None:
        bw = cfg.hardware.bandwidth_bytes_per_s * devices
    elif meta.get("copy_gbs"):
        bw = float(meta["copy_gbs"]) * 1e9
    roof = fitmod.Roofline(ModelSpec(cfg.model), cfg.dtype, peak, bw)
    if fmt != "points" and (cfg.hardware is not None or cfg.peak_tflops or cfg.bandwidth_gbs):
        # faster than the datasheet allows: a logging error, not a measurement (splitwise's TP-2 batch-64 prefill)
        impossible = [o for o in obs if (peak and roof.mfu(o) > 1) or (bw and roof.mbu(o) > 1)]
        if impossible:
            obs = [o for o in obs if o not in impossible]
            extra.append(f"dropped {len(impossible)} iteration(s) faster than the peaks allow (MFU or MBU > 100%): "
                         + ", ".join(f"{o.kind} {o.num_seqs} seqs x {o.new_tokens // max(1, o.num_seqs)} tokens "
                                     f"in {o.time_s * 1e3:.1f} ms" for o in impossible))
        if len(obs) < 2:
            raise ValueError(f"{path}: fewer than 2 usable iterations after dropping impossible ones")
    report = fitmod.fit_observations(obs, roof, cfg.shape_cache_entries, cfg.shared_kv_form)

    mfus = [roof.mfu(o) for o in obs if o.kind == "prefill"] if peak else []
    mbus = [roof.mbu(o) for o in obs if o.kind == "decode"] if bw else []
    if mfus:
        extra.append(f"prefill MFU {min(mfus):.1%}-{max(mfus):.1%} (median {statistics.median(mfus):.1%}) "
                     f"of {peak / 1e12:g} TFLOP/s")
    if mbus:
        extra.append(f"decode MBU {min(mbus):.1%}-{max(mbus):.1%} (median {statistics.median(mbus):.1%}) "
                     f"of {bw / 1e9:g} GB/s")
    if peak is None and cfg.hardware is not None:  # its datasheet gives bf16/fp16 peaks only
        extra.append(f"hardware {cfg.hardware.name} has no {cfg.dtype} peak FLOP/s (its profile gives bf16/fp16): "
                     "give --peak-tflops for MFU; efficiency model not fitted")
    elif peak is None:
        extra.append("no peak FLOP/s known (give --hardware or --peak-tflops): efficiency model not fitted")
    notes = [f"Fitted by capsim fit from {path.name} ({fmt} format): " + "; ".join(extra) + ".",
             "Held-out: a quarter of the distinct shapes of each kind, picked by a hash of the shape among those "
             "inside the range of the rest; fitted on the rest. "
             + " ".join(line + "." for line in report.lines())]
    if devices > 1:
        notes.append(f"One iteration ran on {devices} devices (tensor parallel): peak_tflops and MBU bandwidth are "
                     f"{devices} x the per-device figures; decode-table bytes are the whole model's.")
    if fmt == "splitwise":
        notes.append("splitwise-sim rows give a prefill iteration (batch x prompt tokens, no cache) and the mean "
                     "decode iteration over token_size outputs (context prompt + (token_size - 2)/2 on average); "
                     f"dtype {cfg.dtype} assumed (the file does not state it).")
    if cfg.model.name not in _known_models():
        notes.append(f"Model {cfg.model.name!r} has no profile in profiles/models (architecture from "
                     f"{cfg.model.source}).")
    profile = fitmod.build_profile(
        model=cfg.model.name, hardware=cfg.hardware.name if cfg.hardware else None, dtype=cfg.dtype,
        cuda_graphs=cfg.cuda_graphs, linear=report.linear, efficiency=report.efficiency,
        valid_range=report.valid_range, fit=report.summary(),
        provenance=fitmod.provenance(source=cfg.source or f"capsim fit {path.name}", date=fitmod.today(),
                                     git_commit=fitmod.git_commit(), grid=f"engine log ({fmt})",
                                     notes="\n".join(notes)))
    header = f"Fitted by `{cfg.command or 'capsim fit'}` on {fitmod.today()}.\nSchema: sim.io.profiles.FittedProfile."
    fitmod.write_profile(profile, cfg.out, header)
    return FitLogResult(Path(cfg.out), profile, report, extra)


def _known_models() -> set[str]:
    from sim.api import known_names
    return set(known_names("models"))
