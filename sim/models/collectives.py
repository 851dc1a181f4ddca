"""Collectives over more GPUs than a card's tables measure.

The kernel tables (profiles/ops/<card>/nccl.csv, nccl_parallel.csv, all_reduce_<engine>.csv) time each collective on
the GPU counts one node held when they were measured: 2, 4 and 8 on an HGX board, 2 and 4 on one GB200 / GB300
compute tray. A replica may span more: DeepSeek over 16 or 64 GPUs, a GB200 pool over 8 or 32 GPUs of its NVL72
rack. `Collectives` wraps a table and answers those counts from its measurements and the card's fabric (hardware
profile `scale_up_gpus`, `scale_out_link`), with the structure of NCCL's own cost model (NVIDIA/nccl
src/graph/tuning.cc): a ring's latency is a base plus one hop per step, intra-node hops and network hops, and its
bytes move at the bus bandwidth.

- **Latency** (a message too small for the bandwidth to count): the measured counts' smallest-message times give
  a base a and a hop b per ring step, L(g) = a + b x steps(g) (least squares over the measured counts; steps(n) =
  n - 1 for an all-gather or all-to-all, 2 (n - 1) for an all-reduce). Over n GPUs in N scale-up domains the ring
  has steps(n) steps of which N - 1 (an all-reduce: 2 (N - 1)) cross the network: L(n) = a + b x (steps(n) - inter)
  + inter x NET_STEP_LATENCY_S.
- **Bandwidth** (the rest of the measured time, T(g, B) - L(g)): within the scale-up domain (n <= scale_up_gpus) the
  fabric is the one measured, so its bus bandwidth stays the largest measured count g's (nccl-tests' busBW "should be
  independent of the number of ranks"): the rest scales with the bus factor, ((n - 1) / n) / ((g - 1) / g). Across
  N domains of d GPUs it is hierarchical, as NCCL runs it over rail-connected nodes: the domain's own over d GPUs,
  then each GPU's NIC (scale_out_link) carries its rail's share, (N - 1) / N of B / d bytes for an all-gather,
  twice that for an all-reduce, and (n - d) / n of a GPU's B bytes for an all-to-all (the rest of which stays in
  the domain: B d / n over its d GPUs).
- Engines' own all-reduce kernels (all_reduce_<engine>.csv) are one-node designs: beyond their measured counts the
  engines fall back to NCCL, and so does the model (the NCCL table, extended as above).

A ring's latency is the upper end of what NCCL does: for small all-reduces over many nodes it may pick a tree, and on
NVSwitch systems NVLink SHARP. Point-to-point send/recv (pipeline stages) is the measured 2-GPU time within a
scale-up domain; a stage boundary whose sends cross domains (`stage_crossings`) costs the measured smallest-message
time plus one network hop, and its bytes over the sending GPU's NIC (`send_recv_s`). Nothing here is fitted to serving measurements;
docs/parallel.md "Collectives beyond the measured GPU counts" states it and what it gave on the silicon sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.io.errors import ConfigError

NET_STEP_LATENCY_S = 2.7e-6
"""Latency of one ring step between scale-up domains: NCCL's cost model's network hop for its low-latency protocol,
the one it picks for the small messages where latency counts (NVIDIA/nccl src/graph/tuning.cc, hwLat[NET][Ring][LL],
2.7 us). Stated, not fitted."""

EXTENDED_OPS = ("all_reduce", "all_gather", "alltoall")
"""Collectives answered beyond the measured GPU counts (send_recv is two GPUs by definition)."""


@dataclass(frozen=True)
class Fabric:
    """How a card's GPUs are connected beyond what its tables measured."""

    card: str
    scale_up_gpus: int | None = None
    """GPUs one NVLink / NVSwitch domain holds (hardware profile scale_up_gpus); None: only measured counts."""
    scale_out_bytes_per_s: float | None = None
    """Per-GPU NIC bandwidth between domains (hardware profile scale_out_link); None: no collective leaves a domain."""


def fabric_of(hw) -> Fabric:
    """The fabric a hardware profile states (either part may be absent)."""
    up = getattr(hw, "scale_up_gpus", None)
    link = getattr(hw, "scale_out_link", None)
    bw = link.bandwidth_gbs_per_direction.value if link is not None else None
    return Fabric(hw.name, int(up.value) if up is not None and up.value is not None else None,
                  bw * 1e9 if bw else None)


def _bus_factor(n: int) -> float:
    return (n - 1) / n


class Collectives:
    """A collective table (sim.models.ops_tables.NcclTable) answered on any GPU count the fabric reaches (module)."""

    def __init__(self, table, fabric: Fabric | None, fallback: "Collectives | None" = None):
        self.table, self.fabric, self.fallback = table, fabric or Fabric(""), fallback
        self.path = table.path

    def gpus(self, op: str) -> list[int]:
        """The GPU counts the table measured for `op`."""
        return self.table.gpus(op)

    def why_not(self, op: str, gpus: int) -> str | None:
        """Why `op` over `gpus` GPUs cannot be timed (None: it can)."""
        measured = self.table.gpus(op)
        if gpus in measured:
            return None
        if self.fallback is not None:
            return self.fallback.why_not(op, gpus)
        up, out = self.fabric.scale_up_gpus, self.fabric.scale_out_bytes_per_s
        base = f"{self.path} has no {op} measurement on {gpus} GPUs (measured: {measured})"
        if op not in EXTENDED_OPS or not [g for g in measured if g >= 2]:
            return base
        if up is None:
            return (f"{base}, and {self.fabric.card or 'the card'}'s hardware profile states no scale_up_gpus to "
                    "scale them beyond")
        if gpus <= up:
            return None if [g for g in measured if 2 <= g <= gpus] else base
        if gpus % up:
            return f"{base}; beyond its scale-up domain of {up} GPUs a collective spans whole domains (multiples of {up})"
        if out is None:
            return f"{base}, and {self.fabric.card}'s hardware profile states no scale_out_link between its domains"
        return None

    def at(self, op: str, gpus: int, nbytes: float) -> float:
        """One collective's latency in seconds (measured, or from the measurements and the fabric)."""
        if gpus in self.table.gpus(op):
            return self.table.at(op, gpus, nbytes)
        why = self.why_not(op, gpus)
        if why is not None:
            raise ConfigError(why)
        if self.fallback is not None:
            return self.fallback.at(op, gpus, nbytes)
        up = self.fabric.scale_up_gpus
        if gpus <= up:
            return self._latency(op, gpus, 1) + self._bandwidth_part(op, gpus, nbytes)
        domains, bw = gpus // up, self.fabric.scale_out_bytes_per_s
        if op == "alltoall":
            net = self._bandwidth_part(op, up, nbytes * up / gpus) + (gpus - up) / gpus * nbytes / bw
        else:
            net = self._bandwidth_part(op, up, nbytes) + _passes(op) * _bus_factor(domains) * nbytes / up / bw
        return self._latency(op, gpus, domains) + net

    def send_recv_s(self, nbytes: float, crosses: bool = False) -> float:
        """A pipeline boundary's send of `nbytes` from each GPU of one stage to its peer in the next: as measured
        on two GPUs, or across scale-up domains the measured smallest-message time, a network hop, and the bytes
        over the GPU's NIC."""
        if not crosses:
            return self.at("send_recv", 2, nbytes)
        if self.fabric.scale_out_bytes_per_s is None:
            raise ConfigError(self.cross_domain_why())
        return self.table.at("send_recv", 2, 0.0) + NET_STEP_LATENCY_S + nbytes / self.fabric.scale_out_bytes_per_s

    def boundaries_s(self, nbytes: float, boundaries: int, crossing: int) -> float:
        """`boundaries` pipeline boundaries' sends of `nbytes`, `crossing` of them between scale-up domains."""
        inter = self.send_recv_s(nbytes, True) if crossing else 0.0
        return (boundaries - crossing) * self.send_recv_s(nbytes) + crossing * inter

    def cross_domain_why(self) -> str:
        """Why a send between scale-up domains cannot be timed."""
        return (f"pipeline stages cross {self.fabric.card}'s scale-up domain of {self.fabric.scale_up_gpus} GPUs, and "
                "its hardware profile states no scale_out_link between domains")

    def _latency(self, op: str, gpus: int, domains: int) -> float:
        """The ring's latency over `gpus` GPUs in `domains` scale-up domains (module docstring)."""
        base, hop = self._hops(op)
        inter = _passes(op) * (domains - 1)
        return base + hop * (_steps(op, gpus) - inter) + inter * NET_STEP_LATENCY_S

    def _hops(self, op: str) -> tuple[float, float]:
        """(base, per ring step) of the measured counts' smallest-message times, least squares (exact for two)."""
        counts = [g for g in self.table.gpus(op) if g >= 2]
        xs = [_steps(op, g) for g in counts]
        ys = [self.table.at(op, g, 0.0) for g in counts]
        if len(counts) == 1:
            return 0.0, ys[0] / xs[0]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        hop = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        hop = max(hop, 0.0)
        return my - hop * mx, hop

    def _bandwidth_part(self, op: str, gpus: int, nbytes: float) -> float:
        """What the bytes add over `gpus` GPUs of one domain: the largest measured count's, by the bus factor."""
        g = max(m for m in self.table.gpus(op) if 2 <= m <= gpus)
        rest = max(self.table.at(op, g, nbytes) - self.table.at(op, g, 0.0), 0.0)
        return rest * _bus_factor(gpus) / _bus_factor(g)


def _steps(op: str, gpus: int) -> int:
    return _passes(op) * (gpus - 1)


def _passes(op: str) -> int:
    return 2 if op == "all_reduce" else 1


def table_collectives(tables, fabric: Fabric | None, all_reduce: str = "nccl") -> tuple[Collectives, Collectives]:
    """(the all-reduce, NCCL's collectives) of a table set on `fabric`: the all-reduce is `all_reduce`'s table
    (nccl or an engine's own, step_time.model.all_reduce), falling back to NCCL's beyond its measured counts."""
    nccl = Collectives(tables.nccl(), fabric)
    if all_reduce == "nccl":
        return nccl, nccl
    return Collectives(tables.all_reduce(all_reduce), fabric, fallback=nccl), nccl


def stage_crossings(stage_gpus: int, pp: int, scale_up_gpus: int | None) -> int:
    """Pipeline boundaries (of pp - 1) whose sends leave a scale-up domain: stage s on GPUs s x stage_gpus onward,
    each GPU sending to the one stage_gpus further on; none where the fabric states no domain size."""
    if not scale_up_gpus or pp < 2:
        return 0
    return sum(any(((s - 1) * stage_gpus + j) // scale_up_gpus != (s * stage_gpus + j) // scale_up_gpus
                   for j in range(stage_gpus)) for s in range(1, pp))
