"""Fits step-time models to measured iterations and writes profiles/fitted/*.yaml (sim.io.profiles schema).

Two models, the two the simulator evaluates (sim.models.step_time):
- linear: T = c + a*new tokens + p*pairs + r*KV tokens read + s*sequences + d*decode sequences
  (+ f*prompts completed, where the points tell completing prefill chunks from the others: an engine's
  log does, a grid whose every prefill ends its prompt does not, and there f stays 0), least squares on
  relative error (rows weighted by 1/measured time), coefficients kept >= 0;
- efficiency: a decode table (time against weight + KV bytes read, made non-decreasing by isotonic
  regression) and a prefill MFU table (median MFU per prefill token count).
Both are fitted on about 75% of the points; the rest (a quarter of each kind, chosen by a hash of the
shape among the points inside the others' range) is held out and its error is what the profile
states. Predictions go through sim.models.step_time so the stated error is the error the simulator will make.
No torch here.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.optimize import nnls

from sim.api import ConfigError, EfficiencyModel, ExtrapolationError, LinearModel
from sim.api import ModelSpec
from sim.api import (EfficiencyStepTime, FitSummary, FittedProfile, LinearStepTime, MFUPoint, Provenance,
                         ShapeCache, TablePoint, ValidRange, load_fitted)
from sim.api import StepPlan
from sim.api import forward_flops, iteration_bytes, mbu, mfu
from sim.api import dump_yaml, validate_mapping

LINEAR_FEATURES = ("const", "new_tokens", "pairs", "kv_tokens_read", "num_seqs", "decode_seqs", "prefill_completions")
_LINEAR_FIELDS = ("constant_s", "per_new_token_s", "per_pair_s", "per_kv_token_s", "per_sequence_s",
                  "per_decode_sequence_s", "per_prefill_completion_s")
HOLDOUT_EVERY = 4  # every 4th point of each kind is held out (25%)


@dataclass
class Observation:
    """One iteration: the simulator's features and its measured duration."""

    kind: str
    time_s: float
    new_tokens: int
    pairs: int
    kv_tokens_read: int
    num_seqs: int
    decode_seqs: int
    decode_kv_tokens: int
    prefill_seqs: int
    prefill_tokens: int
    prefill_pairs: int
    max_context: int
    prefill_cached_tokens: int = 0
    logits: int | None = None
    key: str | None = None
    prefill_completions: int | None = None
    """Prefill sequences completing their prompt; None: as many as the logit rows of prefills say (all
    of them without a `logits` count)."""
    shape_miss: int = 0
    """1 when the engine built kernels for this iteration's token count (sim.io.profiles.ShapeCache)."""
    shared_kv_tokens: int = 0
    """Of kv_tokens_read, those in the sequences' prefix-cache hits the fit prices apart (StepPlan.shared_kv_tokens,
    re-reads, or StepPlan.hit_kv_tokens, every hit token: the plan carries it as both)."""

    @classmethod
    def from_row(cls, row: dict) -> "Observation":
        """An observation from a points-CSV row (unknown columns ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: row[k] for k in names if k in row})

    @property
    def n_logits(self) -> int:
        return self.logits if self.logits is not None else self.num_seqs

    @property
    def completions(self) -> int:
        """Prefill sequences completing their prompt (each samples its first token)."""
        if self.prefill_completions is not None:
            return self.prefill_completions
        if self.logits is not None:
            return min(self.prefill_seqs, max(0, self.logits - self.decode_seqs))
        return self.prefill_seqs

    def vector(self) -> list[float]:
        """The linear model's features: 1, new tokens, attention pairs, KV tokens read outside prefix-cache hits,
        sequences, decodes, prompts completed; then a shape miss and its tokens (the shape cache's two terms),
        and the KV tokens read in prefix-cache hits (all KV tokens are one feature when none are)."""
        return [1.0, self.new_tokens, self.pairs, self.kv_tokens_read - self.shared_kv_tokens, self.num_seqs,
                self.decode_seqs, self.completions, self.shape_miss, self.shape_miss * self.new_tokens,
                self.shared_kv_tokens]

    def plan(self) -> StepPlan:
        """The StepPlan a scheduler would build for this iteration, for sim.models.step_time. `completions`
        of the prefill sequences finish their prompt (one logit row each); decodes are plain, not
        speculative (they enter as the decode set's aggregate, which is all sim.models.step_time reads of them)."""
        plan = StepPlan(num_seqs=self.prefill_seqs, new_tokens=self.prefill_tokens, pairs=self.prefill_pairs,
                        prefill_tokens=self.prefill_tokens, prefill_pairs=self.prefill_pairs,
                        prefill_logits=self.completions, prefill_seqs=self.prefill_seqs,
                        kv_tokens_read=self.kv_tokens_read - self.decode_kv_tokens, max_context=self.max_context,
                        shared_kv_tokens=self.shared_kv_tokens, hit_kv_tokens=self.shared_kv_tokens)
        if self.prefill_seqs:
            n = self.prefill_tokens // self.prefill_seqs
            h = self.prefill_cached_tokens // self.prefill_seqs
            plan.items = [(SimpleNamespace(in_prefill=True, adapter=None), n, h)] * self.prefill_seqs
        if self.decode_seqs:
            plan.add_decodes(self.decode_seqs, self.decode_kv_tokens, self.max_context)
        return plan


# ---------------------------------------------------------------------------------------------
# Roofline per point (sim.models.roofline: the simulator's arithmetic)


@dataclass(frozen=True)
class Roofline:
    """The simulator's roofline arithmetic for one model on one device: FLOPs, bytes, MFU and MBU of a point."""
    spec: ModelSpec
    fmt: str                    # weight and KV format (bf16, fp16, fp32)
    peak_flops_per_s: float | None
    bandwidth_bytes_per_s: float | None

    @property
    def weight_read_bytes(self) -> float:
        return self.spec.weight_read_bytes(self.fmt)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.spec.kv_bytes_per_token(self.fmt)

    def flops(self, o: Observation) -> float:
        """FLOPs of the observed iteration."""
        return forward_flops(self.spec, o.new_tokens, o.pairs, o.n_logits)

    def bytes_read(self, o: Observation) -> float:
        """Weights once + every sequence's cached KV (reference section 4's D = D_w + sum L k)."""
        return iteration_bytes(self.weight_read_bytes, self.kv_bytes_per_token, o.kv_tokens_read)

    def decode_bytes(self, o: Observation) -> float:
        """What the efficiency model's decode table is indexed by (sim.models.step_time.EfficiencyModel.decode_s)."""
        return iteration_bytes(self.weight_read_bytes, self.kv_bytes_per_token, o.decode_kv_tokens)

    def mfu(self, o: Observation) -> float | None:
        """Achieved MFU of the observed iteration (None without a peak)."""
        return None if not self.peak_flops_per_s else mfu(self.flops(o), o.time_s, self.peak_flops_per_s)

    def mbu(self, o: Observation) -> float | None:
        """Achieved MBU of the observed iteration (None without a bandwidth)."""
        return None if not self.bandwidth_bytes_per_s else mbu(self.bytes_read(o), o.time_s, self.bandwidth_bytes_per_s)

    def prefill_mfu(self, o: Observation) -> float:
        """MFU of a prefill-only iteration, counting its prefill FLOPs only."""
        f = forward_flops(self.spec, o.prefill_tokens, o.prefill_pairs, o.prefill_seqs)
        return mfu(f, o.time_s, self.peak_flops_per_s)


# ---------------------------------------------------------------------------------------------
# Fits


def _split_key(o: Observation) -> str:
    ident = o.key or (f"{o.kind}:{o.new_tokens}:{o.pairs}:{o.kv_tokens_read}:{o.num_seqs}:{o.decode_seqs}:"
                      f"{o.prefill_tokens}:{o.max_context}")
    if o.key is None and o.completions != o.prefill_seqs:   # (the hash of every other shape stays as it was)
        ident += f":{o.completions}"
    if o.key is None and o.shape_miss:
        ident += ":miss"
    return hashlib.sha256(ident.encode()).hexdigest()


_RANGE_FEATURES = ("new_tokens", "kv_tokens_read", "num_seqs", "decode_kv_tokens", "prefill_tokens", "max_context")


def split_heldout(obs: list[Observation]) -> tuple[list[Observation], list[Observation]]:
    """Deterministic split: a quarter of each kind (rounded down) is held out. Candidates are taken in
    the order of a hash of their shape (independent of the order of measurement, no aliasing with a
    grid's regular layout); one is held out only if every feature of it stays within the range of the
    points left for fitting, so that held-out errors measure interpolation, not extrapolation."""
    by_kind: dict[str, list[Observation]] = {}
    for o in obs:
        by_kind.setdefault(o.kind, []).append(o)
    held = set()
    for group in by_kind.values():
        want = len(group) // HOLDOUT_EVERY
        keep = list(group)
        for cand in sorted(group, key=_split_key):
            if want == 0:
                break
            rest = [o for o in keep if o is not cand]
            if rest and all(min(getattr(o, f) for o in rest) <= getattr(cand, f) <= max(getattr(o, f) for o in rest)
                            for f in _RANGE_FEATURES):
                keep = rest
                held.add(id(cand))
                want -= 1
    return [o for o in obs if id(o) not in held], [o for o in obs if id(o) in held]


def fit_linear(obs: list[Observation], shape_entries: int | None = None,
               shared_kv_form: str = "rereads") -> LinearStepTime:
    """Non-negative least squares on relative error: minimise sum(((X b - t) / t)^2), b >= 0. The
    prompt-completion term is fitted only when some prefill sequence does not complete its prompt:
    otherwise it equals sequences minus decodes and cannot be told apart (it stays 0). With
    `shape_entries` and some shape misses among the points, the shape cache's terms are fitted too; with
    KV tokens read in prefix-cache hits among the points, their own per-token cost (per_shared_kv_token_s;
    `shared_kv_form` says which hit tokens the points' shared_kv_tokens counted, and the profile records it)."""
    if not obs:
        raise ValueError("no points to fit")
    X = np.array([o.vector() for o in obs], dtype=float)
    if all(o.completions == o.prefill_seqs for o in obs):
        X[:, 6] = 0.0
    shapes = bool(shape_entries) and any(o.shape_miss for o in obs)
    if not shapes:
        X[:, 7:9] = 0.0
    shared = any(o.shared_kv_tokens for o in obs)
    t = np.array([o.time_s for o in obs], dtype=float)
    A = X / t[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0   # a feature absent from the data gets coefficient 0
    z, _ = nnls(A / scale, np.ones(len(obs)), maxiter=50 * A.shape[1])
    coef = z / scale
    fields = {f: float(c) for f, c in zip(_LINEAR_FIELDS, coef)}
    if shapes:
        fields["shape_cache"] = ShapeCache(entries=shape_entries, miss_s=float(coef[7]), per_miss_token_s=float(coef[8]))
    if shared:
        fields["per_shared_kv_token_s"] = float(coef[9])
        fields["shared_kv_form"] = shared_kv_form
    return LinearStepTime(**fields)


def _isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pool-adjacent-violators: the non-decreasing sequence closest to y in weighted least squares."""
    vals, wts, lens = [], [], []
    for yi, wi in zip(y, w):
        vals.append(float(yi))
        wts.append(float(wi))
        lens.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            wsum = wts[-2] + wts[-1]
            v = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum
            vals[-2:], wts[-2:], lens[-2:] = [v], [wsum], [lens[-2] + lens[-1]]
    return np.repeat(vals, lens)


def fit_decode_table(obs: list[Observation], roof: Roofline) -> list[TablePoint]:
    """Median time per distinct bytes read, made non-decreasing; flat runs keep their end points."""
    by_bytes: dict[float, list[float]] = {}
    for o in obs:
        if o.kind == "decode":
            by_bytes.setdefault(float(roof.decode_bytes(o)), []).append(o.time_s)
    if not by_bytes:
        return []
    xs = sorted(by_bytes)
    ys = np.array([statistics.median(by_bytes[x]) for x in xs])
    fitted = _isotonic(ys, np.array([len(by_bytes[x]) for x in xs], dtype=float))
    keep = [i for i in range(len(xs))
            if i in (0, len(xs) - 1) or not (fitted[i - 1] == fitted[i] == fitted[i + 1])]
    return [TablePoint(bytes=xs[i], time_s=float(fitted[i])) for i in keep]


def fit_prefill_mfu(obs: list[Observation], roof: Roofline) -> list[MFUPoint]:
    """The efficiency model's MFU table: median MFU of the prefill points at each token count."""
    by_tokens: dict[int, list[float]] = {}
    for o in obs:
        if o.kind == "prefill":
            by_tokens.setdefault(o.prefill_tokens, []).append(roof.prefill_mfu(o))
    return [MFUPoint(new_tokens=n, mfu=float(min(1.0, max(1e-9, statistics.median(v)))))
            for n, v in sorted(by_tokens.items())]


def fit_efficiency(obs: list[Observation], roof: Roofline) -> EfficiencyStepTime | None:
    """None when the points lack decode-only or prefill-only iterations, or no peak is known."""
    if not roof.peak_flops_per_s:
        return None
    table, mfus = fit_decode_table(obs, roof), fit_prefill_mfu(obs, roof)
    if not table or not mfus:
        return None
    return EfficiencyStepTime(decode_table=table, prefill_mfu=mfus, peak_tflops=roof.peak_flops_per_s / 1e12)


# ---------------------------------------------------------------------------------------------
# Errors, through the simulator's evaluators


def predictor(cfg: LinearStepTime | EfficiencyStepTime, roof: Roofline):
    """A function point -> predicted seconds, through the simulator's own step-time model for `cfg`."""
    if isinstance(cfg, LinearStepTime):
        model = LinearModel(cfg)
        sc = cfg.shape_cache
        if sc is not None:   # the executor's shape-cache cost, as the simulator adds it (sim.models.step_time.KeptShapes)
            return lambda o: model.step_s(o.plan()) + (sc.miss_s + sc.per_miss_token_s * o.new_tokens) * o.shape_miss
    else:
        model = EfficiencyModel(cfg, roof.spec, roof.weight_read_bytes, roof.kv_bytes_per_token,
                                roof.peak_flops_per_s or 0.0, allow_extrapolation=True)
    return lambda o: model.step_s(o.plan())


@dataclass
class Errors:
    """How far predictions are from measured times: count, mean and worst absolute relative error."""
    n: int
    mape: float
    max_abs_rel_err: float
    r2: float | None

    @classmethod
    def of(cls, pred, obs: list[Observation]) -> "Errors | None":
        """The errors of `pred` on `obs` (None for no points)."""
        if not obs:
            return None
        t = np.array([o.time_s for o in obs])
        p = np.array([pred(o) for o in obs])
        rel = np.abs(p / t - 1.0)
        ss = float(((t - t.mean()) ** 2).sum())
        r2 = 1.0 - float(((p - t) ** 2).sum()) / ss if ss > 0 and len(obs) > 1 else None
        return cls(len(obs), float(rel.mean()), float(rel.max()), r2)

    def text(self) -> str:
        """"MAPE x%, max y% over n points"."""
        return f"MAPE {self.mape:.1%}, max {self.max_abs_rel_err:.1%} over {self.n} points"


@dataclass
class FitReport:
    """Both fitted models with their training and held-out errors."""
    linear: LinearStepTime
    efficiency: EfficiencyStepTime | None
    n_points: int
    n_heldout: int
    errors: dict[str, Errors | None] = field(default_factory=dict)   # "linear/heldout", "efficiency/train", ...
    valid_range: ValidRange | None = None

    def summary(self) -> FitSummary:
        """The profile's `fit`: held-out error of the linear model (the efficiency model's is in notes)."""
        e = self.errors.get("linear/heldout") or self.errors["linear/train"]
        return FitSummary(n_points=self.n_points, n_heldout=self.n_heldout, mape=e.mape,
                          max_abs_rel_err=e.max_abs_rel_err, r2=e.r2)

    def lines(self) -> list[str]:
        """The report as text lines (one per model and split)."""
        out = []
        for name in ("linear", "efficiency"):
            for part in ("heldout", "train"):
                e = self.errors.get(f"{name}/{part}")
                if e is not None:
                    out.append(f"{name} model, {'held-out' if part == 'heldout' else 'fitted'} points: {e.text()}")
        return out


def fit_observations(obs: list[Observation], roof: Roofline, shape_entries: int | None = None,
                     shared_kv_form: str = "rereads") -> FitReport:
    """Fit the linear and efficiency models on a training split and state their held-out error
    (`shape_entries`, `shared_kv_form`: fit_linear's)."""
    if len(obs) < 2:
        raise ValueError(f"need at least 2 measured points to fit, got {len(obs)}")
    train, test = split_heldout(obs)
    lin = fit_linear(train, shape_entries, shared_kv_form)
    eff = fit_efficiency(train, roof)
    rep = FitReport(lin, eff, len(obs), len(test), valid_range=valid_range_of(obs))
    for name, cfg in (("linear", lin), ("efficiency", eff)):
        if cfg is None:
            continue
        pred = predictor(cfg, roof)
        try:
            rep.errors[f"{name}/heldout"] = Errors.of(pred, test)
            rep.errors[f"{name}/train"] = Errors.of(pred, train)
        except ExtrapolationError as exc:  # a held-out point beyond what the training points measured
            raise ConfigError(f"the fitted {name} model cannot time every measured point ({exc}); the log has too few "
                              "distinct prefill sizes to fit it: log more, or check the --columns mapping") from None
    return rep


def valid_range_of(obs: list[Observation]) -> ValidRange:
    """The range the measurements cover (batch, new tokens, context): outside it, predictions extrapolate."""
    return ValidRange(max_batch=max(o.num_seqs for o in obs), max_new_tokens=max(o.new_tokens for o in obs),
                      max_context_tokens=max(o.max_context for o in obs))


# ---------------------------------------------------------------------------------------------
# Writing


def git_commit(repo: Path | None = None) -> str | None:
    """The repository's HEAD commit (marked dirty when the tree has changes), or None outside git."""
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def today() -> str:
    """Today's date (UTC) as YYYY-MM-DD, for a profile's provenance."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")


def build_profile(**fields) -> FittedProfile:
    """Validate through the schema the simulator reads (errors name the field)."""
    data = {k: v for k, v in fields.items() if v is not None}
    return validate_mapping(FittedProfile, _plain(data), "fitted profile")


def _plain(v):
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json", exclude_none=True)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def write_profile(profile: FittedProfile, path: str | Path, header: str) -> FittedProfile:
    """Write the YAML and load it back through sim.io.profiles.load_fitted (the reader's path)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = dump_yaml(profile.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110,
                     allow_unicode=True)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    path.write_text(comment + body, encoding="utf-8")
    back = load_fitted(path)
    if back != profile:
        raise AssertionError(f"{path}: profile changed in the YAML round trip")
    return back


def provenance(**fields) -> Provenance:
    """A Provenance with the fields that are known."""
    return Provenance(**{k: v for k, v in fields.items() if v is not None})
