"""The what-if figures: each computes its data with the project's own code and draws it.

Every figure has a data function returning a pandas DataFrame and a ``plot_*`` function returning
a :class:`matplotlib.figure.Figure` (no pyplot state; matplotlib is imported only to draw). The
notebooks under ``notebooks/`` call these, and ``capsim figures --out DIR`` writes every figure
as ``DIR/<name>.png`` with its data as ``DIR/<name>.csv`` (see :data:`FIGURES`), so nothing is
computed only inside a notebook.

Numbers quoted in docstrings are the reference chapter's (sections 3-9, as in tests/chapter8);
``tests/test_figures.py`` checks the figures' data against them.

| figure | question | notebook |
|---|---|---|
| memory-fit | KV per token and per request of every shipped model; requests that fit a budget | 01 |
| reads-per-token | bytes read per output token against batch size, b_KV (figure 8-3) | 01 |
| scheduler-gantt | the four-request example as iteration timelines, r0's output intervals (figure 8-2 style) | 02 |
| token-budget | late arrivals' TTFT against the longest interval, over the token budget | 02 |
| prefix-cache | hit rate and TTFT against KV-cache size on the Mooncake trace (needs ../shared/data) | 03 |
| prefix-value | value per byte of keeping long vs short prefixes (section 6) | 03 |
| speculative-tradeoffs | outputs per round and per-token latency against draft length and acceptance | 04 |
| draft-budget | the draft-time budget crossover (figure 8-32) | 04 |
| speculation-concurrency | when speculation stops paying as concurrency rises (simulated) | 04 |
| goodput-vs-rate | goodput and latency percentiles against arrival rate, Azure conversation trace | 05 |
| replicas | goodput capacity per replica and replicas for a target rate (capsim plan) | 05 |
| memory-deadline-plane | the chapter's schemes A-D on the memory / deadline plane (figure 8-35) | 05 |
"""

from __future__ import annotations

from sim.figures.memory import memory_fit_table, plot_memory_fit, reads_per_token, plot_reads_per_token
from sim.figures.schedulers import iteration_membership, output_times, scheduler_gantt, output_intervals, plot_scheduler_gantt, token_budget_tradeoff, plot_token_budget
from sim.figures.prefix import shared_data_dir, mooncake_trace, prefix_cache_curve, plot_prefix_cache, prefix_value_per_byte, plot_prefix_value
from sim.figures.speculative import speculative_tradeoffs, plot_speculative_tradeoffs, draft_time_budget, plot_draft_time_budget, speculation_vs_concurrency, speculation_crossover, plot_speculation_vs_concurrency
from sim.figures.capacity import goodput_vs_rate, plot_goodput_vs_rate, replicas_needed, plot_replicas, memory_deadline_plane, plot_memory_deadline_plane
from sim.figures.registry import FIGURES, FigureSpec, build_figure, write_figures
from sim.figures.common import CHAPTER8, CHAPTER_MFU, DRAFTER_BYTES, LOOKUP_S, PLAIN_STEP_S, REPO, SCENARIOS  # noqa: F401
from sim.figures.schedulers import POLICIES  # noqa: F401

__all__ = [
    "FIGURES", "FigureSpec", "build_figure", "write_figures", "shared_data_dir", "mooncake_trace",
    "memory_fit_table", "plot_memory_fit", "reads_per_token", "plot_reads_per_token",
    "iteration_membership", "output_times", "scheduler_gantt", "output_intervals", "plot_scheduler_gantt",
    "token_budget_tradeoff", "plot_token_budget",
    "prefix_cache_curve", "plot_prefix_cache", "prefix_value_per_byte", "plot_prefix_value",
    "speculative_tradeoffs", "plot_speculative_tradeoffs", "draft_time_budget", "plot_draft_time_budget",
    "speculation_vs_concurrency", "speculation_crossover", "plot_speculation_vs_concurrency",
    "goodput_vs_rate", "plot_goodput_vs_rate", "replicas_needed", "plot_replicas",
    "memory_deadline_plane", "plot_memory_deadline_plane",
]
