"""Burst patches: a bursting single-replica expert gets a replica from an expert with one to spare, balanced layers
are left alone, moves stay within their bound; the replay with patches serves a burst better and counts its moves."""

import numpy as np
import pytest

from placement import ClusterSpec, Placement, rolling_replay
from placement.burst_patch import PatchConfig, patch_for_bursts
from placement.routing.live_router import LayerRoutingTable, route_step

CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=3, gpus_per_node=4)
# 4 GPUs x 3 slots, 8 experts: 0-3 once each (one per GPU), 4-7 twice, on neighbouring GPUs.
SLOTS = np.array([[0, 4, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7]])


def _placement(phy2log_LP=SLOTS) -> Placement:
    return Placement.equal_split(np.asarray(phy2log_LP), CLUSTER, 8)


def _live_imbalance(placement: Placement, load_E: np.ndarray) -> float:
    import torch

    table = LayerRoutingTable.build(placement.phy2log_LP[0], CLUSTER.slots_per_gpu, 8,
                                    weights_P=placement.weights_LP[0])
    loads_G = route_step(torch.as_tensor(np.rint(load_E).astype(np.int64)), table).view(4, -1).sum(1).numpy()
    return float(loads_G.max() / loads_G.mean())


def test_a_bursting_single_replica_expert_gets_a_replica_from_an_expert_with_one_to_spare():
    load_E = np.array([400.0, 50, 50, 50, 100, 100, 100, 100])  # expert 0, alone on GPU 0, carries 400 of 950
    patched, moved = patch_for_bursts(_placement(), load_E[None])
    slots = patched.phy2log_LP[0]
    replicas = np.bincount(slots, minlength=8)
    assert 1 <= moved <= 2 and replicas[0] >= 2 and replicas.min() >= 1
    for gpu in range(4):  # no GPU holds two replicas of one expert
        assert len(set(slots[3 * gpu:3 * gpu + 3])) == 3
    assert _live_imbalance(patched, load_E) < _live_imbalance(_placement(), load_E) - 0.1
    assert patched.info["patched_slots"] == moved


def test_a_balanced_layer_is_left_as_fitted_and_moves_stay_within_their_bound():
    balanced = np.array([[100.0, 100, 100, 100, 100, 100, 100, 100]])
    placement = _placement()
    assert patch_for_bursts(placement, balanced) == (placement, 0)
    bursting = np.array([[900.0, 50, 50, 50, 100, 100, 100, 100]])
    assert patch_for_bursts(placement, bursting, max_moves=0) == (placement, 0)
    _, moved = patch_for_bursts(placement, bursting, max_moves=1)
    assert moved == 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: patch_for_bursts(p, np.ones((2, 8))), "recent_LE must be \\[layers, experts\\] = \\[1, 8\\]"),
        (lambda p: patch_for_bursts(p, -np.ones((1, 8))), "recent_LE must be"),
        (lambda p: patch_for_bursts(p, np.ones((1, 8)), max_moves=-1), "max_moves must be >= 0"),
        (lambda p: patch_for_bursts(p, np.ones((1, 8)), threshold=0.5), "threshold >= 1"),
        (lambda p: PatchConfig(lag=-1), "patches need lag >= 0"),
        (lambda p: PatchConfig(every=0), "every >= 1"),
    ],
    ids=["wrong-shape", "negative-load", "negative-moves", "threshold-below-one", "negative-lag", "every-zero"],
)
def test_bad_arguments_raise_naming_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call(_placement())


def _bursty_counts(seed: int = 0) -> np.ndarray:
    """[60, 1, 8] Poisson counts of a calm layer whose expert 0 turns 8 times as hot from step 30 on."""
    rng = np.random.default_rng(seed)
    rate_TE = np.tile(np.array([60.0, 60, 60, 60, 120, 120, 120, 120]), (60, 1))
    rate_TE[30:, 0] *= 8
    return rng.poisson(rate_TE)[:, None, :]


def test_the_replay_with_patches_serves_the_burst_better_and_counts_the_slots_it_moved():
    counts = _bursty_counts()
    args = dict(every=20, window=20, routing="live", lag=10, also_routings=("dynamic",))
    plain = rolling_replay(counts, CLUSTER, "deepseek", **args)
    patched = rolling_replay(counts, CLUSTER, "deepseek", patches=PatchConfig(lag=2, window=3, every=2), **args)
    # Steps [30, 40) serve the placement fitted on [0, 20): only a patch gives expert 0 its replica in time.
    burst = slice(4, 10)  # trace steps 34-39 (held-out step 0 is trace step 30); a patch sees the burst by step 34
    assert patched.held_out.imbalance_TL[burst].mean() < plain.held_out.imbalance_TL[burst].mean() - 0.1
    assert patched.patch_moves > 0 and plain.patch_moves is None
    assert patched.summary()["patch_moves"] == patched.patch_moves and "patch_moves" not in plain.summary()
    assert patched.held_out_also["dynamic"].imbalance_TL.shape == patched.held_out.imbalance_TL.shape
    # A patch that would serve only after the trace's end never lands: the replay is the plain one.
    never = rolling_replay(counts, CLUSTER, "deepseek", patches=PatchConfig(lag=1000), **args)
    np.testing.assert_array_equal(never.held_out.imbalance_TL, plain.held_out.imbalance_TL)
    assert never.patch_moves == 0
