"""Rolling replay with refits on drift: a switch of traffic is caught on the step it happens."""

import numpy as np
import pytest

from placement import ClusterSpec, PlacementInfeasibleError, rolling_replay

CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=5)


def regimes(switches: list[int], num_steps: int, seed: int = 0) -> np.ndarray:
    """[T, 1, 16] Poisson counts whose four hot experts change at each step of `switches`."""
    rng = np.random.default_rng(seed)
    counts = np.empty((num_steps, 1, 16), dtype=np.int64)
    bounds = [0, *switches, num_steps]
    for regime, (first, stop) in enumerate(zip(bounds, bounds[1:])):
        rate = np.full(16, 40.0)
        rate[(4 * regime + np.arange(4)) % 16] = 400.0
        counts[first:stop, 0] = rng.poisson(rate, size=(stop - first, 16))
    return counts


def test_a_switch_of_traffic_refits_on_the_steps_after_it():
    counts = regimes([33], 60)
    fixed = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic")
    drift = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", drift_ratio=1.3)
    assert fixed.drift_steps == [] and fixed.refit_steps == [10, 20, 30, 40, 50]
    assert drift.drift_steps == [33]
    assert drift.fit_windows[:4] == [(0, 10), (10, 20), (20, 30), (33, 34)]
    assert drift.fit_windows[4] == (34, 44)  # the window holds only steps after the switch
    assert drift.held_out.imbalance_TL.shape == fixed.held_out.imbalance_TL.shape == (50, 1)
    # Until the switch both replays serve the same placements; after it, the fixed cadence serves the old one.
    np.testing.assert_allclose(drift.held_out.imbalance_TL[:24], fixed.held_out.imbalance_TL[:24])
    assert drift.held_out.imbalance_TL[24:30].mean() < 0.8 * fixed.held_out.imbalance_TL[24:30].mean()
    assert drift.summary()["drift_refits"] == 1


def test_steady_traffic_never_triggers_a_refit_on_drift():
    counts = regimes([], 50, seed=3)
    fixed = rolling_replay(counts, CLUSTER, "deepseek", every=8, window=8, routing="dynamic")
    drift = rolling_replay(counts, CLUSTER, "deepseek", every=8, window=8, routing="dynamic", drift_ratio=1.3)
    assert drift.drift_steps == [] and drift.refit_steps == fixed.refit_steps
    np.testing.assert_allclose(drift.held_out.imbalance_TL, fixed.held_out.imbalance_TL)


def test_a_second_trigger_soon_after_a_switch_keeps_the_steps_since_the_switch():
    counts = regimes([33, 35], 60)
    result = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", drift_ratio=1.3)
    assert result.drift_steps[:2] == [33, 35]
    # The fit on step 33 alone is not a new regime's start when 35 triggers: the next fit keeps 33 and 34.
    assert result.fit_windows[3:5] == [(33, 34), (33, 36)]


def test_scheduled_fits_stay_within_the_traffic_since_the_last_switch():
    counts = regimes([33], 60)
    result = rolling_replay(counts, CLUSTER, "deepseek", every=4, window=10, routing="static", drift_ratio=1.3)
    after = [w for w in result.fit_windows if w[1] > 33]
    assert after[0] == (33, 34) and after[1] == (33, 38) and after[2] == (33, 42) and after[3] == (36, 46)


@pytest.mark.parametrize("ratio", [1.0, 0.5, float("nan")])
def test_a_drift_ratio_that_is_not_above_one_is_refused(ratio):
    with pytest.raises(PlacementInfeasibleError, match="must be > 1"):
        rolling_replay(regimes([], 20), CLUSTER, "deepseek", every=5, window=5, drift_ratio=ratio)
