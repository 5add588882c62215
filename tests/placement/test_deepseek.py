"""The baseline policy reproduces DeepSeek's public EPLB algorithm exactly, vectorised."""

import numpy as np
import pytest

from placement import ClusterSpec, Placement, PlacementInfeasibleError, fit_placement, static_gpu_loads
from placement.policies.deepseek import Arithmetic, deepseek_rebalance, pack_balanced, replicate_greedy
from placement.policies.deepseek_reference import reference_rebalance

README_LOAD = np.array(
    [
        [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
        [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
    ]
)
README_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]


def test_public_readme_example_is_reproduced_exactly():
    phy2log, log2phy, logcnt = deepseek_rebalance(README_LOAD, 16, 4, 2, 8)
    assert phy2log.tolist() == README_PHY2LOG
    assert log2phy.shape == (2, 12, 2)
    np.testing.assert_array_equal(logcnt.sum(axis=1), [16, 16])
    # log2phy and phy2log describe the same slots.
    for layer in range(2):
        for expert in range(12):
            slots = [s for s in log2phy[layer, expert] if s >= 0]
            assert len(slots) == logcnt[layer, expert]
            assert all(phy2log[layer, s] == expert for s in slots)


def test_scoring_the_readme_placement_gives_its_equal_split_gpu_loads_summed_by_hand():
    # No publication states these loads: they are README_PHY2LOG's layer 0 on 8 GPUs x 2 slots, equal split, summed
    # by hand (expert 5 has 2 replicas: 165/2 + 39 on GPU 0, 165/2 + 4 on GPU 1, 73 + 104/2 on GPU 2, ...).
    phy2log, _, _ = deepseek_rebalance(README_LOAD, 16, 4, 2, 8)
    placement = Placement.equal_split(phy2log, ClusterSpec(num_gpus=8, slots_per_gpu=2, gpus_per_node=4), 12)
    per_gpu = static_gpu_loads(README_LOAD[None], placement)[0]
    np.testing.assert_allclose(per_gpu[0], [121.5, 86.5, 125.0, 113.0, 147.5, 131.5, 156.0, 152.0])
    np.testing.assert_allclose(per_gpu.max(axis=1) / per_gpu.mean(axis=1), [1.208, 1.242], atol=1e-3)


@pytest.mark.parametrize(
    "num_slots, num_groups, num_nodes, num_gpus",
    [(320, 1, 1, 64), (384, 1, 1, 128), (384, 8, 8, 128), (288, 32, 4, 32), (256, 1, 1, 64)],
    ids=["global-64x5", "global-128x3", "hier-8-nodes", "hier-4-nodes", "no-redundancy"],
)
def test_vectorised_policy_equals_the_loop_reference(num_slots, num_groups, num_nodes, num_gpus):
    load = np.random.default_rng(num_slots + num_groups).integers(0, 2000, size=(4, 256)).astype(float)
    phy2log, _, _ = deepseek_rebalance(load, num_slots, num_groups, num_nodes, num_gpus)
    np.testing.assert_array_equal(phy2log, reference_rebalance(load, num_slots, num_groups, num_nodes, num_gpus))


def test_replication_minimises_the_largest_load_per_replica():
    load = np.array([[100.0, 10.0, 40.0, 1.0]])
    _, _, logcnt = replicate_greedy(load, 8)
    np.testing.assert_array_equal(logcnt, [[4, 1, 2, 1]])  # 25, 10, 20, 1: no other split of 8 does better


def test_packing_fills_every_pack_exactly_and_heaviest_first():
    weight = np.array([[9.0, 8.0, 7.0, 1.0, 1.0, 1.0]])
    pack, rank = pack_balanced(weight, 3)
    assert sorted(np.bincount(pack[0])) == [2, 2, 2]
    assert pack[0, :3].tolist() == [0, 1, 2]
    assert rank[0, :3].tolist() == [0, 0, 0]


def test_packing_visits_equal_items_in_the_order_it_is_given():
    weight = np.ones((1, 6))
    stable, _ = pack_balanced(weight, 3)
    reversed_order, _ = pack_balanced(weight, 3, lambda w: np.argsort(-w, axis=1, kind="stable")[:, ::-1])
    assert stable[0].tolist() == [0, 1, 2, 0, 1, 2]
    assert reversed_order[0].tolist() == [2, 1, 0, 2, 1, 0]


def test_the_arithmetic_sets_the_float_type_of_the_loads():
    # 16777217 is no float32: read as one it ties with 16777216, and the lower index takes the redundant slot.
    load = np.array([[16777216.0, 16777217.0]])
    _, _, float64_logcnt = deepseek_rebalance(load, 3, 1, 1, 1)
    _, _, float32_logcnt = deepseek_rebalance(load, 3, 1, 1, 1, Arithmetic(dtype=np.float32))
    assert float64_logcnt.tolist() == [[1, 2]] and float32_logcnt.tolist() == [[2, 1]]


def test_fit_placement_refuses_too_few_slots_with_advice():
    counts = np.ones((2, 1, 32), dtype=np.int64)
    with pytest.raises(PlacementInfeasibleError, match="slots_per_gpu >= 16 or num_gpus >= 16"):
        fit_placement("deepseek", counts, ClusterSpec(num_gpus=2, slots_per_gpu=3))


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(PlacementInfeasibleError, match="deepseek"):
        fit_placement("magic", np.ones((1, 1, 4), dtype=np.int64), ClusterSpec(num_gpus=2, slots_per_gpu=2))
