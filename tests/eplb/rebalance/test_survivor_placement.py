"""The placement survivors serve after losing GPUs: every expert keeps a slot, survivors keep what they held,
slots grow only when the survivors have too few, and the lightest redundant replicas make room."""

import numpy as np
import pytest

from eplb.rebalance.survivor_placement import placement_without, survivor_fills
from placement import ClusterSpec, Placement, PlacementInfeasibleError


def placement_of(rows: list[list[int]], num_experts: int) -> Placement:
    cluster = ClusterSpec(num_gpus=len(rows), slots_per_gpu=len(rows[0]), gpus_per_node=len(rows))
    return Placement.equal_split(np.array(rows).reshape(1, -1), cluster, num_experts)


def test_lost_experts_replace_redundant_replicas_and_survivors_keep_theirs():
    placement = placement_of([[0, 1, 2], [3, 4, 5], [6, 7, 0], [1, 2, 3]], 8)
    load = np.arange(8, dtype=float)[None]
    survived = placement_without(placement, [1], load)
    rows = survived.phy2log_LP.reshape(3, 3)
    assert survived.cluster.num_gpus == 3 and survived.cluster.slots_per_gpu == 3
    assert set(rows.reshape(-1)) == set(range(8))  # 4 and 5 (only on GPU 1) are back
    kept = sum(old == new for old_row, new_row in zip([[0, 1, 2], [6, 7, 0], [1, 2, 3]], rows.tolist())
               for old, new in zip(old_row, new_row))
    assert kept == 7  # two redundant replicas gave way, nothing else moved
    assert np.allclose(np.bincount(survived.phy2log_LP[0], survived.weights_LP[0], minlength=8), 1.0)


def test_slots_grow_when_the_survivors_hold_fewer_slots_than_experts():
    placement = placement_of([[0, 1], [2, 3], [4, 5], [6, 7]], 8)
    survived = placement_without(placement, [0, 2], np.ones((1, 8)))
    assert survived.cluster.num_gpus == 2 and survived.cluster.slots_per_gpu == 4
    assert sorted(survived.phy2log_LP[0].tolist()) == list(range(8))
    assert survived.info["survived"] == {"lost_gpus": [0, 2], "from_gpus": 4}


def test_every_layer_is_refilled_and_spare_slots_replicate_the_heaviest():
    rng = np.random.default_rng(0)
    rows = np.stack([rng.permutation(np.arange(12) % 10) for _ in range(3)])  # 3 layers, 4 GPUs x 3 slots
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=3, gpus_per_node=4)
    placement = Placement.equal_split(rows, cluster, 10)
    load = rng.random((3, 10)) * 100
    survived = placement_without(placement, [3], load)
    for layer in range(3):
        assert set(survived.phy2log_LP[layer].tolist()) == set(range(10))


def test_no_survivor_is_refused():
    with pytest.raises(PlacementInfeasibleError, match="every GPU"):
        placement_without(placement_of([[0, 1], [1, 0]], 2), [0, 1], np.ones((1, 2)))


def test_two_non_neighbours_lost_at_once_are_restored_from_host_copies_when_two_failures_are_tolerated():
    # Expert 7 lives on GPUs 1 and 3 only; with one failure tolerated nobody keeps a host copy of it.
    placement = placement_of([[0, 1, 2], [3, 4, 7], [5, 6, 0], [1, 2, 7]], 8)
    target = placement_without(placement, [1, 3], np.arange(8, dtype=float)[None])
    with pytest.raises(LookupError, match="expert 7 of layer 0"):
        survivor_fills(placement, target, [1, 3], [0, 2], failures_tolerated=1)
    fills, restored = survivor_fills(placement, target, [1, 3], [0, 2], failures_tolerated=2)
    assert restored == 3  # experts 3, 4 and 7 had every replica on the lost GPUs
    new_GS = target.phy2log_LP[0].reshape(2, -1)
    for fill in fills:  # every slot that changes is filled from a survivor (new rank numbers 0 and 1)
        assert fill.src_rank in (0, 1) and fill.dst_rank in (0, 1)
        if fill.dst_kind == "slot":
            assert new_GS[fill.dst_rank, fill.dst_index] == fill.expert
    restored_slots = {fill.expert for fill in fills if fill.dst_kind == "slot"}
    assert {3, 4, 7} <= restored_slots
