"""Burst exposure: each entry is the exact best split of the layer's load with one expert scaled, by hand and
against the LP; errors name the parameter."""

import numpy as np
import pytest

from placement import ClusterSpec, Placement, burst_exposure
from placement.routing.exact_split import exact_max_load


def _placement(phy2log_LP, num_gpus: int, slots: int, num_experts: int) -> Placement:
    cluster = ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots, gpus_per_node=num_gpus)
    return Placement.equal_split(np.asarray(phy2log_LP), cluster, num_experts)


def test_by_hand_a_burst_on_a_single_replica_expert_is_stuck_on_its_gpu():
    # 2 GPUs x 2 slots: expert 0 on both, expert 1 on GPU 0, expert 2 on GPU 1; load [2, 1, 1] (mean 2 per GPU).
    placement = _placement([[0, 1, 0, 2]], 2, 2, 3)
    exposure = burst_exposure(placement, np.array([[2.0, 1.0, 1.0]]), factor=5.0)
    # Expert 0 x5: [10, 1, 1] splits 6 / 6. Expert 1 x5: [2, 5, 1], GPU 0 carries at least 5 of 8 -> 5 / 4.
    assert exposure == pytest.approx(np.array([[1.0, 1.25, 1.25]]), abs=2e-3)
    assert burst_exposure(placement, np.array([[2.0, 1.0, 1.0]]), factor=1.0) == pytest.approx(np.ones((1, 3)),
                                                                                             abs=2e-3)


@pytest.mark.parametrize("seed", range(3))
def test_every_entry_is_the_lp_optimum_of_its_burst(seed):
    rng = np.random.default_rng(seed)
    num_gpus, slots, num_experts = 4, 3, 9
    phy2log_LP = np.stack([np.concatenate([rng.permutation(num_experts), rng.integers(0, num_experts, 3)])
                           for _ in range(2)])
    for layer in range(2):  # no GPU holds two replicas of one expert: re-draw the spare slots until so
        while any(len(set(phy2log_LP[layer, g * slots:(g + 1) * slots])) < slots for g in range(num_gpus)):
            phy2log_LP[layer] = np.concatenate([rng.permutation(num_experts), rng.integers(0, num_experts, 3)])
    placement = _placement(phy2log_LP, num_gpus, slots, num_experts)
    load_LE = rng.lognormal(3.0, 0.7, (2, num_experts))
    exposure_LE = burst_exposure(placement, load_LE, factor=3.0)
    for layer in range(2):
        for expert in range(num_experts):
            row = load_LE[layer].copy()
            row[expert] *= 3.0
            exact = exact_max_load(row, phy2log_LP[layer], placement.gpu_of_slot_P, num_gpus) / (row.sum() / num_gpus)
            assert exposure_LE[layer, expert] == pytest.approx(exact, rel=2e-3)


@pytest.mark.parametrize(
    "load, factor, message",
    [
        ([[2.0, 1.0, 1.0]], 0.5, "factor must be"),
        ([[2.0, 1.0, 1.0]], float("nan"), "factor must be"),
        ([[2.0, 1.0]], 2.0, "load_LE must be \\[layers, experts\\] = \\[1, 3\\]"),
        ([[2.0, -1.0, 1.0]], 2.0, "load_LE must be finite, non-negative"),
        ([[0.0, 0.0, 0.0]], 2.0, "carry tokens in every layer"),
    ],
    ids=["factor-below-one", "factor-nan", "wrong-shape", "negative-load", "empty-layer"],
)
def test_bad_arguments_raise_naming_the_parameter(load, factor, message):
    with pytest.raises(ValueError, match=message):
        burst_exposure(_placement([[0, 1, 0, 2]], 2, 2, 3), np.array(load), factor)
