"""Reference section 9 end to end: schemes A-D through `capsim compare` (memory first, then
deadlines, then cost per good result), the 6 GiB and 16-token variants."""

import json

import pytest

from capsim.cli import main
from tests.sim.helpers import REPO_SCENARIOS

MiB = 2**20
CH8 = REPO_SCENARIOS / "chapter8"


def compare(capsys, *names):
    assert main(["compare", *[str(CH8 / f"{n}.yaml") for n in names], "--json"]) == 0
    return {r["scenario"]: r for r in json.loads(capsys.readouterr().out)}


def test_schemes_a_to_d(capsys):
    rows = compare(capsys, "scheme-a", "scheme-b", "scheme-c", "scheme-d")
    a, b, c, d = (rows[f"scheme-{k}"] for k in "abcd")
    # memory: A 19,008 MiB > 12 GiB; B 6048 MiB; C 9.86 GiB; D 6048 + 3188 = 9236 MiB
    assert a["kv_need_bytes"] == 19008 * MiB and not a["memory_fit"]
    assert b["kv_need_bytes"] == 6048 * MiB and b["memory_fit"]
    assert round(c["kv_need_bytes"] / 2**30, 2) == 9.86 and c["memory_fit"]
    assert d["kv_need_bytes"] == 9236 * MiB and d["memory_fit"]
    # time: B 2.04 + 255 x 0.02735 = 9.01 s (late); C 7.34 + 255 x ~0.02826 = 14.55 s (late); D 4.56 s
    assert round(b["makespan_s"], 2) == 9.01 and not b["deadline_met"]
    assert round(c["makespan_s"], 2) == 14.55 and not c["deadline_met"]
    assert round(d["makespan_s"], 2) == 4.56 and d["deadline_met"]
    assert [r["feasible"] for r in (a, b, c, d)] == [False, False, False, True]
    # only D has good results: 0.285 GPU-s and at most 171 J each at the 600 W cap
    assert round(d["gpu_seconds_per_good"], 3) == 0.285
    assert round(d["energy_j_per_good"]) == 171
    assert b["gpu_seconds_per_good"] is None  # B spends 9.01 s for zero good results


def test_with_6gib_nothing_is_feasible(capsys):
    rows = compare(capsys, "scheme-a-6gib", "scheme-b-6gib", "scheme-c-6gib", "scheme-d-6gib")
    assert not any(r["feasible"] for r in rows.values())
    assert rows["scheme-b-6gib"]["memory_fit"] and not rows["scheme-b-6gib"]["deadline_met"]  # fits, late
    assert round(rows["scheme-d-6gib"]["kv_need_bytes"] / 2**30, 2) == 9.02 and not rows["scheme-d-6gib"]["memory_fit"]


def test_16_token_outputs_both_on_time(capsys):
    rows = compare(capsys, "scheme-b-16tok", "scheme-d-16tok")
    b, d = rows["scheme-b-16tok"], rows["scheme-d-16tok"]
    assert round(b["makespan_s"], 2) == 2.45 and round(d["makespan_s"], 2) == 2.37
    assert b["feasible"] and d["feasible"]
    assert b["makespan_s"] - d["makespan_s"] == pytest.approx(0.08, abs=0.005)


def test_compare_prints_a_table(capsys):
    assert main(["compare", str(CH8 / "scheme-b.yaml"), str(CH8 / "scheme-d.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["scenario", "KV", "need", "budget"]
    assert out[2].startswith("scheme-d") and "yes" in out[2]
