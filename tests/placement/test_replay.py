"""Rolling replay: refits on drift catch a switch of traffic on the step it happens; lag delays every placement."""

import numpy as np
import pytest

from placement import ClusterSpec, PlacementInfeasibleError, fit_placement, rolling_replay, score_placement

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


@pytest.mark.parametrize("ratio", [1.0, 0.5, float("nan"), float("inf")], ids=["one", "half", "nan", "infinite"])
def test_a_drift_ratio_that_is_not_finite_and_above_one_is_refused(ratio):
    with pytest.raises(PlacementInfeasibleError, match="must be finite and > 1"):
        rolling_replay(regimes([], 20), CLUSTER, "deepseek", every=5, window=5, drift_ratio=ratio)


def by_hand(counts: np.ndarray, every: int, window: int, lag: int, routing: str) -> tuple[list, list, np.ndarray]:
    """Fit windows, serve starts and held-out imbalance of a fixed cadence with lag, one placement at a time."""
    num_steps = len(counts)
    windows, starts, parts = [], [], []
    for fit_step in range(window, num_steps - lag, every):
        placement = fit_placement("deepseek", counts[fit_step - window : fit_step], CLUSTER)
        windows.append((fit_step - window, fit_step))
        starts.append(fit_step + lag)
        parts.append(score_placement(placement, counts[fit_step + lag : fit_step + every + lag], routing).imbalance_TL)
    return windows, starts, np.concatenate(parts)


@pytest.mark.parametrize("lag", [0, 3, 7, 12], ids=["lag0", "lag3", "lag7", "lag-above-every"])
def test_with_lag_each_placement_serves_its_shifted_range(lag):
    counts = regimes([20, 41], 61, seed=2)
    result = rolling_replay(counts, CLUSTER, "deepseek", every=7, window=5, routing="dynamic", lag=lag)
    windows, starts, held = by_hand(counts, every=7, window=5, lag=lag, routing="dynamic")
    assert result.fit_windows == windows and result.refit_steps == starts
    assert result.held_out.imbalance_TL.shape == (61 - 5 - lag, 1)
    np.testing.assert_allclose(result.held_out.imbalance_TL, held)
    assert result.summary()["lag"] == lag and result.summary()["refits"] == len(windows)


def test_lag_zero_is_the_replay_without_lag():
    counts = regimes([33], 60)
    plain = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", drift_ratio=1.3)
    zero = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", drift_ratio=1.3, lag=0)
    assert zero.refit_steps == plain.refit_steps == [10, 20, 30, 34, 44, 54]  # served from the end of each window
    assert zero.fit_windows == plain.fit_windows and zero.drift_steps == plain.drift_steps == [33]
    np.testing.assert_array_equal(zero.held_out.imbalance_TL, plain.held_out.imbalance_TL)


def test_with_lag_a_switch_is_served_by_the_old_placement_until_the_refit_lands():
    counts = regimes([33], 60)
    drift = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", drift_ratio=1.3,
                           lag=3)
    fixed = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", lag=3)
    # One trigger: steps 34-36 drift as well but the refit on step 33 is in flight.
    assert drift.drift_steps == [33]
    assert drift.fit_windows[:5] == [(0, 10), (10, 20), (20, 30), (33, 34), (34, 44)]
    assert drift.refit_steps[:5] == [13, 23, 33, 37, 47]
    assert drift.held_out.imbalance_TL.shape == (60 - 13, 1)
    old = fit_placement("deepseek", counts[20:30], CLUSTER)
    new = fit_placement("deepseek", counts[33:34], CLUSTER)
    served = drift.held_out.imbalance_TL[:, 0]  # index i is step 13 + i
    for placement, (first, stop) in ((old, (33, 37)), (new, (37, 47))):
        expected = score_placement(placement, counts[first:stop], "dynamic").imbalance_TL[:, 0]
        np.testing.assert_allclose(served[first - 13 : stop - 13], expected)
    assert served[37 - 13 : 43 - 13].mean() < 0.8 * fixed.held_out.imbalance_TL[37 - 13 : 43 - 13, 0].mean()


def test_a_drift_after_the_next_fit_started_lets_that_fit_serve_until_the_refit_lands():
    # Fits at 30 (serving 35-44) and 40 (in flight from step 40); the switch at 42 is found while 30's serves.
    counts = regimes([42], 60)
    result = rolling_replay(counts, CLUSTER, "deepseek", every=10, window=10, routing="dynamic", drift_ratio=1.3,
                            lag=5)
    assert result.drift_steps == [42]
    assert result.fit_windows[:6] == [(0, 10), (10, 20), (20, 30), (30, 40), (42, 43), (43, 53)]
    assert result.refit_steps[:6] == [15, 25, 35, 45, 48, 58]
    scheduled = fit_placement("deepseek", counts[30:40], CLUSTER)
    np.testing.assert_allclose(result.held_out.imbalance_TL[45 - 15 : 48 - 15],
                               score_placement(scheduled, counts[45:48], "dynamic").imbalance_TL)


def test_with_lag_above_every_the_fits_in_flight_land_before_the_refit_on_drift():
    # Fit at f serves [f + 12, f + 17); the fit at 25 serves step 40, the switch, when fits at 30, 35 and 40 have
    # started: they serve their turns, unchecked (fitted before the switch, they would trigger), then the refit.
    counts = regimes([40], 70)
    result = rolling_replay(counts, CLUSTER, "deepseek", every=5, window=10, routing="dynamic", drift_ratio=1.3,
                            lag=12)
    assert result.drift_steps[0] == 40
    assert result.fit_windows[:9] == [(0, 10), (5, 15), (10, 20), (15, 25), (20, 30), (25, 35), (30, 40), (40, 41),
                                      (40, 46)]
    assert result.refit_steps[:9] == [22, 27, 32, 37, 42, 47, 52, 53, 58]
    in_flight = fit_placement("deepseek", counts[30:40], CLUSTER)
    np.testing.assert_allclose(result.held_out.imbalance_TL[52 - 22 : 53 - 22],
                               score_placement(in_flight, counts[52:53], "dynamic").imbalance_TL)

@pytest.mark.parametrize(
    "options, match",
    [
        ({"lag": -1}, "got lag=-1"),
        ({"lag": 15}, "window=5 and lag=15 leave no step to score in a trace of 20 steps"),
        ({"every": 0}, "every and window must be >= 1"),
        ({"window": 20}, "window=20 and lag=0 leave no step"),
    ],
    ids=["negative-lag", "lag-past-the-end", "every", "window"],
)
def test_replay_refuses_parameters_that_leave_nothing_to_score(options, match):
    with pytest.raises(PlacementInfeasibleError, match=match):
        rolling_replay(regimes([], 20), CLUSTER, "deepseek", **{"every": 5, "window": 5, **options})


def test_the_drift_trigger_fires_on_steps_above_ratio_times_the_fitted_imbalance():
    from placement.replay import drifted_steps

    assert drifted_steps(np.array([1.0, 1.39, 1.41, 2.0]), 1.0, 1.4).tolist() == [False, False, True, True]
    assert not drifted_steps(np.array([1.5]), 1.1, 1.4).any()


def test_also_served_traces_are_scored_with_the_placements_fitted_on_the_replayed_trace():
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 40, size=(30, 2, 16))
    thinner = rng.binomial(counts, 0.25)
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5)
    result = rolling_replay(counts, cluster, "deepseek", every=10, window=10, routing="static",
                            also_served={"same": counts, "thinner": thinner})
    assert np.array_equal(result.held_out_served["same"].imbalance_TL, result.held_out.imbalance_TL)
    fits = [fit_placement("deepseek", counts[start:stop], cluster) for start, stop in result.fit_windows]
    expected = np.concatenate([score_placement(placement, thinner[serve:serve + 10], "static").imbalance_TL
                               for placement, serve in zip(fits, result.refit_steps)])
    assert np.allclose(result.held_out_served["thinner"].imbalance_TL, expected)
