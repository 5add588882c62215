"""The patch planner the live rebalancer and the replay share: its turns, what it follows, its stride; the live
solver's patch is the planner's; the replay's patches at a pace (lag, burst layers first, refits in flight)."""

import numpy as np
import pytest

from eplb.rebalance.background_solver import solve
from eplb.rebalance.move_plan import TransferShape
from placement import ClusterSpec, Placement, rolling_replay
from placement.patch_planner import Followed, PatchPace, PatchPlanner, PatchSettings, plan_patch
from placement.replay import _served_placements

CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=3, gpus_per_node=4)
# 4 GPUs x 3 slots, 8 experts: 0-3 once each (one per GPU), 4-7 twice, on neighbouring GPUs (a ring layout).
SLOTS = np.array([[0, 4, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7]])


def _placement(phy2log_LP=SLOTS) -> Placement:
    return Placement.equal_split(np.asarray(phy2log_LP), CLUSTER, 8)


def _bursty_counts(seed: int = 0) -> np.ndarray:
    """[60, 1, 8] Poisson counts of a calm layer whose expert 0 turns 8 times as hot from step 30 on."""
    rng = np.random.default_rng(seed)
    rate_TE = np.tile(np.array([60.0, 60, 60, 60, 120, 120, 120, 120]), (60, 1))
    rate_TE[30:, 0] *= 8
    return rng.poisson(rate_TE)[:, None, :]


def test_the_layers_take_turns_at_drift_swaps_and_a_refit_starts_the_turns_again():
    placement = _placement(np.repeat(SLOTS, 4, axis=0))
    planner = PatchPlanner(PatchSettings(drift_stride=2), placement)
    load_LE = np.ones((4, 8))
    turns = [planner.job(load_LE, load_LE).drift_layers.tolist() for _ in range(3)]
    assert turns == [[0, 2], [1, 3], [0, 2]]
    assert planner.job(load_LE, None).max_swaps == 0  # no drift load: no drift swaps
    planner.refit(Followed.of(placement))
    assert planner.turn == 0 and planner.job(load_LE, load_LE).drift_layers.tolist() == [0, 2]


def test_the_swaps_cost_widens_the_stride_to_the_budget_never_below_the_least():
    placement = _placement(np.repeat(SLOTS, 61, axis=0))
    planner = PatchPlanner(PatchSettings(swap_budget_s=0.25), placement)
    planner.measured(0.016)  # 61 layers x 16 ms = 0.98 s: every 4th layer keeps a patch's swaps within 0.25 s
    assert planner.stride == 4
    planner.measured(0.0015)
    assert planner.stride == 1
    planner.measured(10.0)
    assert planner.stride == 61  # at most one layer a patch
    planner.measured(None)  # a patch without swaps says nothing of their cost
    assert planner.stride == 61
    least = PatchPlanner(PatchSettings(swap_budget_s=0.25, drift_stride=3), placement)
    least.measured(0.0015)
    assert least.stride == 3
    fixed = PatchPlanner(PatchSettings(swap_budget_s=None, drift_stride=2), placement)
    fixed.measured(0.016)
    assert fixed.stride == 2


def test_a_landed_patch_is_followed_whole_or_in_the_layers_that_switched():
    placement = _placement(np.repeat(SLOTS, 2, axis=0))
    planner = PatchPlanner(PatchSettings(), placement)
    other = _placement(np.repeat(np.array([[4, 0, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7]]), 2, axis=0))
    order_LG = np.array([[1, 0, 2, 3], [3, 2, 1, 0]])
    planner.landed(Followed.of(other, order_LG), [1])
    np.testing.assert_array_equal(planner.followed.placement.phy2log_LP, [SLOTS[0], other.phy2log_LP[1]])
    np.testing.assert_array_equal(planner.followed.ring_order_LG, [[0, 1, 2, 3], [3, 2, 1, 0]])
    planner.landed(Followed.of(other, order_LG))
    np.testing.assert_array_equal(planner.followed.placement.phy2log_LP, other.phy2log_LP)


def test_the_live_solver_s_patch_is_the_planner_s():
    """Rank 0's helper computes a patch job with `plan_patch`, as the replay does: the same experts on every GPU and
    the same placement followed."""
    counts = _bursty_counts()
    fitted = _placement()
    planner = PatchPlanner(PatchSettings(window=3), fitted)
    job = planner.job(counts[32:35].mean(axis=0), counts[5:35].mean(axis=0))
    plan = plan_patch(job)
    shape = TransferShape(hidden_size=8, intermediate_size=8, element_size=4, max_bytes_per_round=1 << 20,
                          failures_tolerated=1)
    answer = solve(None, fitted, "deepseek", {}, None, shape, patch=job)
    assert not answer.kept
    gpus = (4, 3)
    np.testing.assert_array_equal(np.sort(answer.placement.phy2log_LP.reshape(1, *gpus), axis=2),
                                  np.sort(plan.target.phy2log_LP.reshape(1, *gpus), axis=2))
    np.testing.assert_array_equal(answer.followed.placement.phy2log_LP, plan.followed.placement.phy2log_LP)
    assert answer.first_layers.tolist() == [0]  # the burst layer is planned first


def test_pace_problems_name_the_parameter():
    assert PatchPace(lag=6, burst_lag=5).problems(every=2) == []
    assert [name for name, _ in PatchPace(lag=-1).problems(every=2)] == ["lag"]
    [(name, text)] = PatchPace(lag=6, burst_lag=4).problems(every=2)
    assert name == "burst_lag" and "(lag - every, lag] = (4, 6]" in text
    with pytest.raises(ValueError, match="pace.burst_lag must lie in"):
        rolling_replay(_bursty_counts(), CLUSTER, "deepseek", every=20, window=20, patches=PatchSettings(every=2),
                       pace=PatchPace(lag=6, burst_lag=3))
    with pytest.raises(ValueError, match="every"):
        PatchSettings(every=0)


def test_the_replay_with_patches_serves_the_burst_better_and_counts_the_slots_it_moved():
    counts = _bursty_counts()
    args = dict(every=20, window=20, routing="live", lag=10, also_routings=("dynamic",))
    plain = rolling_replay(counts, CLUSTER, "deepseek", **args)
    patched = rolling_replay(counts, CLUSTER, "deepseek", patches=PatchSettings(window=3, every=2),
                             pace=PatchPace(lag=2), **args)
    # Steps [30, 40) serve the placement fitted on [0, 20): only a patch gives expert 0 its replica in time.
    burst = slice(4, 10)  # trace steps 34-39 (held-out step 0 is trace step 30); a patch sees the burst by step 34
    assert patched.held_out.imbalance_TL[burst].mean() < plain.held_out.imbalance_TL[burst].mean() - 0.1
    assert patched.patch_moves > 0 and plain.patch_moves is None
    assert patched.summary()["patch_moves"] == patched.patch_moves and "patch_moves" not in plain.summary()
    assert patched.held_out_also["dynamic"].imbalance_TL.shape == patched.held_out.imbalance_TL.shape
    # A patch that would serve only after the trace's end never lands: the replay is the plain one.
    never = rolling_replay(counts, CLUSTER, "deepseek", patches=PatchSettings(), pace=PatchPace(lag=1000), **args)
    np.testing.assert_array_equal(never.held_out.imbalance_TL, plain.held_out.imbalance_TL)
    assert never.patch_moves == 0


def test_a_patch_s_burst_layers_serve_from_its_burst_lag_and_the_rest_from_its_lag():
    """Layer 0 bursts (expert 0 8x from step 30), layer 1 stays calm: with burst_lag, layer 0's patch serves
    `lag - burst_lag` steps sooner than without, layer 1 exactly as without."""
    counts = np.concatenate([_bursty_counts(), np.full((60, 1, 8), 90)], axis=1)
    fitted = _placement(np.repeat(SLOTS, 2, axis=0))
    settings = PatchSettings(window=3, every=2, drift_swaps=0)
    served = {}
    for name, pace in (("late", PatchPace(lag=6)), ("early", PatchPace(lag=6, burst_lag=5))):
        served[name] = [placement.phy2log_LP for first, stop, placement
                        in _served_placements(fitted, counts, 20, 60, settings, pace) for _ in range(first, stop)]
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
    fitted = _placement()
    settings = PatchSettings(window=3, every=2, drift_swaps=0)
    blocking, free_pace = PatchPace(lag=2, refit_blocks=True), PatchPace(lag=2)
    # The fit serving [20, 60) is followed by one at step 40 that lands at 60: patch jobs start only in [20, 40).
    chunks = _served_placements(fitted, counts, 20, 60, settings, blocking, next_fit=40)
    free = _served_placements(fitted, counts, 20, 60, settings, free_pace, 40)
    switches = [first for first, _, _ in chunks[1:]]
    assert switches and 20 + blocking.lag <= switches[0] and switches[-1] < 40 + blocking.lag, switches
    assert chunks[-1][1] == 60, "the last patch serves until the refit lands"
    assert chunks[0][2] is fitted and chunks[0][1] >= 22, "no patch before one started after the landing"
    assert any(first >= 40 + blocking.lag for first, _, _ in free[1:]), "unblocked, patches go on after step 40"
    # Without a next fit (the last fit of a replay) nothing is blocked.
    last = _served_placements(fitted, counts, 20, 60, settings, blocking)
    assert [(a, b) for a, b, _ in last] == [(a, b) for a, b, _ in free]
    for (_, _, mine), (_, _, theirs) in zip(last, free):
        np.testing.assert_array_equal(mine.phy2log_LP, theirs.phy2log_LP)


def test_the_replay_with_refits_blocking_patches_patches_only_between_refits():
    counts = _bursty_counts()
    args = dict(every=20, window=20, routing="live", lag=10)
    settings = PatchSettings(window=3, every=2)
    free = rolling_replay(counts, CLUSTER, "deepseek", patches=settings, pace=PatchPace(lag=2), **args)
    blocked = rolling_replay(counts, CLUSTER, "deepseek", patches=settings,
                             pace=PatchPace(lag=2, refit_blocks=True), **args)
    plain = rolling_replay(counts, CLUSTER, "deepseek", **args)
    # Fits at 20 and 40 land at 30 and 50: patches start only in [30, 40) and [50, 60); the burst from step 30
    # is still patched (from step 34), so blocked patches serve it better than none and no better than unblocked.
    burst = slice(4, 10)
    assert blocked.held_out.imbalance_TL[burst].mean() < plain.held_out.imbalance_TL[burst].mean() - 0.1
    assert 0 < blocked.patch_moves <= free.patch_moves
    assert blocked.held_out.imbalance_TL.mean() >= free.held_out.imbalance_TL.mean() - 1e-9
