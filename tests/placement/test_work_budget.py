"""The deterministic work budget: each layer's level from modelled costs of its own share, searches limited by
counted work, the same placement whatever the threads, the cores' load or the clock."""

import time

import numpy as np
import pytest

from placement import ClusterSpec, fit_placement
from placement.policies.cpsat_budget import LEVELS
from placement.policies.work_budget import LayerShape, WorkBudget


def skewed_counts(num_steps: int, num_layers: int, num_experts: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0, 1.0, size=(num_layers, num_experts))
    popularity /= popularity.sum(axis=1, keepdims=True)
    return rng.multinomial(512, popularity, size=(num_steps, num_layers))


SHAPE = LayerShape(steps=12, slots=32, gpus=8, experts=24, routing="dynamic", sampled_steps=6,
                   candidates_per_expert=5)


@pytest.mark.parametrize(("work_limit", "expected"), [(10.0, "full"), (0.1, "starts"), (0.03, "one-chain"),
                                                      (1e-4, "greedy")],
                         ids=["full", "starts", "one-chain", "greedy"])
def test_a_layer_takes_the_best_level_its_own_share_pays_for(work_limit, expected):
    budget = WorkBudget(work_limit, num_layers=2, shape=SHAPE)
    costs = budget.costs(num_chains=3, num_others=0)
    assert costs == sorted(costs, reverse=True) and costs[-1] == 0.0
    assert budget.start_layer(0, 3, 0) == expected
    # The other layer's work does not change this one's level: no budget passes between layers.
    budget.charge(1, 1e9)
    assert budget.start_layer(0, 3, 0) == expected


def test_searches_get_the_share_left_and_no_deadline():
    budget = WorkBudget(4.0, num_layers=4, shape=SHAPE)
    budget.start_layer(2, 3, 0)
    assert budget.spare(2, 0.25, 3, 0) == pytest.approx(0.75)
    budget.charge(2, 0.5)
    assert budget.spare(2, 0.25, 3, 0) == pytest.approx(0.25)
    assert budget.spare(2, 5.0, 3, 0) == 0.0
    deadline, rounds = budget.ring_limits(0.25)
    assert deadline is None and rounds == 25


def test_a_fit_is_the_same_whatever_the_workers_and_the_clock(monkeypatch):
    counts = skewed_counts(12, 3, 24, 2)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    one = fit_placement("cpsat", counts, cluster, work_limit=1.5, workers=1)
    # A clock that jumps an hour at every reading decides nothing under the work budget.
    real = time.perf_counter
    jumps = iter(range(10**9))
    monkeypatch.setattr(time, "perf_counter", lambda: real() + 3600.0 * next(jumps))
    three = fit_placement("cpsat", counts, cluster, work_limit=1.5, workers=3)
    assert np.array_equal(one.phy2log_LP, three.phy2log_LP) and np.array_equal(one.weights_LP, three.weights_LP)
    assert one.info["budget"] == "work" and one.info["levels"] == three.info["levels"]


def test_a_tiny_work_limit_gives_the_greedy_at_once_and_says_why():
    counts = skewed_counts(12, 4, 24, 3)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    placement = fit_placement("cpsat", counts, cluster, work_limit=1e-4)
    greedy = fit_placement("deepseek", counts, cluster)
    assert np.array_equal(placement.phy2log_LP, greedy.phy2log_LP)
    assert placement.info["levels"]["greedy"] == 4 and "budget could not pay" in placement.info["degraded_reason"]


@pytest.mark.parametrize("work_limit", [0.05, 0.3, 3.0], ids=["small", "medium", "large"])
def test_more_work_never_fits_worse_than_the_greedy(work_limit):
    counts = skewed_counts(12, 2, 24, 4)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    placement = fit_placement("cpsat", counts, cluster, work_limit=work_limit)
    greedy_fit = placement.info["fitted_mean"].get("deepseek")
    assert placement.info["fitted_bound_mean"] <= placement.info["fitted_chosen"] + 1e-12
    if greedy_fit is not None:
        assert placement.info["fitted_chosen"] <= greedy_fit + 1e-12
    assert set(placement.info["levels"]) == set(LEVELS)
