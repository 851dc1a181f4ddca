"""`capsim plan`'s text output: capacity, the rates tried, replicas for the target, the search's ranking, the
step-time model's fit error and, with --step-time-error, how far the answer moves with it."""

from __future__ import annotations

import sys

from sim.io.describe import step_time_line
from sim.planning.sensitivity import sensitivity_lines


def _f(x, fmt="{:.4g}") -> str:
    return "-" if x is None else fmt.format(x)


def print_plan(res, file=None) -> None:
    """The plan as text tables on `file` (stdout by default)."""
    file = file or sys.stdout
    d = res.as_dict()
    cap = d["capacity"]
    n = res.requests_per_run
    print(f"plan {res.scenario}: {res.slo.describe()}, attainment >= {res.target:g} "
          f"({res.replications} replication(s){f' of {n} requests' if n else ''} per rate)", file=file)
    if res.step_time_fit is not None:
        print(step_time_line(res.step_time_fit), file=file)
    if res.capacity_rps is None:
        print(f"goodput capacity: none ({res.note})", file=file)
    else:
        rep = f" ({res.base_replicas} replicas: {_f(res.capacity_rps)} req/s in all)" if res.base_replicas > 1 else ""
        print(f"goodput capacity: {_f(cap['per_replica_rps'])} req/s per replica{rep}", file=file)
        lo, hi = cap["bracket_per_replica_rps"]
        ilo, ihi = cap["interval_per_replica_rps"]
        print(f"  bisection bracket [{_f(lo)}, {_f(hi)}]; interval over seeds [{_f(ilo)}, {_f(ihi)}] req/s per replica",
              file=file)
    for w in getattr(res, "warnings", None) or ():
        print(f"warning: {w}", file=file)
    keys = [k for k in (d["rates"][0] if d["rates"] else {}) if k.startswith("attainment_") and k not in
            ("attainment_min", "attainment_max")]
    print(f"{'rate/replica':>13}{'attain':>8}{'min':>7}{'max':>7}" + "".join(f"{k[11:]:>7}" for k in keys)
          + f"{'goodput/rep':>12}{'TTFT p99':>10}{'E2E p99':>9}", file=file)
    for r in d["rates"]:
        print(f"{r['rate_per_replica_rps']:>13.4f}{r['attainment']:>8.3f}{r['attainment_min']:>7.3f}"
              f"{r['attainment_max']:>7.3f}" + "".join(f"{_f(r[k], '{:.3f}'):>7}" for k in keys)
              + f"{_f(r['request_goodput_rps_per_replica'], '{:.4f}'):>12}{_f(r['ttft_s_p99'], '{:.3f}'):>10}"
              f"{_f(r['e2e_s_p99'], '{:.2f}'):>9}", file=file)
    if res.replicas:
        r = res.replicas
        sim_n = r["simulated_replicas"]
        found = str(sim_n) if sim_n is not None else "more than {}".format(r["max_replicas"])
        print(f"replicas for {r['target_rps']:g} req/s: division {r['division_estimate']:.3f} -> "
              f"{r['division_replicas']}; simulated: {found}", file=file)
        for t in r["tried"]:
            print(f"  {t['replicas']:>4} replicas: attainment {t['attainment']:.4f} "
                  f"[{t['attainment_min']:.4f}, {t['attainment_max']:.4f}]", file=file)
    if res.sensitivity:
        sim_n = (res.replicas or {}).get("simulated_replicas")
        if res.replicas and sim_n is None:
            sim_n = f"more than {res.replicas['max_replicas']}"
        for line in sensitivity_lines(res.sensitivity, cap["per_replica_rps"], sim_n, res.target_rps):
            print(line, file=file)
    if res.search:
        print(f"search at {res.search_rate_rps:g} req/s, ranked by GPU-hours per million good requests:", file=file)
        print(f"{'rank':>4}  {'configuration':<44}{'attain':>8}{'feasible':>9}{'GPU-h/M good':>13}{'J/good':>9}"
              f"{'KV/budget':>10}{'E2E/SLO':>8}", file=file)
        for r in res.search:
            print(f"{r['rank']:>4}  {r['config'][:44]:<44}{r['attainment']:>8.3f}{'yes' if r['feasible'] else 'no':>9}"
                  f"{_f(r['gpu_hours_per_million_good'], '{:.2f}'):>13}{_f(r['energy_j_per_good'], '{:.1f}'):>9}"
                  f"{r['memory_ratio']:>10.2f}{_f(r['deadline_ratio'], '{:.2f}'):>8}", file=file)
