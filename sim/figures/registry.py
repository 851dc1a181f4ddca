"""Every figure of `capsim figures`: FIGURES, build_figure, write_figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    pass

from sim.figures.common import MOONCAKE_REL
from sim.figures.capacity import goodput_vs_rate, memory_deadline_plane, plot_goodput_vs_rate, plot_memory_deadline_plane, plot_replicas, replicas_needed
from sim.figures.memory import memory_fit_table, plot_memory_fit, plot_reads_per_token, reads_per_token
from sim.figures.prefix import mooncake_trace, plot_prefix_cache, plot_prefix_value, prefix_cache_curve, prefix_value_per_byte, shared_data_dir
from sim.figures.schedulers import POLICIES, output_intervals, plot_scheduler_gantt, plot_token_budget, scheduler_gantt, token_budget_tradeoff
from sim.figures.speculative import draft_time_budget, plot_draft_time_budget, plot_speculation_vs_concurrency, plot_speculative_tradeoffs, speculation_crossover, speculation_vs_concurrency, speculative_tradeoffs


@dataclass(frozen=True)
class FigureSpec:
    """One figure of `capsim figures`: its notebook, what it shows, and how to build it."""

    name: str
    notebook: str
    title: str
    build: Callable[[Path | None], tuple]   # data_dir -> (Figure, {suffix: DataFrame})
    needs_shared_data: bool = False


def _b_memory_fit(_):
    t = memory_fit_table()
    return plot_memory_fit(t), {"": t}


def _b_reads(_):
    t = reads_per_token()
    return plot_reads_per_token(t), {"": t}


def _b_gantt(_):
    g = scheduler_gantt(POLICIES)
    iv = output_intervals()
    return plot_scheduler_gantt(g, iv), {"": g, "-r0-intervals": iv}


def _b_budget(_):
    t = token_budget_tradeoff()
    return plot_token_budget(t), {"": t}


def _b_prefix_cache(data_dir):
    trace = mooncake_trace(data_dir)
    if trace is None:
        raise FileNotFoundError(f"the Mooncake conversation trace is not under {data_dir or shared_data_dir()} "
                                f"({MOONCAKE_REL})")
    t = prefix_cache_curve(trace)
    return plot_prefix_cache(t), {"": t}


def _b_prefix_value(_):
    t = prefix_value_per_byte()
    return plot_prefix_value(t), {"": t}


def _b_spec(_):
    t = speculative_tradeoffs()
    return plot_speculative_tradeoffs(t), {"": t}


def _b_draft_budget(_):
    t = draft_time_budget()
    return plot_draft_time_budget(t), {"": t}


def _b_spec_conc(_):
    t = speculation_vs_concurrency()
    return plot_speculation_vs_concurrency(t), {"": t, "-crossover": speculation_crossover(t)}


def _b_goodput(_):
    t = goodput_vs_rate()
    return plot_goodput_vs_rate(t), {"": t}


def _b_replicas(_):
    rates, reps = replicas_needed()
    return plot_replicas(rates, reps), {"-rates": rates, "": reps}


def _b_plane(_):
    t = memory_deadline_plane()
    return plot_memory_deadline_plane(t), {"": t}


FIGURES: dict[str, FigureSpec] = {f.name: f for f in (
    FigureSpec("memory-fit", "01-memory-fit", "KV per token and requests that fit 12 GiB, every shipped model", _b_memory_fit),
    FigureSpec("reads-per-token", "01-memory-fit", "reads per output token against batch size, b_KV (figure 8-3)", _b_reads),
    FigureSpec("scheduler-gantt", "02-schedulers", "the four-request example: fixed, continuous, chunked", _b_gantt),
    FigureSpec("token-budget", "02-schedulers", "token budget: late arrivals' TTFT vs the longest interval", _b_budget),
    FigureSpec("prefix-cache", "03-prefix-caching", "hit rate and TTFT against KV size, Mooncake trace",
               _b_prefix_cache, needs_shared_data=True),
    FigureSpec("prefix-value", "03-prefix-caching", "value per byte of long vs short prefixes (section 6)", _b_prefix_value),
    FigureSpec("speculative-tradeoffs", "04-speculative", "E[N] and per-token latency vs draft length, acceptance", _b_spec),
    FigureSpec("draft-budget", "04-speculative", "the draft-time budget crossover (figure 8-32)", _b_draft_budget),
    FigureSpec("speculation-concurrency", "04-speculative", "speculation vs plain decode as concurrency rises", _b_spec_conc),
    FigureSpec("goodput-vs-rate", "05-capacity-plan", "goodput and latency percentiles vs arrival rate, Azure trace", _b_goodput),
    FigureSpec("replicas", "05-capacity-plan", "capacity per replica and replicas for 20 req/s (capsim plan)", _b_replicas),
    FigureSpec("memory-deadline-plane", "05-capacity-plan", "schemes A-D on the memory / deadline plane (figure 8-35)", _b_plane),
)}


def build_figure(name: str, data_dir: str | Path | None = None):
    """(Figure, {suffix: DataFrame}) of one figure of :data:`FIGURES`."""
    if name not in FIGURES:
        raise KeyError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    return FIGURES[name].build(Path(data_dir) if data_dir else None)


def write_figures(out_dir: str | Path, only: Iterable[str] | None = None, data_dir: str | Path | None = None,
                  log: Callable[[str], None] | None = None, dpi: int = 110) -> tuple[list[Path], dict[str, str]]:
    """Write `<name>.png` and its data `<name>[suffix].csv` for each figure (all, or `only`).

    A figure that needs the public data folder is skipped when the data is absent, unless it was
    asked for by name in `only` (then FileNotFoundError). Returns (files written, {skipped: reason}).
    """
    names = list(only) if only else list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise KeyError(f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = FIGURES[name]
        try:
            fig, tables = build_figure(name, data_dir)
        except FileNotFoundError as exc:
            if not spec.needs_shared_data or only:
                raise
            skipped[name] = str(exc)
            if log:
                log(f"skipped {name}: {exc}")
            continue
        png = out / f"{name}.png"
        fig.savefig(png, dpi=dpi)
        files.append(png)
        for suffix, table in tables.items():
            csv = out / f"{name}{suffix}.csv"
            table.to_csv(csv, index=False)
            files.append(csv)
        if log:
            log(f"{name}: {spec.title} -> {png}")
    return files, skipped
