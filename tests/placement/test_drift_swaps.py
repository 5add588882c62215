"""Drift swaps: arcs and their loads as a brute force finds them, a swap's score as the swapped layout's, swaps that
keep the ring layout and its replica sets and lower what the live router serves on a drifted mix, layers that are
not ring layouts left alone, and the replay that keeps the swaps between patches."""

import numpy as np
import pytest

from placement import ClusterSpec, Placement, rolling_replay
from placement.patch_planner import PatchPace, PatchSettings
from placement.drift_swaps import MIN_GAIN, _Ring, drift_swaps, layers_in_turn, ring_imbalance, ring_spans, swap_layer
from placement.policies.chain_layout import chain_layout
from placement.policies.deepseek import replicate_greedy
from placement.scoring import score_placement

GPUS, SLOTS_PER_GPU, EXPERTS = 16, 3, 40
CLUSTER = ClusterSpec(num_gpus=GPUS, slots_per_gpu=SLOTS_PER_GPU, gpus_per_node=8)


def _chain(load_E: np.ndarray, seed: int = 0) -> np.ndarray:
    """A `cpsat`-style chain layout of one layer fitted to `load_E`."""
    _, _, replicas_E = replicate_greedy(load_E[None], GPUS * SLOTS_PER_GPU)
    return chain_layout(load_E, replicas_E[0], GPUS, SLOTS_PER_GPU, "random", seed)


def _loads(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).gamma(2.0, 100.0, EXPERTS)


def _brute_arc_loads(phy2log_P: np.ndarray, load_E: np.ndarray) -> np.ndarray:
    """[G, G] load of the experts whose every GPU lies in the arc starting at s of length l + 1."""
    gpus_of = [set((np.flatnonzero(phy2log_P == e) // SLOTS_PER_GPU).tolist()) for e in range(EXPERTS)]
    loads = np.zeros((GPUS, GPUS))
    for start in range(GPUS):
        for length in range(1, GPUS + 1):
            arc = {(start + k) % GPUS for k in range(length)}
            loads[start, length - 1] = sum(load_E[e] for e in range(EXPERTS) if gpus_of[e] <= arc)
    return loads


def _objective(phy2log_P: np.ndarray, load_E: np.ndarray) -> float:
    start_E, length_E = ring_spans(phy2log_P, EXPERTS, GPUS, SLOTS_PER_GPU)
    ring = _Ring(start_E, length_E, load_E, GPUS)
    return float(ring._relative(ring.loads_GO, ring.lengths_1[None]).max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arc_loads_are_what_a_brute_force_over_every_arc_finds(seed):
    load_E = _loads(seed)
    phy2log_P = _chain(load_E, seed)
    start_E, length_E = ring_spans(phy2log_P, EXPERTS, GPUS, SLOTS_PER_GPU)
    np.testing.assert_allclose(_Ring(start_E, length_E, load_E, GPUS).loads_GO, _brute_arc_loads(phy2log_P, load_E))


def test_a_layout_with_an_expert_on_gpus_that_are_not_neighbours_is_not_a_ring_layout():
    phy2log_P = _chain(_loads(0))
    assert ring_spans(phy2log_P, EXPERTS, GPUS, SLOTS_PER_GPU) is not None
    # A slot of an expert with replicas to spare, two or more GPUs away from a single-replica expert's GPU, takes
    # that expert: its two GPUs are not consecutive.
    broken = phy2log_P.copy()
    lone = next(e for e in range(EXPERTS) if (broken == e).sum() == 1)
    home = np.flatnonzero(broken == lone)[0] // SLOTS_PER_GPU
    away = (home + GPUS // 2) % GPUS
    slot = next(p for p in range(away * SLOTS_PER_GPU, (away + 1) * SLOTS_PER_GPU) if (broken == broken[p]).sum() >= 2)
    broken[slot] = lone
    assert ring_spans(broken, EXPERTS, GPUS, SLOTS_PER_GPU) is None
    load_E = _loads(1)
    np.testing.assert_array_equal(swap_layer(broken, load_E, GPUS, SLOTS_PER_GPU, 4), broken)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_swap_chosen_scores_what_the_swapped_layout_scores_and_lowers_the_objective(seed):
    stale_E, now_E = _loads(seed), _loads(seed + 100)
    phy2log_P = _chain(stale_E, seed)
    start_E, length_E = ring_spans(phy2log_P, EXPERTS, GPUS, SLOTS_PER_GPU)
    ring = _Ring(start_E, length_E, now_E, GPUS)
    pair = ring.best_swap()
    assert pair is not None
    a, b = pair
    score = ring._exact_scores(np.array([a]), np.array([b]))[0]
    swapped = phy2log_P.copy()
    swapped[phy2log_P == a], swapped[phy2log_P == b] = b, a
    assert score == pytest.approx(_objective(swapped, now_E), rel=1e-12)
    assert score < _objective(phy2log_P, now_E)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_swaps_keep_the_ring_layout_and_its_replica_sets_and_serve_the_new_mix_better(seed):
    stale_E, now_E = _loads(seed), _loads(seed + 100)
    phy2log_P = _chain(stale_E, seed)
    placement = Placement.equal_split(phy2log_P[None], CLUSTER, EXPERTS)
    placement = Placement(placement.phy2log_LP, placement.weights_LP, CLUSTER, EXPERTS, "cpsat", {})
    swapped, moved = drift_swaps(placement, now_E[None], max_swaps=4)
    after = swapped.phy2log_LP[0]
    assert moved == int((after != phy2log_P).sum()) > 0
    assert swapped.info["drift_swapped_slots"] == moved
    assert len(np.unique(phy2log_P[after != phy2log_P])) <= 2 * 4  # at most 4 swaps of two experts each
    # The same replica sets (arcs), held by other experts: the ring layout stays, and each GPU's slot count.
    spans_before = sorted(zip(*ring_spans(phy2log_P, EXPERTS, GPUS, SLOTS_PER_GPU)))
    spans_after = ring_spans(after, EXPERTS, GPUS, SLOTS_PER_GPU)
    assert spans_after is not None and sorted(zip(*spans_after)) == spans_before
    assert _objective(after, now_E) < _objective(phy2log_P, now_E)
    # What the live router serves on steps drawn from the new mix.
    rng = np.random.default_rng(seed)
    steps_TE = rng.poisson(now_E, size=(32, EXPERTS))[:, None, :]
    before_live = score_placement(placement, steps_TE, "live").imbalance_TL.mean()
    after_live = score_placement(swapped, steps_TE, "live").imbalance_TL.mean()
    assert after_live < before_live


def test_nothing_to_gain_or_no_swaps_allowed_returns_the_placement_itself():
    load_E = _loads(0)
    placement = Placement.equal_split(_chain(load_E)[None], CLUSTER, EXPERTS)
    assert drift_swaps(placement, load_E[None] * 0, max_swaps=4) == (placement, 0)  # no load: nothing to follow
    assert drift_swaps(placement, _loads(7)[None], max_swaps=0) == (placement, 0)
    once, _ = drift_swaps(placement, _loads(7)[None], max_swaps=50)
    assert drift_swaps(once, _loads(7)[None], max_swaps=50)[1] == 0  # converged: the next call finds nothing



@pytest.mark.parametrize("seed", [0, 1])
def test_a_relabelled_ring_swaps_in_its_ring_order_as_the_ring_does(seed):
    stale_E, now_E = _loads(seed), _loads(seed + 100)
    layers = [_chain(stale_E, seed), _chain(_loads(seed + 50), seed + 1)]
    ring = Placement.equal_split(np.stack(layers), CLUSTER, EXPERTS)
    rng = np.random.default_rng(seed)
    # Each layer relabelled by a map of its own: ring GPU j's slots on GPU order[j] (as `plan_migration` realises a
    # fit), so neither layer is a ring in the order 0..G-1 any more.
    order_LG = np.stack([rng.permutation(GPUS) for _ in layers])
    relabelled_LP = np.empty_like(ring.phy2log_LP)
    for layer, order in enumerate(order_LG):
        relabelled_LP[layer].reshape(GPUS, SLOTS_PER_GPU)[order] = ring.phy2log_LP[layer].reshape(GPUS, SLOTS_PER_GPU)
    relabelled = Placement.equal_split(relabelled_LP, CLUSTER, EXPERTS)
    assert all(ring_spans(slots, EXPERTS, GPUS, SLOTS_PER_GPU) is None for slots in relabelled_LP)
    recent_LE = np.stack([now_E, _loads(seed + 200)])
    assert drift_swaps(relabelled, recent_LE) == (relabelled, 0)  # not a ring in the order 0..G-1: left alone
    swapped_ring, moved_ring = drift_swaps(ring, recent_LE)
    swapped, moved = drift_swaps(relabelled, recent_LE, ring_order_LG=order_LG)
    assert moved == moved_ring > 0
    for layer, order in enumerate(order_LG):
        np.testing.assert_array_equal(swapped.phy2log_LP[layer].reshape(GPUS, SLOTS_PER_GPU)[order],
                                      swapped_ring.phy2log_LP[layer].reshape(GPUS, SLOTS_PER_GPU))
    with pytest.raises(ValueError, match="ring_order_LG"):
        drift_swaps(relabelled, recent_LE, ring_order_LG=np.zeros((2, GPUS), dtype=np.int64))

@pytest.mark.parametrize("bad", [np.zeros((2, EXPERTS)), -np.ones((1, EXPERTS)), np.full((1, EXPERTS), np.nan)])
def test_bad_loads_or_swap_counts_are_refused_by_name(bad):
    placement = Placement.equal_split(_chain(_loads(0))[None], CLUSTER, EXPERTS)
    with pytest.raises(ValueError, match="recent_LE"):
        drift_swaps(placement, bad)
    with pytest.raises(ValueError, match="max_swaps"):
        drift_swaps(placement, _loads(0)[None], max_swaps=-1)
    with pytest.raises(ValueError, match="layers"):
        drift_swaps(placement, _loads(0)[None], layers=[1])
    with pytest.raises(ValueError, match="stride"):
        layers_in_turn(4, 0, 0)


def test_only_the_layers_whose_turn_it_is_get_swaps_and_every_layer_gets_its_turn():
    phy2log_LP = np.stack([_chain(_loads(seed), seed) for seed in range(4)])
    placement = Placement.equal_split(phy2log_LP, CLUSTER, EXPERTS)
    now_LE = np.stack([_loads(seed + 100) for seed in range(4)])
    everywhere, _ = drift_swaps(placement, now_LE, max_swaps=4)
    assert all((everywhere.phy2log_LP[layer] != phy2log_LP[layer]).any() for layer in range(4))
    turns = [layers_in_turn(4, 3, turn).tolist() for turn in range(3)]
    assert turns == [[0, 3], [2], [1]]  # layer l when (l + turn) % 3 == 0: each layer once every 3 patches
    for layers in turns:
        swapped, _ = drift_swaps(placement, now_LE, max_swaps=4, layers=np.array(layers))
        for layer in range(4):
            expected = everywhere if layer in layers else placement
            np.testing.assert_array_equal(swapped.phy2log_LP[layer], expected.phy2log_LP[layer])
    assert drift_swaps(placement, now_LE, max_swaps=4, layers=np.array([], dtype=int)) == (placement, 0)


def test_the_replay_keeps_drift_swaps_between_patches_and_serves_a_drifting_mix_better():
    rng = np.random.default_rng(5)
    steps = 240
    start_E, end_E = _loads(10), _loads(11)
    mix_T = np.linspace(0.0, 1.0, steps)[:, None]
    counts_TLE = rng.poisson((1 - mix_T) * start_E + mix_T * end_E)[:, None, :]
    common = dict(every=120, window=40, routing="live", lag=40,
                  policy_options={"routing": "dynamic", "time_limit_s": 0.5})
    without = rolling_replay(counts_TLE, CLUSTER, "cpsat", patches=PatchSettings(drift_swaps=0), pace=PatchPace(lag=5),
                             **common)
    with_swaps = rolling_replay(counts_TLE, CLUSTER, "cpsat", patches=PatchSettings(), pace=PatchPace(lag=5), **common)
    assert with_swaps.held_out.imbalance_TL.mean() < without.held_out.imbalance_TL.mean()
    assert with_swaps.patch_moves > without.patch_moves
    with pytest.raises(ValueError, match="drift_swaps"):
        PatchSettings(drift_swaps=-1)


def test_a_bursting_one_gpu_expert_takes_the_longer_arc_of_a_colder_expert_beyond_the_coldest():
    # 16 GPUs x 6 slots, 90 experts: the 6 spare replicas go to the hottest experts, so the coldest 64 outside any
    # arc all live on one GPU. A one-GPU expert bursting 12x can only spread by taking a longer arc from one of the
    # replicated experts, which are hotter than those 64: they are candidates too.
    gpus, slots, experts = 16, 6, 90
    load_E = np.random.default_rng(4).gamma(2.0, 100.0, experts)
    _, _, replicas_E = replicate_greedy(load_E[None], gpus * slots)
    phy2log_P = chain_layout(load_E, replicas_E[0], gpus, slots, "random", 0)
    start_E, length_E = ring_spans(phy2log_P, experts, gpus, slots)
    one_gpu = np.flatnonzero(length_E == 1)
    burst = int(one_gpu[np.argsort(load_E[one_gpu])[len(one_gpu) // 2]])  # a one-GPU expert of middling load
    recent_E = load_E.copy()
    recent_E[burst] *= 12
    assert (np.sort(load_E[length_E >= 2]) > np.sort(load_E)[63]).all()  # every spanning expert beyond the coldest 64
    swapped = swap_layer(phy2log_P, recent_E, gpus, slots, 1)
    assert len(np.unique(np.flatnonzero(swapped == burst) // slots)) >= 2
    assert ring_imbalance(swapped, recent_E, gpus, slots) < ring_imbalance(phy2log_P, recent_E, gpus, slots) - 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ring_imbalance_is_the_exact_split_of_the_busiest_arc(exact_lp_max_load, seed):
    load_E = _loads(seed)
    phy2log_P = _chain(_loads(seed + 50), seed)
    gpu_of_slot = np.arange(len(phy2log_P)) // SLOTS_PER_GPU
    exact = exact_lp_max_load(load_E, phy2log_P, gpu_of_slot, GPUS) / (load_E.sum() / GPUS)
    assert ring_imbalance(phy2log_P, load_E, GPUS, SLOTS_PER_GPU) == pytest.approx(exact, rel=1e-9)
    assert ring_imbalance(phy2log_P, np.zeros(EXPERTS), GPUS, SLOTS_PER_GPU) == 1.0
    broken = phy2log_P.copy()
    lone = next(e for e in range(EXPERTS) if (broken == e).sum() == 1)
    away = (np.flatnonzero(broken == lone)[0] // SLOTS_PER_GPU + GPUS // 2) % GPUS
    spare = [p for p in range(away * SLOTS_PER_GPU, (away + 1) * SLOTS_PER_GPU) if (broken == broken[p]).sum() >= 2]
    broken[spare[0]] = lone
    assert ring_imbalance(broken, load_E, GPUS, SLOTS_PER_GPU) is None  # lone's two GPUs are half the ring apart


@pytest.mark.parametrize("gpus, slots, experts, seed", [(16, 3, 40, 0), (16, 3, 40, 1), (32, 3, 64, 2), (32, 5, 96, 3)])
def test_the_bounded_search_picks_the_pair_that_scoring_every_candidate_on_every_arc_picks(gpus, slots, experts, seed):
    rng = np.random.default_rng(seed)
    stale_E, now_E = rng.gamma(2.0, 100.0, experts), rng.gamma(2.0, 100.0, experts)
    _, _, replicas_E = replicate_greedy(stale_E[None], gpus * slots)
    start_E, length_E = ring_spans(chain_layout(stale_E, replicas_E[0], gpus, slots, "random", seed), experts,
                                   gpus, slots)
    ring = _Ring(start_E, length_E, now_E, gpus)
    for _ in range(4):  # along a few swaps, each from the last
        objective = float(ring.values().max())
        hot, cold = ring.candidates(ring.values())
        a_B, b_B = np.repeat(hot, len(cold)), np.tile(cold, len(hot))
        colder = now_E[a_B] > now_E[b_B]
        scores_B = ring._exact_scores(a_B[colder], b_B[colder])  # every pair, every arc
        pair = ring.best_swap()
        if scores_B.min() > objective - MIN_GAIN:
            assert pair is None
            break
        assert pair is not None
        best = int(np.argmin(scores_B))
        assert ring._exact_scores(np.array([pair[0]]), np.array([pair[1]]))[0] == pytest.approx(scores_B[best],
                                                                                                 abs=1e-12)
        ring.swap(*pair)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_pair_s_bound_is_below_its_exact_score_which_the_arcs_that_could_reach_the_bound_give(seed):
    rng = np.random.default_rng(seed)
    gpus, slots, experts = 32, 3, 64
    stale_E, now_E = rng.gamma(2.0, 100.0, experts), rng.gamma(2.0, 100.0, experts)
    _, _, replicas_E = replicate_greedy(stale_E[None], gpus * slots)
    start_E, length_E = ring_spans(chain_layout(stale_E, replicas_E[0], gpus, slots, "random", seed), experts,
                                   gpus, slots)
    ring = _Ring(start_E, length_E, now_E, gpus)
    value_GO = ring.values()
    hot, cold = ring.candidates(value_GO)
    bound_HC = ring._bounds(hot, cold, value_GO)
    a_B, b_B = np.repeat(hot, len(cold)), np.tile(cold, len(hot))
    colder = now_E[a_B] > now_E[b_B]
    a_B, b_B, bound_B = a_B[colder], b_B[colder], bound_HC.ravel()[colder]
    exact_B = ring._exact_scores(a_B, b_B)
    assert (bound_B <= exact_B + 1e-12).all()
    # With a ceiling, pairs past it skip the later terms: still below their exact scores, the same where below it.
    ceiling = float(np.median(bound_B))
    staged_B = ring._bounds(hot, cold, value_GO, ceiling).ravel()[colder]
    assert (staged_B <= bound_B + 1e-12).all() and (staged_B <= exact_B + 1e-12).all()
    np.testing.assert_array_equal(staged_B[bound_B <= ceiling], bound_B[bound_B <= ceiling])
    assert (staged_B[bound_B > ceiling] > ceiling).all()
    reach_GO = ring._reach()
    on_fewer_arcs = [ring._exact_scores(a_B[i:i + 1], b_B[i:i + 1], value_GO, reach_GO, floor=bound_B[i])[0]
                     for i in range(len(a_B))]
    np.testing.assert_allclose(on_fewer_arcs, exact_B, rtol=0, atol=1e-12)
