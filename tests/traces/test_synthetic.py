"""Tests of the synthetic routing-trace generator. Legend: T steps, L layers, E experts, K top-k, N tokens."""

import numpy as np
import pytest

from traces.routing_trace import RoutingTrace
from traces.synthetic import SyntheticConfig, active_bursts_TL, expected_counts_TLE, generate_trace

SMALL = dict(num_steps=200, num_layers=3, num_experts=32, top_k=4, tokens_per_step=256)


def _rolling_mean_TLE(counts_TLE: np.ndarray, window: int) -> np.ndarray:
    """[T - window + 1, L, E] float64: mean load over each run of `window` consecutive steps."""
    cum = np.cumsum(np.concatenate([np.zeros_like(counts_TLE[:1]), counts_TLE]), axis=0)
    return (cum[window:] - cum[:-window]) / window


def test_trace_has_config_shape_int64_dtype_and_header():
    trace = generate_trace(SyntheticConfig(**SMALL, seed=3))
    assert isinstance(trace, RoutingTrace)
    assert trace.counts_TLE.shape == (200, 3, 32)
    assert trace.counts_TLE.dtype == np.int64
    assert (trace.header.top_k, trace.header.tokens_per_step) == (4, 256)
    assert "traces.synthetic" in trace.header.source and "seed=3" in trace.header.source


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(popularity="zipf", zipf_exponent=3.0),  # top expert saturated: every token picks it
        dict(burst_rate=200.0, burst_factor=50.0),  # bursts push experts to the 1/K cap
        dict(tokens_per_step=1, num_experts=5, top_k=4),  # one token: counts are 0 or 1
        dict(num_experts=4, top_k=4),  # every token picks every expert
    ],
    ids=["default", "zipf-saturated", "hot-bursts", "one-token", "k-equals-e"],
)
def test_rows_sum_to_n_times_k_and_no_count_exceeds_n(overrides):
    config = SyntheticConfig(**{**SMALL, **overrides})
    counts_TLE = generate_trace(config).counts_TLE
    assert (counts_TLE.sum(axis=-1) == config.tokens_per_step * config.top_k).all()
    assert counts_TLE.max() <= config.tokens_per_step


def test_saturated_zipf_expert_gets_every_token_each_step():
    config = SyntheticConfig(**SMALL, popularity="zipf", zipf_exponent=3.0, num_domains=1, burst_rate=0.0)
    counts_TLE = generate_trace(config).counts_TLE
    assert (counts_TLE.max(axis=-1) == config.tokens_per_step).all()


def test_same_seed_gives_identical_trace_and_other_seed_differs():
    first = generate_trace(SyntheticConfig(**SMALL, seed=7)).counts_TLE
    again = generate_trace(SyntheticConfig(**SMALL, seed=7)).counts_TLE
    other = generate_trace(SyntheticConfig(**SMALL, seed=8)).counts_TLE
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize(
    "overrides",
    [dict(popularity="lognormal", skew=1.0), dict(popularity="zipf", zipf_exponent=1.0)],
    ids=["lognormal", "zipf"],
)
def test_busiest_expert_carries_several_times_the_mean_load(overrides):
    # One domain and no bursts, so the load follows the popularity law itself.
    shape = dict(num_experts=64, top_k=2, num_domains=1, burst_rate=0.0)
    config = SyntheticConfig(**{**SMALL, **shape, **overrides})
    load_LE = generate_trace(config).load_LE()
    max_over_mean_L = load_LE.max(axis=-1) / load_LE.mean(axis=-1)
    assert (max_over_mean_L > 3.0).all(), max_over_mean_L


def test_zero_skew_gives_nearly_uniform_load():
    load_LE = generate_trace(SyntheticConfig(**SMALL, skew=0.0, burst_rate=0.0)).load_LE()
    assert (load_LE.max(axis=-1) / load_LE.mean(axis=-1) < 1.1).all()


def _first_last_distance(**overrides) -> float:
    """Total-variation distance between the mean per-expert load shares of the first and last 10% of steps."""
    config = SyntheticConfig(**{**SMALL, "num_steps": 400, "burst_rate": 0.0, "domain_overlap": 0.0, **overrides})
    counts_TLE = generate_trace(config).counts_TLE
    tenth = config.num_steps // 10
    first_LE, last_LE = counts_TLE[:tenth].sum(axis=0), counts_TLE[-tenth:].sum(axis=0)
    share_gap_LE = first_LE / first_LE.sum(-1, keepdims=True) - last_LE / last_LE.sum(-1, keepdims=True)
    return 0.5 * np.abs(share_gap_LE).sum(axis=-1).mean()


def test_domain_mix_drift_changes_expert_load_between_first_and_last_steps():
    drifting = _first_last_distance(drift_strength=3.0, drift_period_steps=400.0)
    steady = _first_last_distance(drift_strength=0.0)
    assert drifting > 0.1
    assert drifting > 3 * steady, (drifting, steady)


def test_burst_makes_an_expert_far_hotter_than_its_own_average():
    window = 20
    no_bursts = generate_trace(SyntheticConfig(**SMALL, burst_rate=0.0)).counts_TLE
    bursty = generate_trace(
        SyntheticConfig(**SMALL, burst_rate=20.0, burst_length_steps=2 * window, burst_factor=8.0)
    ).counts_TLE

    def peak_over_average(counts_TLE: np.ndarray) -> float:
        return float((_rolling_mean_TLE(counts_TLE, window).max(axis=0) / (counts_TLE.mean(axis=0) + 1)).max())

    assert peak_over_average(bursty) > 3.0
    assert peak_over_average(no_bursts) < 2.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_experts=4, top_k=8), "top_k=8 exceeds num_experts=4"),
        (dict(tokens_per_step=0), "tokens_per_step"),
        (dict(popularity="pareto"), "popularity"),
        (dict(domain_overlap=1.5), "domain_overlap"),
        (dict(num_steps=10, unknown_field=1), "unknown_field"),
    ],
    ids=["top-k-over-experts", "no-tokens", "unknown-popularity", "overlap-above-one", "extra-field"],
)
def test_invalid_config_raises_value_error_naming_the_problem(overrides, message):
    with pytest.raises(ValueError, match=message):
        SyntheticConfig(**overrides)


def test_active_bursts_mark_the_rows_where_a_burst_expert_is_hot():
    config = SyntheticConfig(**SMALL, burst_rate=10.0, burst_length_steps=10.0, burst_factor=30.0)
    active_TL = active_bursts_TL(config)
    assert active_TL.shape == (config.num_steps, config.num_layers) and active_TL.min() >= 0
    assert 0 < (active_TL > 0).mean() < 1
    counts_TLE = generate_trace(config).counts_TLE
    top_share_TL = counts_TLE.max(axis=2) / counts_TLE.sum(axis=2)
    # A 30-fold burst makes its expert the busiest by far; rows without one keep the calm skew.
    assert top_share_TL[active_TL > 0].mean() > 2 * top_share_TL[active_TL == 0].mean()
    assert not active_bursts_TL(config.model_copy(update={"burst_rate": 0.0})).any()


@pytest.mark.parametrize("popularity", ["lognormal", "zipf"])
def test_the_expected_counts_hold_every_pick_and_are_the_counts_mean_over_steps(popularity):
    config = SyntheticConfig(**{**SMALL, "num_steps": 600}, popularity=popularity, seed=2)
    counts_TLE, expected_TLE = generate_trace(config).counts_TLE, expected_counts_TLE(config)
    assert expected_TLE.shape == counts_TLE.shape
    np.testing.assert_allclose(expected_TLE.sum(axis=-1), 256 * 4)
    busy = expected_TLE.mean(axis=0) > 32
    np.testing.assert_allclose(counts_TLE.mean(axis=0)[busy], expected_TLE.mean(axis=0)[busy], rtol=0.05)
