"""step_time.scale multiplies every iteration's modelled time: with a load whose schedule does not depend on
time (every request at once), each iteration lasts exactly `scale` times as long and every latency moves with
it; at 1 nothing changes, and the setup says a run was scaled."""

from __future__ import annotations

import numpy as np
import pytest

from sim.io.errors import ConfigError
from tests.sim.helpers import run, scenario

AT_ONCE = {"kind": "synthetic", "num_requests": 24, "arrival": {"kind": "all_at_once"},
           "prompt_tokens": {"kind": "lognormal", "median": 600, "sigma": 0.7, "max": 4000},
           "output_tokens": {"kind": "lognormal", "median": 60, "sigma": 0.7, "max": 400}}


@pytest.mark.parametrize("graphs", [None, [1, 2, 4, 8, 16, 32]])
def test_every_iteration_lasts_scale_times_as_long(graphs):
    base = run(scenario(workload=AT_ONCE, step_time__graph_sizes=graphs))
    twice = run(scenario(workload=AT_ONCE, step_time__graph_sizes=graphs, step_time__scale=2.0))
    a, b = base.iterations, twice.iterations
    assert len(a) == len(b) > 24
    for col in ("new_tokens", "batch_size", "prefill_tokens", "decode_sequences"):
        assert (a[col].to_numpy() == b[col].to_numpy()).all()
    np.testing.assert_allclose(b["duration_s"].to_numpy(), 2 * a["duration_s"].to_numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose(twice.requests["ttft_s"].to_numpy(), 2 * base.requests["ttft_s"].to_numpy(),
                               rtol=1e-9)
    assert twice.summary["setup"]["step_time_fit"]["scale"] == 2.0
    assert "scale" not in base.summary["setup"]["step_time_fit"]


def test_scale_one_is_the_unscaled_run():
    a, b = run(scenario()), run(scenario(step_time__scale=1.0))
    assert a.digest() == b.digest()


def test_a_scale_must_be_positive():
    with pytest.raises(Exception, match="scale"):
        scenario(step_time__scale=0)


def test_a_scaled_scenario_has_its_own_digest_and_an_unscaled_one_keeps_its_own():
    """The goldens pin every shipped scenario's digest (none sets a scale); a scale makes another scenario."""
    from sim.io.describe import scenario_digest
    assert scenario_digest(scenario(step_time__scale=1.0)) == scenario_digest(scenario())
    assert scenario_digest(scenario(step_time__scale=1.1)) != scenario_digest(scenario())
