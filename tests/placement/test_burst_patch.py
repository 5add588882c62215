"""Burst patches: a bursting single-replica expert gets a replica from an expert with one to spare, balanced layers
are left alone, moves stay within their bound, a move's trials scored together pick the move per-trial scoring picks;
the replay with patches serves a burst better and counts its moves."""

import dataclasses
import numpy as np
import pytest

from placement import ClusterSpec, Placement, fit_placement, rolling_replay
from placement.burst_patch import CANDIDATES, DONORS, MIN_GAIN, THRESHOLD, TIE, PatchConfig, patch_for_bursts
from placement.drift_swaps import ring_imbalance
from placement.policies.chain_layout import chain_layout
from placement.policies.deepseek import replicate_greedy
from placement.routing.dynamic_split import MOMENTUM, ROUTER_ROUNDS, ReplicaGraph, optimal_split_loads
from placement.routing.live_router import LayerRoutingTable, route_step
from placement.routing.trial_split import trial_imbalances
from placement.scoring import score_placement

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


def test_a_ring_layer_is_judged_by_its_exact_split_not_the_water_filling_that_overstates_it():
    # A chain layout fitted to its load: the exact split is perfectly even, 12 water-filling rounds from the equal
    # split still leave the busiest GPU above the threshold. The layer is served within it and is left as fitted.
    gpus, slots, experts = 128, 3, 256
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
    load_E = np.random.default_rng(2).gamma(2.0, 100.0, experts)
    _, _, replicas_E = replicate_greedy(load_E[None], gpus * slots)
    placement = Placement.equal_split(chain_layout(load_E, replicas_E[0], gpus, slots, "random", 2)[None], cluster,
                                      experts)
    threshold = 1.005
    assert ring_imbalance(placement.phy2log_LP[0], load_E, gpus, slots) <= threshold
    assert trial_imbalances(placement.phy2log_LP, placement.gpu_of_slot_P, load_E, gpus, ROUTER_ROUNDS,
                            MOMENTUM)[0] > threshold
    assert patch_for_bursts(placement, load_E[None], max_moves=2, threshold=threshold) == (placement, 0)


def test_a_relabelled_ring_layer_is_judged_by_its_exact_split_in_its_ring_order():
    # The ring above with its GPUs relabelled (as a refit's GPU map relabels them): not consecutive in label order,
    # so only its ring order finds the chain whose exact split is within the threshold. Without it the water-filling
    # overstates the layer and a move breaks the ring.
    gpus, slots, experts = 128, 3, 256
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
    load_E = np.random.default_rng(2).gamma(2.0, 100.0, experts)
    _, _, replicas_E = replicate_greedy(load_E[None], gpus * slots)
    in_ring_GS = chain_layout(load_E, replicas_E[0], gpus, slots, "random", 2).reshape(gpus, slots)
    order_G = np.random.default_rng(3).permutation(gpus)  # ring position j is GPU order_G[j]
    relabelled_GS = np.empty_like(in_ring_GS)
    relabelled_GS[order_G] = in_ring_GS
    placement = Placement.equal_split(relabelled_GS.reshape(1, -1), cluster, experts)
    threshold = 1.005
    load_E[28] *= 1.2  # a four-replica expert a little hotter: the chain still splits it within the threshold
    assert ring_imbalance(in_ring_GS.ravel(), load_E, gpus, slots) <= threshold
    assert ring_imbalance(placement.phy2log_LP[0], load_E, gpus, slots) is None
    assert patch_for_bursts(placement, load_E[None], 2, threshold, ring_order_LG=order_G[None]) == (placement, 0)
    _, moved = patch_for_bursts(placement, load_E[None], 2, threshold)
    assert moved > 0
    with pytest.raises(ValueError, match="ring_order_LG"):
        patch_for_bursts(placement, load_E[None], 2, threshold, ring_order_LG=np.zeros((1, gpus), dtype=np.int64))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: patch_for_bursts(p, np.ones((2, 8))), "recent_LE must be \\[layers, experts\\] = \\[1, 8\\]"),
        (lambda p: patch_for_bursts(p, -np.ones((1, 8))), "recent_LE must be"),
        (lambda p: patch_for_bursts(p, np.ones((1, 8)), max_moves=-1), "max_moves must be >= 0"),
        (lambda p: patch_for_bursts(p, np.ones((1, 8)), threshold=0.5), "threshold >= 1"),
        (lambda p: PatchConfig(lag=-1), "patches need lag >= 0"),
        (lambda p: PatchConfig(every=0), "every >= 1"),
        (lambda p: PatchConfig(lag=6, every=2, burst_lag=4), "burst_lag must lie in \\(lag - every, lag\\]"),
        (lambda p: PatchConfig(lag=6, every=2, burst_lag=5, sequential=True), "with sequential False"),
    ],
    ids=["wrong-shape", "negative-load", "negative-moves", "threshold-below-one", "negative-lag", "every-zero",
         "burst-lag-too-early", "burst-lag-sequential"],
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


def _served_steps(counts: np.ndarray, patches: PatchConfig) -> list[np.ndarray]:
    """[L, P] slot map serving each step of the single fit's service in `_served_placements` (steps 20-60)."""
    from placement.replay import _served_placements

    fitted = _placement(np.array([[0, 4, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7]]))
    return [placement.phy2log_LP for first, stop, placement in _served_placements(fitted, counts, 20, 60, patches)
            for _ in range(first, stop)]


def test_one_patch_at_a_time_at_lag_zero_serves_what_overlapping_patches_serve():
    counts = _bursty_counts()
    overlapping = _served_steps(counts, PatchConfig(lag=0, window=3, every=2, drift_swaps=0))
    one_at_a_time = _served_steps(counts, PatchConfig(lag=0, window=3, every=2, drift_swaps=0, sequential=True))
    assert len(overlapping) == len(one_at_a_time) == 40
    for step, (a, b) in enumerate(zip(overlapping, one_at_a_time)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {20 + step}")


def test_one_patch_at_a_time_switches_no_sooner_than_its_lag_after_the_last():
    counts = _bursty_counts()
    switches = {}
    for sequential in (False, True):
        served = _served_steps(counts, PatchConfig(lag=6, window=3, every=2, drift_swaps=0, sequential=sequential))
        switches[sequential] = [20 + step for step in range(1, len(served))
                                if not np.array_equal(served[step], served[step - 1])]
    # Expert 0 bursts from step 30; patches start at even steps from 20, and the one started at 32 (the first to see
    # a burst step) switches at 38 either way.
    assert switches[True][0] == switches[False][0] == 38
    assert all(later - earlier >= 6 for earlier, later in zip(switches[True], switches[True][1:]))
    assert any(later - earlier < 6 for earlier, later in zip(switches[False], switches[False][1:])), \
        "overlapping patches switch as often as every 2 steps"


def test_a_patch_s_burst_layers_serve_from_its_burst_lag_and_the_rest_from_its_lag():
    """Layer 0 bursts (expert 0 8x from step 30), layer 1 stays calm: with burst_lag, layer 0's patch serves
    `lag - burst_lag` steps sooner than without, layer 1 exactly as without."""
    counts = np.concatenate([_bursty_counts(), np.full((60, 1, 8), 90)], axis=1)
    from placement.replay import _served_placements

    fitted = _placement(np.array([[0, 4, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7]] * 2))
    late = PatchConfig(lag=6, window=3, every=2, drift_swaps=0)
    early = dataclasses.replace(late, burst_lag=5)
    served = {}
    for name, patches in (("late", late), ("early", early)):
        served[name] = [placement.phy2log_LP for first, stop, placement
                        in _served_placements(fitted, counts, 20, 60, patches) for _ in range(first, stop)]
    first_change = {name: next(20 + step for step, layers in enumerate(steps)
                               if not np.array_equal(layers[0], fitted.phy2log_LP[0]))
                    for name, steps in served.items()}
    assert first_change == {"late": 38, "early": 37}, first_change
    for late_LP, early_LP in zip(served["late"], served["early"]):
        np.testing.assert_array_equal(late_LP[1], early_LP[1])  # the calm layer as without
    # Without drift swaps every change of layer 0 comes or goes with burst moves: each serves a step sooner.
    for step, (early_LP, later_LP) in enumerate(zip(served["early"], served["late"][1:])):
        np.testing.assert_array_equal(early_LP[0], later_LP[0], err_msg=f"step {20 + step}")


def test_a_refit_in_flight_blocks_patches_and_the_last_patch_serves_on():
    counts = _bursty_counts()
    from placement.replay import _served_placements

    fitted = _placement(np.array([[0, 4, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7]]))
    for sequential in (False, True):
        patches = PatchConfig(lag=2, window=3, every=2, drift_swaps=0, sequential=sequential, refit_blocks=True)
        # The fit serving [20, 60) is followed by one at step 40 that lands at 60: patch jobs start only in [20, 40).
        chunks = _served_placements(fitted, counts, 20, 60, patches, next_fit=40)
        free = _served_placements(fitted, counts, 20, 60, dataclasses.replace(patches, refit_blocks=False), 40)
        switches = [first for first, _, _ in chunks[1:]]
        assert switches and 20 + patches.lag <= switches[0] and switches[-1] < 40 + patches.lag, switches
        assert chunks[-1][1] == 60, "the last patch serves until the refit lands"
        assert chunks[0][2] is fitted and chunks[0][1] >= 22, "no patch before one started after the landing"
        assert any(first >= 40 + patches.lag for first, _, _ in free[1:]), "unblocked, patches go on after step 40"
        # Without a next fit (the last fit of a replay) nothing is blocked.
        last = _served_placements(fitted, counts, 20, 60, patches)
        assert [(a, b) for a, b, _ in last] == [(a, b) for a, b, _ in free]
        for (_, _, mine), (_, _, theirs) in zip(last, free):
            np.testing.assert_array_equal(mine.phy2log_LP, theirs.phy2log_LP)


def test_the_replay_with_refits_blocking_patches_patches_only_between_refits():
    counts = _bursty_counts()
    args = dict(every=20, window=20, routing="live", lag=10)
    free = rolling_replay(counts, CLUSTER, "deepseek", patches=PatchConfig(lag=2, window=3, every=2), **args)
    blocked = rolling_replay(counts, CLUSTER, "deepseek",
                             patches=PatchConfig(lag=2, window=3, every=2, refit_blocks=True), **args)
    plain = rolling_replay(counts, CLUSTER, "deepseek", **args)
    # Fits at 20 and 40 land at 30 and 50: patches start only in [30, 40) and [50, 60); the burst from step 30
    # is still patched (from step 34), so blocked patches serve it better than none and no better than unblocked.
    burst = slice(4, 10)
    assert blocked.held_out.imbalance_TL[burst].mean() < plain.held_out.imbalance_TL[burst].mean() - 0.1
    assert 0 < blocked.patch_moves <= free.patch_moves
    assert blocked.held_out.imbalance_TL.mean() >= free.held_out.imbalance_TL.mean() - 1e-9



def test_patches_adopt_a_refit_a_layer_at_a_time_the_layers_it_gains_most_on_first():
    from placement.replay import _Adoption

    rng = np.random.default_rng(2)
    rate_LE = np.array([[60.0, 60, 60, 60, 120, 120, 120, 120], [120.0, 60, 60, 120, 60, 120, 60, 120]])
    window_TLE = rng.poisson(rate_LE, size=(12, 2, 8))
    fitted = _placement(np.stack([SLOTS[0], SLOTS[0]]))
    refit = fit_placement("deepseek", window_TLE, CLUSTER)
    adoption = _Adoption()
    assert adoption.begin(fitted, window_TLE) is fitted and adoption.order == []  # the first fit serves whole
    assert adoption.begin(refit, window_TLE) is fitted  # a later one starts from the placement followed
    gains = [score_placement(fitted, window_TLE, "dynamic").imbalance_TL.mean(axis=0)[layer]
             / score_placement(refit, window_TLE, "dynamic").imbalance_TL.mean(axis=0)[layer] - 1 for layer in (0, 1)]
    assert adoption.order == sorted((layer for layer in (0, 1) if gains[layer] > 0), key=lambda l: -gains[l])
    order = list(adoption.order)
    once = adoption.adopt(fitted, 1)
    assert np.array_equal(once.phy2log_LP[order[0]], refit.phy2log_LP[order[0]])
    for layer in {0, 1} - {order[0]}:
        np.testing.assert_array_equal(once.phy2log_LP[layer], fitted.phy2log_LP[layer])
    done = adoption.adopt(adoption.adopt(once, 1), 1)
    assert adoption.order == [] and adoption.adopt(done, 1) is done


def test_the_replay_with_refits_adopted_by_the_patches_runs_and_refuses_what_it_does_not_model():
    counts = _bursty_counts()
    args = dict(every=20, window=20, routing="live", lag=10)
    adopted = rolling_replay(counts, CLUSTER, "deepseek", patches=PatchConfig(lag=2, window=3, every=2,
                                                                              adopt_layers=1), **args)
    plain = rolling_replay(counts, CLUSTER, "deepseek", **args)
    assert adopted.patch_moves > 0
    assert adopted.held_out.imbalance_TL[4:10].mean() < plain.held_out.imbalance_TL[4:10].mean() - 0.1
    with pytest.raises(ValueError, match="drift_ratio"):
        rolling_replay(counts, CLUSTER, "deepseek", patches=PatchConfig(adopt_layers=1), drift_ratio=1.4, **args)
    for bad in ({"adopt_layers": 0}, {"adopt_layers": 1, "refit_blocks": True}, {"adopt_layers": 1,
                                                                                 "sequential": True}):
        with pytest.raises(ValueError, match="adopt_layers"):
            PatchConfig(**bad)

def _per_trial_patch(phy2log_P: np.ndarray, load_E: np.ndarray, placement: Placement, max_moves: int) -> np.ndarray:
    """One layer's patch with each trial scored on its own (a replica graph and a live-router split per trial): the
    moves as chosen before a move's trials were scored together. Of trials within TIE of the best (equal but for
    rounding), the first in the order tried wins."""
    def imbalance_of(slots: np.ndarray) -> float:
        graph = ReplicaGraph.build(slots, placement.gpu_of_slot_P, len(load_E), placement.cluster.num_gpus)
        loads_1G, _ = optimal_split_loads(load_E[None], graph, -np.inf, ROUTER_ROUNDS, MOMENTUM)
        return float(loads_1G.max() / max(loads_1G.mean(), 1e-12))

    current, gpu_of_slot = phy2log_P.copy(), placement.gpu_of_slot_P
    imbalance = imbalance_of(current)
    for _ in range(max_moves):
        if imbalance <= THRESHOLD:
            break
        replicas_E = np.bincount(current, minlength=len(load_E))
        per_replica_E = load_E / replicas_E
        trials, values = [], []
        for expert in np.argsort(-per_replica_E, kind="stable")[:CANDIDATES]:
            holding = np.isin(gpu_of_slot, gpu_of_slot[current == expert])
            donors = np.flatnonzero((replicas_E[current] >= 2) & (current != expert) & ~holding)
            for slot in donors[np.argsort(per_replica_E[current[donors]], kind="stable")[:DONORS]]:
                trials.append(current.copy())
                trials[-1][slot] = expert
                values.append(imbalance_of(trials[-1]))
        if not values or min(values) >= imbalance - MIN_GAIN:
            break
        best = next(index for index, value in enumerate(values) if value <= min(values) + TIE)
        current, imbalance = trials[best], values[best]
    return current


@pytest.mark.parametrize("seed", [0, 7, 8])  # 7, 8: best trials equal but for rounding, the first must win
def test_batched_trials_choose_the_moves_one_split_per_trial_chooses(seed):
    rng = np.random.default_rng(seed)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4, gpus_per_node=8)
    num_layers, num_experts = 6, 20
    phy2log_LP = np.stack([rng.permutation(np.concatenate([np.arange(num_experts),
                                                          rng.integers(0, num_experts, 32 - num_experts)]))
                           for _ in range(num_layers)])
    placement = Placement.equal_split(phy2log_LP, cluster, num_experts)
    recent_LE = rng.lognormal(4.0, 0.7, (num_layers, num_experts))
    recent_LE[np.arange(num_layers), rng.integers(0, num_experts, num_layers)] *= 6  # one burst per layer
    recent_LE[:2] = np.round(recent_LE[:2] / 50) * 50  # coarse loads: trials that tie
    patched, moved = patch_for_bursts(placement, recent_LE, max_moves=3)
    expected = np.stack([_per_trial_patch(phy2log_LP[layer], recent_LE[layer], placement, 3)
                         for layer in range(num_layers)])
    np.testing.assert_array_equal(patched.phy2log_LP, expected)
    assert moved == int((expected != phy2log_LP).sum()) > 0
