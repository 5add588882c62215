"""Scoring: static loads by hand, dynamic and live routing, lower bounds against real placements, replay."""

import numpy as np
import pytest

from placement import (
    ClusterSpec,
    Placement,
    PlacementFormatError,
    fit_placement,
    rolling_replay,
    score_placement,
    static_gpu_loads,
)


def two_gpu_placement() -> Placement:
    # GPU 0 holds experts 0, 1; GPU 1 holds experts 0, 2; expert 0 split 3:1.
    weights = np.array([[0.75, 1.0, 0.25, 1.0]])
    return Placement(np.array([[0, 1, 0, 2]]), weights, ClusterSpec(num_gpus=2, slots_per_gpu=2), 3)


def test_static_loads_follow_the_replica_weights():
    counts = np.array([[[40, 10, 30]]])
    loads = static_gpu_loads(counts, two_gpu_placement())
    np.testing.assert_allclose(loads[0, 0], [40 * 0.75 + 10, 40 * 0.25 + 30])
    scores = score_placement(two_gpu_placement(), counts, "static")
    assert scores.imbalance_TL[0, 0] == pytest.approx(40 / 40)


def test_dynamic_routing_moves_the_shared_experts_tokens():
    counts = np.array([[[40, 30, 10]]])  # static: GPU0 = 60, GPU1 = 20; best split: 40 and 40
    assert score_placement(two_gpu_placement(), counts, "static").imbalance_TL[0, 0] == pytest.approx(1.5)
    assert score_placement(two_gpu_placement(), counts, "dynamic").imbalance_TL[0, 0] == pytest.approx(1.0, abs=1e-3)


def skewed_steps(num_experts: int, seed: int) -> np.ndarray:
    """[16, 1, E] steps of 64 tokens over experts of lognormal popularity (the busiest ~10x the median)."""
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0.0, 1.5, size=num_experts)
    return rng.multinomial(64, popularity / popularity.sum(), size=(16, 1))


@pytest.mark.parametrize("routing", ["static", "dynamic", "live"])
@pytest.mark.parametrize("policy", ["deepseek", "trivial"])
@pytest.mark.parametrize("slots_per_gpu, num_experts", [(1, 6), (2, 14)], ids=["8x1", "8x2"])
def test_lower_bound_is_never_above_a_real_placement(slots_per_gpu, num_experts, policy, routing):
    counts = skewed_steps(num_experts, seed=slots_per_gpu)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=slots_per_gpu)
    bounds = []
    for step in range(len(counts)):
        # Fitted on the very step it is scored on: as close to the bound as the policy gets.
        placement = fit_placement(policy, counts[step : step + 1], cluster)
        scores = score_placement(placement, counts[step : step + 1], routing)
        assert scores.lower_bound_TL[0, 0] <= scores.imbalance_TL[0, 0] + 1e-9, step
        bounds.append(scores.lower_bound_TL[0, 0])
    assert np.mean(bounds) > 1.1  # few spare slots for skewed traffic: the bound is well above the mean


@pytest.mark.parametrize("routing", ["static", "dynamic"])
def test_deepseek_fitted_on_the_step_meets_the_bound_with_one_slot_per_gpu(routing):
    # One slot per GPU: every replica of e gets c_e / r_e, and the greedy's replica counts are the optimal ones.
    counts = skewed_steps(6, seed=1)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=1)
    for step in range(len(counts)):
        placement = fit_placement("deepseek", counts[step : step + 1], cluster)
        scores = score_placement(placement, counts[step : step + 1], routing)
        assert scores.imbalance_TL[0, 0] == pytest.approx(scores.lower_bound_TL[0, 0], rel=2e-3), step


def test_scoring_rejects_a_placement_for_another_model_shape():
    placement = fit_placement("deepseek", np.ones((2, 1, 16), dtype=np.int64), ClusterSpec(num_gpus=4, slots_per_gpu=4))
    with pytest.raises(PlacementFormatError, match="16 experts"):
        score_placement(placement, np.ones((2, 1, 8), dtype=np.int64))


def test_rolling_replay_scores_only_steps_after_the_first_window():
    rng = np.random.default_rng(0)
    counts = rng.poisson(20, size=(23, 2, 16))
    result = rolling_replay(counts, ClusterSpec(num_gpus=4, slots_per_gpu=5), "deepseek", every=5, window=8)
    assert result.refit_steps == [8, 13, 18]
    assert result.held_out.imbalance_TL.shape == (15, 2)
    assert result.fitted.imbalance_TL.shape == (24, 2)
    summary = result.summary()
    assert {"imbalance_mean", "imbalance_p99", "imbalance_max", "lower_bound", "fitted_imbalance_mean"} <= set(summary)


def test_replay_held_out_score_equals_scoring_each_refit_by_hand():
    rng = np.random.default_rng(1)
    counts = rng.poisson(rng.lognormal(2, 1, size=(2, 16)), size=(20, 2, 16))
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5)
    result = rolling_replay(counts, cluster, "deepseek", every=6, window=6, routing="dynamic")
    parts = []
    for start in (6, 12, 18):
        placement = fit_placement("deepseek", counts[start - 6 : start], cluster)
        parts.append(score_placement(placement, counts[start : start + 6], "dynamic").imbalance_TL)
    np.testing.assert_allclose(result.held_out.imbalance_TL, np.concatenate(parts))


def test_live_routing_is_whole_tokens_between_the_optimum_and_the_static_split():
    rng = np.random.default_rng(4)
    popularity = rng.lognormal(0, 1.0, size=(2, 32))
    popularity /= popularity.sum(axis=1, keepdims=True)
    counts = rng.multinomial(1024, popularity, size=(12, 2))
    placement = fit_placement("deepseek", counts[:4], ClusterSpec(num_gpus=8, slots_per_gpu=5))
    live = score_placement(placement, counts[4:], "live").imbalance_TL
    dynamic = score_placement(placement, counts[4:], "dynamic")
    certified = dynamic.imbalance_TL / (1 + dynamic.dynamic_gap_TL)  # a lower bound on the fractional optimum
    static = score_placement(placement, counts[4:], "static").imbalance_TL
    assert (live >= certified - 1e-9).all()  # no whole-token split beats the fractional optimum
    assert live.mean() <= static.mean()


def test_rolling_replay_also_scores_the_held_out_steps_under_the_live_router():
    counts = np.random.default_rng(4).poisson(30.0, size=(18, 2, 12))
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=4)
    result = rolling_replay(counts, cluster, "deepseek", every=6, window=6, routing="dynamic",
                            also_routings=("live", "static"))
    best, live, static = (result.held_out.imbalance_TL, result.held_out_also["live"].imbalance_TL,
                          result.held_out_also["static"].imbalance_TL)
    assert best.shape == live.shape == static.shape == (12, 2)
    # The best split is a lower bound of any split, up to its certified gap and whole-token rounding.
    # Rounding moves at most one token per replica: 4 slots a GPU, mean GPU load = total / 4.
    assert (live >= best * (1 - 1e-3) - 4 * 4 / counts[6:].sum(axis=-1).min()).all()
    assert live.mean() <= static.mean() + 1e-9
