"""Scoring: static loads by hand, the dynamic split against an exact LP, lower bounds by brute force, replay."""

import itertools

import numpy as np
import pytest

from placement import (
    ClusterSpec,
    Placement,
    PlacementFormatError,
    equal_split_bound,
    fit_placement,
    min_max_load_per_replica,
    rolling_replay,
    score_placement,
    static_gpu_loads,
)
from placement.dynamic_split import ReplicaGraph, optimal_split_loads


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


@pytest.mark.parametrize(
    "num_gpus, slots, num_experts", [(16, 5, 64), (32, 3, 64), (8, 4, 16)], ids=["16x5", "32x3", "8x4"]
)
def test_dynamic_split_matches_the_exact_lp_on_sampled_steps(exact_lp_max_load, num_gpus, slots, num_experts):
    rng = np.random.default_rng(num_gpus)
    popularity = rng.lognormal(0, 1.2, size=num_experts)
    popularity /= popularity.sum()
    history = rng.multinomial(64 * num_gpus, popularity, size=(20, 1))
    placement = fit_placement("deepseek", history, ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots))
    steps = rng.multinomial(64 * num_gpus, popularity, size=12)
    graph = ReplicaGraph.build(placement.phy2log_LP[0], placement.gpu_of_slot_P, num_experts, num_gpus)
    loads, gap = optimal_split_loads(steps, graph, tolerance=1e-4, max_rounds=2000)
    np.testing.assert_allclose(loads.sum(axis=1), steps.sum(axis=1))  # no token lost or invented
    for step in range(len(steps)):
        exact = exact_lp_max_load(steps[step].astype(float), placement.phy2log_LP[0], placement.gpu_of_slot_P,
                                  num_gpus)
        assert exact - 1e-6 <= loads[step].max() <= exact * (1 + 1e-4) + 1e-6
        assert gap[step] <= 1e-4


def brute_force_min_max_per_replica(counts_E: np.ndarray, num_slots: int) -> float:
    best = np.inf
    num_experts = len(counts_E)
    for extra in itertools.product(range(num_slots - num_experts + 1), repeat=num_experts):
        if sum(extra) == num_slots - num_experts:
            best = min(best, max(c / (1 + x) for c, x in zip(counts_E, extra)))
    return best


@pytest.mark.parametrize("seed", range(6), ids=[f"seed{s}" for s in range(6)])
def test_equal_split_bound_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 100, size=4)
    exact = brute_force_min_max_per_replica(counts, 7)
    found = min_max_load_per_replica(counts[None], 7)[0]
    assert found <= exact + 1e-9 and found == pytest.approx(exact, rel=1e-7)


def test_equal_split_bound_is_never_above_a_real_placement():
    rng = np.random.default_rng(3)
    counts = rng.poisson(rng.lognormal(3, 1.5, size=(1, 1, 32)), size=(30, 1, 32))
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=5)
    for step in range(30):
        placement = fit_placement("deepseek", counts[step : step + 1], cluster)
        scores = score_placement(placement, counts[step : step + 1], "static")
        assert scores.lower_bound_TL[0, 0] <= scores.imbalance_TL[0, 0] + 1e-9
    bound = equal_split_bound(counts[:, 0], 40, 8)
    assert (bound >= 1.0).all()


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
