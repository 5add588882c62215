"""The trend forecast: still traffic stays put, a clear trend is followed, rows keep their tokens, on drifting
traffic a replay that fits the forecast serves better than one that fits the stale window, and where the window does
not support a trend (too short, noise, a level shift) the window is fitted as it is."""

import re
from pathlib import Path

import numpy as np
import pytest

from placement import ClusterSpec, rolling_replay
from placement.forecast import forecast_window, hedged_horizons, hedged_window, trend_shares, trend_supported
from traces import load_trace

ESFT = Path(__file__).resolve().parents[2].parent / "shared/data/esft-dsv2lite/esft_vanilla_lite_routing.npz"


def drifting(num_steps: int, num_experts: int = 16, tokens: int = 4000, seed: int = 0, start: float = 0.02,
             stop: float = 0.30) -> np.ndarray:
    """[T, 1, E] multinomial counts: expert 0's share rises linearly from `start` to `stop`, the rest share the
    remainder by fixed weights."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.5, 1.5, size=num_experts - 1)
    counts = np.empty((num_steps, 1, num_experts), dtype=np.int64)
    for t, share in enumerate(np.linspace(start, stop, num_steps)):
        p = np.concatenate([[share], (1 - share) * weights / weights.sum()])
        counts[t, 0] = rng.multinomial(tokens, p)
    return counts


def test_still_traffic_keeps_the_window_mean():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(32))
    window = np.stack([rng.multinomial(2000, p) for _ in range(60)])[:, None]
    moved = forecast_window(window, hedged_horizons(lag=100, every=100))
    # No slope is two standard errors from zero on noise alone (or a few are, shrunk): the mean barely moves.
    before = window[:, 0].sum(0) / window.sum()
    after = moved[:, 0].sum(0) / moved.sum()
    assert 0.5 * np.abs(after - before).sum() < 0.01


def test_a_clear_trend_is_extrapolated_at_each_horizon():
    window = drifting(100, tokens=20000)
    shares_KLE = trend_shares(window, [0.0, 50.0, 100.0])
    # The line through 0.02 .. 0.30 over 100 steps: 0.30 at the window's end, + 0.0028 per step after it.
    slope = 0.28 / 99
    np.testing.assert_allclose(shares_KLE[:, 0, 0], [0.30, 0.30 + 50 * slope, 0.30 + 100 * slope], atol=0.006)
    np.testing.assert_allclose(shares_KLE.sum(axis=2), 1.0)
    damped = trend_shares(window, [100.0], damping_steps=20.0)[0, 0, 0]
    assert 0.30 + 15 * slope < damped < 0.30 + 25 * slope  # tau (1 - e^-5) ~ 19.9 steps of trend


def test_each_chunk_takes_its_horizon_and_rows_keep_their_tokens():
    window = drifting(90)
    horizons = (0.0, 30.0, 60.0)
    moved = forecast_window(window, horizons)
    assert moved.shape == window.shape and moved.dtype == np.int64 and (moved >= 0).all()
    assert np.abs(moved.sum(axis=2) - window.sum(axis=2)).max() <= window.shape[2] / 2
    expected_KLE = trend_shares(window, horizons)
    for k, chunk in enumerate(np.split(moved, 3)):
        np.testing.assert_allclose(chunk.sum(axis=0) / chunk.sum(), expected_KLE[k], atol=2e-4)


def test_an_expert_without_tokens_in_a_chunk_gets_its_expected_count():
    window = drifting(40)
    window[:20, 0, 5] = 0  # expert 5 silent in the first chunk
    moved = forecast_window(window, (0.0, 0.0))
    shares_KLE = trend_shares(window, (0.0, 0.0))
    np.testing.assert_allclose(moved[:20, 0, 5].sum() / moved[:20].sum(), shares_KLE[0, 0, 5], rtol=0.02)


def test_layers_without_tokens_stay_empty():
    window = drifting(20)
    window = np.concatenate([window, np.zeros_like(window)], axis=1)
    moved = forecast_window(window, (5.0,))
    assert (moved[:, 1] == 0).all()
    assert moved[:, 0].sum() > 0


@pytest.mark.parametrize("counts, horizons, damping, message", [
    (-np.ones((4, 1, 3)), (0.0,), None, "counts_TLE must hold finite counts >= 0"),
    (np.ones((4, 3)), (0.0,), None, "counts_TLE must be [T, L, E]"),
    (np.ones((2, 1, 3)), (0.0, 1.0, 2.0), None, "horizons must hold 1 to T = 2 values"),
    (np.ones((4, 1, 3)), (), None, "horizons must hold 1 to T = 4 values"),
    (np.ones((4, 1, 3)), (-1.0,), None, "horizons are steps after the window's end"),
    (np.ones((4, 1, 3)), (1.0,), 0.0, "damping_steps is the damped trend's tau and must be > 0"),
], ids=["negative", "shape", "too-many-horizons", "no-horizon", "negative-horizon", "damping"])
def test_bad_arguments_say_what_was_expected(counts, horizons, damping, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        forecast_window(counts, horizons, damping)
    if "T = 2" not in message:  # trend_shares takes any number of horizons
        with pytest.raises(ValueError, match=re.escape(message.split(" = ")[0])):
            trend_shares(counts, horizons, damping)


def test_fitting_the_forecast_serves_drifting_traffic_better_after_a_lag():
    # One expert rises steadily; with a lag, the stale window under-replicates it.
    counts = drifting(400, num_experts=16, tokens=4000, seed=3, start=0.02, stop=0.40)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=3)
    options = dict(every=40, window=40, routing="dynamic", lag=40)
    plain = rolling_replay(counts, cluster, "deepseek", **options)
    forecast = rolling_replay(counts, cluster, "deepseek", forecast=True, **options)
    # Measured: 1.124 plain, 1.024 with the forecast.
    assert forecast.held_out.imbalance_TL.mean() < plain.held_out.imbalance_TL.mean() - 0.05
    # The fitted score stays on the window itself, the same steps as the plain replay's.
    assert forecast.fit_windows == plain.fit_windows


def shifted(num_steps: int, at: int, num_experts: int = 16, tokens: int = 4000, seed: int = 0) -> np.ndarray:
    """[T, 1, E] multinomial counts whose mix switches at step `at` from one fixed popularity to another (a burst
    starting, or a switch of task): a level shift, no trend."""
    rng = np.random.default_rng(seed)
    before, after = rng.dirichlet(np.ones(num_experts), size=2)
    return np.stack([rng.multinomial(tokens, before if t < at else after) for t in range(num_steps)])[:, None]


def test_a_clear_trend_is_supported_and_the_hedged_window_follows_it():
    window = drifting(100, tokens=20000)
    assert trend_supported(window)
    np.testing.assert_array_equal(hedged_window(window, 100, 100), forecast_window(window, hedged_horizons(100, 100)))


@pytest.mark.parametrize("window", [
    drifting(7, tokens=20000),
    np.random.default_rng(1).multinomial(500, np.full(16, 1 / 16), size=(64, 1)),
    shifted(64, at=40),
], ids=["shorter-than-8-steps", "still-noisy-traffic", "a-level-shift"])
def test_a_window_without_a_trend_is_fitted_as_it_is(window):
    assert not trend_supported(window)
    assert hedged_window(window, 100, 100) is window


@pytest.mark.skipif(not ESFT.exists(), reason="../shared/data/esft-dsv2lite is absent")
def test_real_routing_at_a_short_window_fits_as_without_a_forecast():
    """ESFT's summary task at 512 tokens a step, refit every 4 steps on the last 4: a slope through 4 noisy steps
    moves every fit away from the load that comes next, so the forecast stands down."""
    counts = load_trace(ESFT, tokens_per_step=512, tasks=["summary"]).counts_TLE
    cluster = ClusterSpec(num_gpus=12, slots_per_gpu=6, gpus_per_node=4)
    options = dict(every=4, window=4, routing="dynamic")
    plain = rolling_replay(counts, cluster, "deepseek", **options)
    forecast = rolling_replay(counts, cluster, "deepseek", forecast=True, **options)
    np.testing.assert_array_equal(forecast.held_out.imbalance_TL, plain.held_out.imbalance_TL)
