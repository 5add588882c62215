"""The swap search: never worse than its start, never two replicas of one expert on one GPU, node limits kept,
replica moves under equal split, the same moves in any process."""

import numpy as np
import pytest

from placement import ClusterSpec
from placement.policies.deepseek import place_deepseek
from placement.policies.swap_search import swap_search


def objective(counts_TE: np.ndarray, phy2log_P: np.ndarray, num_gpus: int) -> float:
    """Mean over steps of max / mean GPU load under equal split (the search's objective, computed plainly)."""
    replicas = np.bincount(phy2log_P, minlength=counts_TE.shape[1])
    share_TP = counts_TE[:, phy2log_P] / replicas[phy2log_P]
    loads_TG = share_TP.reshape(len(counts_TE), num_gpus, -1).sum(axis=2)
    return float((loads_TG.max(axis=1) / loads_TG.mean(axis=1)).mean())


def lognormal_counts(steps: int, experts: int, seed: int, sigma: float = 0.8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0, sigma, experts)
    return rng.multinomial(40 * experts, popularity / popularity.sum(), size=steps)


@pytest.mark.parametrize(("gpus", "slots", "experts"), [(16, 4, 64), (24, 2, 40), (8, 5, 32)],
                         ids=["no-redundant-slot", "two-slots", "five-slots"])
def test_the_search_lowers_the_greedys_objective_and_keeps_every_rule(gpus, slots, experts):
    counts = lognormal_counts(20, experts, seed=gpus)
    start = place_deepseek(counts.sum(axis=0)[None], ClusterSpec(num_gpus=gpus, slots_per_gpu=slots)).phy2log_LP[0]
    found, score, spent = swap_search(counts, start, gpus, slots, max_evaluations=1e9)
    assert score == pytest.approx(objective(counts, found, gpus))
    assert score <= objective(counts, start, gpus) + 1e-12
    assert np.array_equal(np.bincount(found, minlength=experts), np.bincount(start, minlength=experts))
    per_gpu = found.reshape(gpus, slots)
    assert all(len(set(row)) == slots for row in per_gpu) and (np.diff(per_gpu, axis=1) > 0).all()
    assert 0 < spent


def test_without_redundant_slots_it_evens_the_sums_the_greedy_leaves():
    counts = lognormal_counts(30, 64, seed=5, sigma=0.5)
    start = place_deepseek(counts.sum(axis=0)[None], ClusterSpec(num_gpus=16, slots_per_gpu=4)).phy2log_LP[0]
    found, score, _ = swap_search(counts, start, 16, 4, max_evaluations=1e9)
    assert score < objective(counts, start, 16) - 0.02


def test_swaps_stay_within_a_node_under_node_limits():
    counts = lognormal_counts(10, 64, seed=6)
    start = np.arange(64)  # expert e on GPU e // 4, node e // 16
    node_of_G = np.arange(16) // 4
    found, _, _ = swap_search(counts, start, 16, 4, max_evaluations=1e9, node_of_G=node_of_G)
    assert (np.sort(found.reshape(4, 16), axis=1) == np.arange(64).reshape(4, 16)).all()


def test_replica_moves_relieve_a_gpu_that_swaps_cannot():
    # Expert 0 carries half the tokens with one replica, expert 1 has two: on 4 GPUs x 2 slots the best swap pairs
    # expert 0 with a half of expert 1 (65 of a mean of 30), while moving a replica from expert 1 to expert 0
    # halves expert 0.
    counts = np.array([[60, 10, 10, 10, 10, 10, 10]])
    start = np.array([0, 2, 1, 3, 1, 4, 5, 6])
    _, swap_score, _ = swap_search(counts, start, 4, 2, max_evaluations=1e9)
    moved, move_score, _ = swap_search(counts, start, 4, 2, max_evaluations=1e9, recount=True)
    assert swap_score == pytest.approx(65 / 30)
    assert move_score < swap_score - 0.5 and np.bincount(moved)[0] == 2


def test_the_budget_is_counted_work_and_the_search_repeats_itself():
    counts = lognormal_counts(20, 64, seed=7)
    start = place_deepseek(counts.sum(axis=0)[None], ClusterSpec(num_gpus=16, slots_per_gpu=4)).phy2log_LP[0]
    nothing, _, spent = swap_search(counts, start, 16, 4, max_evaluations=0)
    assert spent == 0 and np.array_equal(nothing, np.sort(start.reshape(16, 4), axis=1).reshape(-1))
    first = swap_search(counts, start, 16, 4, max_evaluations=2e5)
    again = swap_search(counts, start, 16, 4, max_evaluations=2e5)
    assert np.array_equal(first[0], again[0]) and first[1:] == again[1:]
    assert first[2] <= 2e5 + 20 * 4 * 16 * 4


def test_with_min_z_a_swap_must_clear_the_noise_of_the_window_steps():
    rng = np.random.default_rng(3)
    noise_TE = rng.poisson(100.0, size=(50, 16)).astype(float)  # equal means: a pairing's gain is the steps' luck
    start_P = np.arange(16)  # 8 GPUs x 2 slots
    moved = {z: int((swap_search(noise_TE, start_P, 8, 2, min_z=z)[0] != start_P).sum()) for z in (0.0, 2.0)}
    assert moved[0.0] > moved[2.0]
    # A real imbalance clears it: experts 0 and 1, three times the others, share GPU 0 until a swap parts them.
    heavy_TE = noise_TE * np.r_[3.0, 3.0, np.ones(14)]
    parted_P, _, _ = swap_search(heavy_TE, start_P, 8, 2, min_z=2.0)
    assert np.flatnonzero(parted_P == 0)[0] // 2 != np.flatnonzero(parted_P == 1)[0] // 2


def test_with_holdout_share_the_search_runs_on_the_window_only_if_it_carries_to_the_newest_steps():
    counts_TE = np.full((60, 16), 100.0)
    counts_TE[::2, 2:] += 5.0  # some step-to-step variation, the same for every other expert
    start_P = np.arange(16)  # 8 GPUs x 2 slots; experts 0 and 1 share GPU 0
    # Experts 0 and 1 are hot together for the window's first 40 steps only (a burst that has passed): the swap that
    # parts them clears the whole window's noise, but the search on the older 40 steps gains nothing on the newest 20.
    counts_TE[:40, :2] *= 3.0

    def parted(placed_P):
        return np.flatnonzero(placed_P == 0)[0] // 2 != np.flatnonzero(placed_P == 1)[0] // 2

    assert parted(swap_search(counts_TE, start_P, 8, 2, min_z=2.0)[0])
    kept, objective, _ = swap_search(counts_TE, start_P, 8, 2, min_z=2.0, holdout_share=1 / 3)
    assert np.array_equal(kept, start_P)
    assert objective == pytest.approx(swap_search(counts_TE, start_P, 8, 2, max_evaluations=0)[1])  # on the window
    # Hot on the newest steps as well: the gate passes and the layout is the search's on the whole window.
    counts_TE[40:, :2] *= 3.0
    gated, gated_objective, _ = swap_search(counts_TE, start_P, 8, 2, min_z=2.0, holdout_share=1 / 3)
    plain, plain_objective, _ = swap_search(counts_TE, start_P, 8, 2, min_z=2.0)
    assert parted(gated) and np.array_equal(gated, plain) and gated_objective == plain_objective


def test_the_gate_judges_the_whole_layout_not_each_swap():
    # Experts 0 and 1 share GPU 0 and are hot on every step; experts 2 and 3 share GPU 1 and are hot on the older
    # steps only. The search on the older steps parts both pairs, its layout beats the start on the newest steps (the
    # first pair), and the layout served is the whole window's search, not the older steps' nor a part of it.
    rng = np.random.default_rng(5)
    counts_TE = rng.poisson(100.0, size=(60, 16)).astype(float)
    counts_TE[:, :2] *= 3.0
    counts_TE[:40, 2:4] *= 3.0
    start_P = np.arange(16)
    gated, _, _ = swap_search(counts_TE, start_P, 8, 2, min_z=2.0, holdout_share=1 / 3)
    older, _, _ = swap_search(counts_TE[:40], start_P, 8, 2, min_z=2.0)
    assert not np.array_equal(gated, start_P)
    assert np.array_equal(gated, swap_search(counts_TE, start_P, 8, 2, min_z=2.0)[0])
    assert not np.array_equal(gated, older)
