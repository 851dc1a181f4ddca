"""Collectives over more GPUs than a card's tables measure (sim.models.collectives)."""

from __future__ import annotations

import pytest

from sim.io.errors import ConfigError
from sim.io.profiles import load_hardware
from sim.models.collectives import NET_STEP_LATENCY_S, Collectives, Fabric, fabric_of, table_collectives
from sim.models.ops_tables import load_table_set

MB = 1 << 20


def _nccl(card: str) -> Collectives:
    return Collectives(load_table_set(card).nccl(), fabric_of(load_hardware(card)))


def test_shipped_fabrics():
    """HGX boards hold 8 GPUs behind one NIC each, an NVL72 rack 72 behind NVLink; L40S states none."""
    for card, up, gbs in (("h100-sxm", 8, 50), ("h200-sxm", 8, 50), ("b200", 8, 50), ("b300", 8, 100),
                          ("gb200", 72, 50), ("gb300", 72, 100)):
        assert fabric_of(load_hardware(card)) == Fabric(card, up, gbs * 1e9)
    assert fabric_of(load_hardware("l40s")) == Fabric("l40s", None, None)


def test_measured_counts_are_the_table():
    c = _nccl("h100-sxm")
    for op in ("all_reduce", "all_gather"):
        for g in (2, 4, 8):
            for b in (4096, MB, 64 * MB):
                assert c.at(op, g, b) == c.table.at(op, g, b)
                assert c.why_not(op, g) is None


class _Only:
    """A table with some of its GPU counts hidden (to hold them out)."""

    def __init__(self, table, keep):
        self.table, self.keep, self.path = table, keep, table.path

    def gpus(self, op):
        return [g for g in self.table.gpus(op) if g in self.keep]

    def at(self, *args):
        return self.table.at(*args)


@pytest.mark.parametrize("card", ["h100-sxm", "h200-sxm", "b200", "b300", "a100-80g-sxm"])
def test_eight_gpus_predicted_from_two_and_four_against_their_measurement(card):
    """Held out: an HGX board's 8-GPU collectives from its 2- and 4-GPU measurements alone, against the 8-GPU
    measurement, from latency-bound to bandwidth-bound messages (measured 2026-12-07: within 11% at 0-1 MiB, within
    32% at 16-256 MiB on every NVSwitch card; docs/parallel.md)."""
    t = load_table_set(card).nccl()
    held = Collectives(_Only(t, (2, 4)), Fabric(card, 8, 50e9))
    for op in ("all_reduce", "all_gather"):
        for b in (0, 64 << 10, 1 << 20):
            assert held.at(op, 8, b) == pytest.approx(t.at(op, 8, b), rel=0.11)
        for b in (16 << 20, 256 << 20):
            assert held.at(op, 8, b) == pytest.approx(t.at(op, 8, b), rel=0.33)


def test_within_the_scale_up_domain():
    """GB200 measures 2 and 4 GPUs of a tray; 8 to 72 of its rack: the latency line through the measured counts'
    smallest messages (base + hop per ring step), the rest by the bus factor."""
    c = _nccl("gb200")
    t = c.table
    for op, steps in (("all_reduce", lambda n: 2 * (n - 1)), ("all_gather", lambda n: n - 1)):
        l2, l4 = t.at(op, 2, 0.0), t.at(op, 4, 0.0)
        hop = (l4 - l2) / (steps(4) - steps(2))   # two points: the line through them
        assert c.at(op, 8, 0.0) == pytest.approx(l2 + hop * (steps(8) - steps(2)))
        big = t.at(op, 4, 256 * MB) - l4
        assert c.at(op, 8, 256 * MB) == pytest.approx(c.at(op, 8, 0.0) + big * (7 / 8) / (3 / 4))
        times = [c.at(op, n, 256 * MB) for n in (4, 8, 16, 32, 72)]
        assert times == sorted(times)
    # the rack's 8 GPUs from its tray's 2 and 4 land on what an HGX B200 board measures on 8 (same NVLink 5)
    b200 = load_table_set("b200").nccl()
    for op in ("all_reduce", "all_gather"):
        assert c.at(op, 8, 0.0) == pytest.approx(b200.at(op, 8, 0.0), rel=0.05)


def test_across_domains_each_nic_carries_its_rails_share():
    """H100 over two HGX boards: the board's bandwidth part, then each GPU's 50 GB/s NIC carries B / 8 x 1 / 2 for an
    all-gather and twice that for an all-reduce; the ring's latency has one network step each way."""
    c = _nccl("h100-sxm")
    b, nic = 512 * MB, 50e9
    for op, passes in (("all_gather", 1), ("all_reduce", 2)):
        board = c.at(op, 8, b) - c.table.at(op, 8, 0.0)
        assert c.at(op, 16, b) == pytest.approx(c.at(op, 16, 0.0) + board * (7 / 8) / (7 / 8)
                                                + passes * 0.5 * b / 8 / nic)
        base, hop = c._hops(op)
        steps, inter = passes * 15, passes
        assert c.at(op, 16, 0.0) == pytest.approx(base + hop * (steps - inter) + inter * NET_STEP_LATENCY_S)
    # eight boards (DeepSeek's dp64): 7 network steps, 7/8 of B / 8 through each NIC
    base, hop = c._hops("all_gather")
    assert c.at("all_gather", 64, 0.0) == pytest.approx(base + hop * 56 + 7 * NET_STEP_LATENCY_S)
    assert c.at("all_gather", 64, b) - c.at("all_gather", 64, 0.0) == pytest.approx(
        c.at("all_gather", 8, b) - c.table.at("all_gather", 8, 0.0) + 7 / 8 * b / 8 / nic)


def test_all_to_all_across_domains_sends_the_off_board_share_over_the_nic():
    tables, hw = load_table_set("h100-sxm"), load_hardware("h100-sxm")
    from sim.models.ops_tables import NcclTable, _cached, find_table
    net = Collectives(_cached(NcclTable, find_table(tables.folder, "nccl_parallel")), fabric_of(hw))
    b = 64 * MB
    board = net.table.at("alltoall", 8, b / 2) - net.table.at("alltoall", 8, 0.0)
    assert net.at("alltoall", 16, b) == pytest.approx(net.at("alltoall", 16, 0.0) + board + b / 2 / 50e9)
    with pytest.raises(ConfigError, match=r"has no send_recv measurement on 4 GPUs"):
        net.at("send_recv", 4, b)


def test_an_engines_all_reduce_falls_back_to_nccl_beyond_its_counts():
    """Engines' custom all-reduce kernels are one-node designs: beyond their measured counts, NCCL's."""
    tables, fabric = load_table_set("b200"), fabric_of(load_hardware("b200"))
    ar, nccl = table_collectives(tables, fabric, "trtllm")
    assert ar.at("all_reduce", 8, MB) == tables.all_reduce("trtllm").at("all_reduce", 8, MB)
    assert ar.at("all_reduce", 16, MB) == nccl.at("all_reduce", 16, MB)
    only = table_collectives(tables, fabric, "nccl")
    assert only[0] is only[1]


def test_what_the_fabric_cannot_reach_is_refused_with_why():
    c = _nccl("h100-sxm")
    assert "beyond its scale-up domain of 8 GPUs a collective spans whole domains (multiples of 8)" in c.why_not(
        "all_reduce", 12)
    with pytest.raises(ConfigError, match=r"has no all_reduce measurement on 12 GPUs"):
        c.at("all_reduce", 12, MB)
    no_net = Collectives(c.table, Fabric("h100-sxm", 8, None))
    assert "h100-sxm's hardware profile states no scale_out_link" in no_net.why_not("all_gather", 16)
    assert no_net.why_not("all_gather", 8) is None
    bare = Collectives(c.table, None)
    assert "states no scale_up_gpus" in bare.why_not("all_gather", 16)


def test_a_profiles_fabric_is_validated_naming_the_field(tmp_path):
    from sim.io.profiles import profiles_dir
    text = (profiles_dir() / "hardware" / "h100-sxm.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("scale_up_gpus:\n  value: 8", "scale_up_gpus:\n  value: 1.5"))
    with pytest.raises(ConfigError, match=r"scale_up_gpus.value must be a whole number of GPUs >= 2"):
        load_hardware(bad)


def test_pipeline_boundaries_that_leave_a_node_are_counted():
    """Stage s on GPUs s x stage_gpus onward, each sending to the GPU stage_gpus further on: on an 8-GPU board,
    TP 8 x PP 2 crosses once, TP 4 x PP 2 never, TP 4 x PP 4 once (between GPUs 4-7 and 8-11), TP 3 x PP 4 twice;
    a card whose fabric states no domain size counts none."""
    from sim.models.collectives import stage_crossings
    assert [stage_crossings(g, pp, 8) for g, pp in ((8, 2), (4, 2), (4, 4), (3, 4), (16, 3))] == [1, 0, 1, 2, 2]
    assert stage_crossings(8, 4, None) == 0


def test_a_boundary_between_nodes_sends_over_the_nic():
    """H100 TP 8 x PP 2 (Llama-3.1-405B's two-node layout): the boundary costs the measured small-message time, a
    network hop and the bytes over one GPU's 50 GB/s NIC, well above NVLink's send of 64 MiB."""
    from sim.models.parallel_ops import build_replica_ops_model
    from sim.io.ops_schema import OpsStepTime
    from sim.io.profiles import load_model
    from sim.models.parallel import Layout
    from sim.models.spec import ModelSpec
    hw = load_hardware("h100-sxm")
    spec = ModelSpec(load_model("llama-3.1-70b"))
    two_nodes = build_replica_ops_model(OpsStepTime(tables="h100-sxm"), spec, hw, Layout(tp=8, pp=2), "bf16", "bf16",
                                        True)
    one_node = build_replica_ops_model(OpsStepTime(tables="h100-sxm"), spec, hw, Layout(tp=4, pp=2), "bf16", "bf16",
                                       True)
    assert (two_nodes.pp_crossings, one_node.pp_crossings) == (1, 0)
    net = two_nodes.net
    small = net.table.at("send_recv", 2, 0.0)
    assert net.send_recv_s(64 * MB, True) == pytest.approx(small + NET_STEP_LATENCY_S + 64 * MB / 50e9)
    assert net.send_recv_s(64 * MB, True) > 2 * net.send_recv_s(64 * MB)
    assert net.boundaries_s(MB, 3, 1) == pytest.approx(2 * net.send_recv_s(MB) + net.send_recv_s(MB, True))


def test_a_boundary_between_nodes_without_a_stated_nic_is_refused():
    c = Collectives(load_table_set("h100-sxm").nccl(), Fabric("h100-sxm", 8, None))
    with pytest.raises(ConfigError, match="pipeline stages cross h100-sxm's scale-up domain of 8 GPUs.*scale_out_link"):
        c.send_recv_s(MB, True)
