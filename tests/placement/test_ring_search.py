"""The ring search: its arc score is the exact best split on ring layouts, and its swaps keep a valid layout."""

import itertools

import numpy as np
import pytest

from placement.policies.chain_layout import chain_layout
from placement.policies.deepseek import replicate_greedy
from placement.policies.ring_search import arc_masks, ring_objective, ring_search
from placement.routing.exact_split import exact_max_load


def _exact_objective(counts_TE, phy2log_P, num_gpus, slots) -> float:
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    ratios = [exact_max_load(step, phy2log_P, gpu_of_slot, num_gpus) / (step.sum() / num_gpus) for step in counts_TE]
    return float(np.mean(ratios))


def _random_chain(seed: int, num_experts: int, num_gpus: int, slots: int, steps: int = 4):
    rng = np.random.default_rng(seed)
    steps_TE = rng.poisson(rng.lognormal(2.5, 0.8, num_experts), size=(steps, num_experts)).astype(float) + 1
    load_E = steps_TE.mean(axis=0)
    _, _, replicas_LE = replicate_greedy(load_E[None], num_gpus * slots)
    return steps_TE, chain_layout(load_E, replicas_LE[0], num_gpus, slots, "random", seed, steps_TE)


def test_arcs_are_every_run_of_consecutive_gpus_and_the_whole_ring():
    masks = arc_masks(4)
    assert masks.shape == (4 * 3 + 1, 4)
    runs = {tuple(np.flatnonzero(m)) for m in masks}
    assert (3, 0) in {tuple(sorted(r, key=lambda g: (g - 3) % 4)) for r in runs}  # wraps round the ring
    assert (0, 1, 2, 3) in runs and len(runs) == 13


@pytest.mark.parametrize("seed", range(4))
def test_arc_score_equals_the_exact_lp_on_chain_layouts(seed):
    steps_TE, phy2log = _random_chain(seed, num_experts=12, num_gpus=6, slots=3)
    assert ring_objective(steps_TE, phy2log, 6, 3) == pytest.approx(_exact_objective(steps_TE, phy2log, 6, 3),
                                                                    rel=1e-9)


def test_arc_score_is_a_lower_bound_when_replicas_are_not_consecutive():
    # A on GPUs 0 and 2 (not consecutive), B on 1 and 3; C, D, E, F alone on GPUs 0, 1, 2, 3. A, C and E can only
    # use GPUs 0 and 2: 30 tokens on two GPUs, 2 x the mean of 7.5. No arc holds exactly {0, 2}: the arcs see 1.33.
    steps_TE = np.array([[10.0, 0.0, 10.0, 0.0, 10.0, 0.0]])
    phy2log = np.array([0, 2, 1, 3, 0, 4, 1, 5])
    assert _exact_objective(steps_TE, phy2log, 4, 2) == pytest.approx(2.0)
    assert ring_objective(steps_TE, phy2log, 4, 2) == pytest.approx(4 / 3)


def test_a_hot_single_trades_places_with_a_cold_replicated_expert():
    # GPU 0: A C, GPU 1: A B, GPU 2: B D. C (30 tokens) has one replica and carries GPU 0 alone to 1.5 x the mean
    # of 20; given A's two replicas instead, every GPU can carry exactly 20.
    steps_TE = np.array([[10.0, 10.0, 30.0, 10.0]])
    start = np.array([0, 2, 0, 1, 1, 3])
    assert ring_objective(steps_TE, start, 3, 2) == pytest.approx(1.5)
    searched, score, _ = ring_search(steps_TE, start, 3, 2)
    assert score == pytest.approx(1.0)
    assert _exact_objective(steps_TE, searched, 3, 2) == pytest.approx(1.0)
    assert np.bincount(searched, minlength=4)[2] == 2


@pytest.mark.parametrize("seed", [0, 1, 4, 6])
def test_search_reaches_the_best_relabelling_on_small_cases(seed):
    steps_TE, phy2log = _random_chain(seed, num_experts=6, num_gpus=4, slots=2)
    best = min(ring_objective(steps_TE, np.array(perm)[phy2log], 4, 2) for perm in itertools.permutations(range(6)))
    _, score, _ = ring_search(steps_TE, phy2log, 4, 2, seed=seed)
    assert score == pytest.approx(best, rel=1e-12)
    assert score <= ring_objective(steps_TE, phy2log, 4, 2) + 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_search_keeps_a_valid_layout_and_never_gets_worse(seed):
    num_gpus, slots, num_experts = 8, 3, 16
    steps_TE, phy2log = _random_chain(seed, num_experts, num_gpus, slots, steps=6)
    speed_G = np.random.default_rng(seed).uniform(0.5, 1.5, num_gpus)
    searched, score, _ = ring_search(steps_TE, phy2log, num_gpus, slots, speed_G, seed=seed)
    assert score <= ring_objective(steps_TE, phy2log, num_gpus, slots, speed_G) + 1e-12
    assert score == pytest.approx(ring_objective(steps_TE, searched, num_gpus, slots, speed_G))
    # The same replica sets, relabelled: counts per set move with the sets, each expert keeps at least one.
    assert sorted(np.bincount(searched, minlength=num_experts)) == sorted(np.bincount(phy2log, minlength=num_experts))
    gpu_sets = [frozenset((np.flatnonzero(p == e) // slots).tolist()) for p in (phy2log, searched)
                for e in range(num_experts)]
    assert sorted(map(sorted, gpu_sets[:num_experts])) == sorted(map(sorted, gpu_sets[num_experts:]))
    assert all(len(s) == np.sum(searched == e) for e, s in enumerate(gpu_sets[num_experts:]))


def test_a_past_deadline_returns_the_start():
    steps_TE, phy2log = _random_chain(0, 16, 8, 3)
    searched, score, _ = ring_search(steps_TE, phy2log, 8, 3, deadline=0.0)
    assert (searched == phy2log).all()
    assert score == ring_objective(steps_TE, phy2log, 8, 3)
