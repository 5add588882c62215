"""Trial slot maps scored together (`placement.routing.trial_split`): each trial's imbalance is the per-trial live
router split's, whatever a one-slot move does to an expert's GPUs; its water-filling is `dynamic_split`'s."""

import numpy as np
import pytest

from placement.routing.dynamic_split import MOMENTUM, ROUTER_ROUNDS, ReplicaGraph, optimal_split_loads, water_fill
from placement.routing.trial_split import trial_imbalances


def per_trial_imbalance(phy2log_P: np.ndarray, gpu_of_slot_P: np.ndarray, load_E: np.ndarray, num_gpus: int) -> float:
    graph = ReplicaGraph.build(phy2log_P, gpu_of_slot_P, len(load_E), num_gpus)
    loads_1G, _ = optimal_split_loads(load_E[None], graph, -np.inf, ROUTER_ROUNDS, MOMENTUM)
    return float(loads_1G.max() / max(loads_1G.mean(), 1e-12))


def assert_matches_per_trial(trials_BP: np.ndarray, gpu_of_slot_P: np.ndarray, load_E: np.ndarray, num_gpus: int):
    got = trial_imbalances(trials_BP, gpu_of_slot_P, load_E, num_gpus)
    expected = [per_trial_imbalance(trial, gpu_of_slot_P, load_E, num_gpus) for trial in trials_BP]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0)


# 4 GPUs x 3 slots, 7 experts: 0 on GPU 0 only, 1 on GPUs 0 and 1, 2 twice on GPU 1, 3 and 5 on GPUs 2 and 3,
# 4 on GPUs 0 and 2, 6 on GPU 3 only.
SLOTS = np.array([0, 1, 4, 1, 2, 2, 3, 4, 5, 3, 6, 5])
GPU_OF_SLOT = np.arange(12) // 3


@pytest.mark.parametrize(
    "moves",
    [
        [(0, 6)],  # expert 0 (one GPU) gets a replica on GPU 2: from fixed to movable
        [(1, 3)],  # expert 1 loses its GPU 1 replica: from two GPUs to one
        [(4, 0)],  # one of expert 2's two slots on GPU 1 goes to expert 0: expert 2 still on GPU 1 only
        [(5, 0), (4, 3)],  # both of expert 2's slots move: 2 becomes absent, its tokens unplaced
        [(6, 1), (8, 3)],  # two moves in one trial
        [],  # the slot map itself
    ],
    ids=["one-to-two-gpus", "two-to-one-gpu", "two-slots-one-gpu", "expert-absent", "two-moves", "unchanged"],
)
def test_each_trial_scores_as_the_per_trial_split_whatever_a_move_does_to_an_experts_gpus(moves):
    load_E = np.array([300.0, 120, 90, 200, 40, 0, 60])  # expert 5 carries nothing
    trial = SLOTS.copy()
    for slot, expert in moves:
        trial[slot] = expert
    others = np.tile(SLOTS, (3, 1))
    others[0, 6], others[1, 11], others[2, 2] = 0, 0, 3  # the trial is scored with others as in a move's batch
    assert_matches_per_trial(np.vstack([others, trial[None]]), GPU_OF_SLOT, load_E, 4)
    assert_matches_per_trial(trial[None], GPU_OF_SLOT, load_E, 4)  # and alone


def test_random_one_slot_trials_score_as_the_per_trial_split():
    rng = np.random.default_rng(0)
    for case in range(40):
        num_gpus, slots = int(rng.integers(2, 7)), int(rng.integers(2, 5))
        num_experts = int(rng.integers(num_gpus, num_gpus * slots + 1))
        current = np.concatenate([np.arange(num_experts), rng.integers(0, num_experts, num_gpus * slots - num_experts)])
        rng.shuffle(current)
        trials = np.tile(current, (int(rng.integers(1, 12)), 1))
        slot_of_trial = rng.integers(0, current.size, len(trials))
        trials[np.arange(len(trials)), slot_of_trial] = rng.integers(0, num_experts, len(trials))
        load_E = rng.exponential(100.0, num_experts) * (rng.random(num_experts) > 0.25)
        if case % 10 == 0:
            load_E[:] = 0.0
        assert_matches_per_trial(trials, np.arange(current.size) // slots, load_E, num_gpus)


def test_a_slot_map_without_spare_replicas_is_its_fixed_load():
    trials = np.array([[0, 1, 2, 3], [1, 0, 2, 3]])  # 2 GPUs x 2 slots, each expert once: nothing to split
    got = trial_imbalances(trials, np.array([0, 0, 1, 1]), np.array([30.0, 10, 10, 10]), 2)
    np.testing.assert_allclose(got, [40 / 30, 40 / 30])


def reference_water_fill(tokens_BM: np.ndarray, base_BMY: np.ndarray) -> np.ndarray:
    """The water-filling as first written (sorting indices, then levels): the reference `water_fill` must match."""
    order = np.argsort(base_BMY, axis=-1)
    sorted_base = np.take_along_axis(base_BMY, order, axis=-1)
    finite = np.where(np.isfinite(sorted_base), sorted_base, 0.0)
    k = np.arange(1, base_BMY.shape[-1] + 1)
    level_k = (tokens_BM[..., None] + np.cumsum(finite, axis=-1)) / k
    active = (sorted_base < level_k) | (k == 1)
    num_active = active.sum(axis=-1, keepdims=True)
    level = np.take_along_axis(level_k, num_active - 1, axis=-1)
    return np.where(np.isfinite(base_BMY), np.maximum(level - base_BMY, 0.0), 0.0)


def test_water_fill_is_the_first_written_ones_bit_for_bit():
    rng = np.random.default_rng(1)
    tokens_BM = rng.exponential(10.0, (5, 30)) * (rng.random((5, 30)) > 0.2)
    base_BMY = np.round(rng.exponential(10.0, (5, 30, 4)))  # rounded: ties among the levels
    base_BMY[rng.random(base_BMY.shape) < 0.4] = np.inf
    base_BMY[0, 0] = np.inf  # an expert with no bin
    np.testing.assert_array_equal(water_fill(tokens_BM, base_BMY), reference_water_fill(tokens_BM, base_BMY))
