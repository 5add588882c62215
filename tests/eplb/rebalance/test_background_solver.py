"""The rebalancer's background solve, in a helper process and in a thread: an answer relabelled to move the
fewest experts with its fitted imbalance (the drift trigger's level) and its weight moves planned, a loaded
placement planned the same way, a policy's error reported as text, an abandoned job's answer ignored, a policy a
process cannot take refused up front, a helper that says when its start-up is done, a helper paced to a share of
the time answering all the same, fits kept (gaining under min_gain) or not even run (no placement could), burst
patches (moved to, undone when the burst has passed, kept when nothing bursts), and a helper and its pacer that
end, in the middle of a job, with a parent killed outright."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eplb.rebalance.background_solver import BackgroundSolver
from eplb.harness.rebalancing_loop import failing_policy
from eplb.rebalance.move_plan import TransferShape, decode_fills, decode_rounds, plan_rebalance
from placement import ClusterSpec, Placement, fit_placement, plan_migration
from placement.bounds import imbalance_lower_bound
from placement.policies.chain_layout import chain_layout
from placement.policies.deepseek import replicate_greedy
from placement.scoring import score_placement
from placement.patch_planner import Followed, PatchJob


SHAPE = TransferShape(hidden_size=8, intermediate_size=16, element_size=4, max_bytes_per_round=256,
                      failures_tolerated=1)


def wait_for(solver: BackgroundSolver, timeout_s: float = 120.0) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        job = solver.poll()
        if "result" in job or "error" in job:
            return job
        time.sleep(0.05)
    raise AssertionError("the background solve did not answer in time")


@pytest.fixture(scope="module")
def window():
    counts = np.random.default_rng(0).poisson(np.linspace(60, 2, 16), size=(10, 2, 16))
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4)
    return counts, fit_placement("deepseek", counts[:, :, ::-1], cluster)  # fitted on the mirrored loads


@pytest.mark.parametrize("where", ["process", "thread"])
def test_the_answer_is_the_policys_placement_relabelled_to_move_the_fewest_experts(where, window):
    counts, current = window
    solver = BackgroundSolver(where, "deepseek", {}, SHAPE)
    try:
        solver.submit(counts, current)
        first = wait_for(solver)
        answer = first["result"]
        placement, (moves, oblivious) = answer.placement, answer.moves
        expected = plan_migration(current, fit_placement("deepseek", counts, current.cluster))
        assert np.array_equal(placement.phy2log_LP, expected.realised.phy2log_LP)
        assert moves == expected.num_moves <= oblivious
        # The drift trigger's level: the placement's imbalance on the window under the optimal split, which the
        # live router that serves comes within a token of.
        assert answer.fitted_imbalance == pytest.approx(
            score_placement(placement, counts[-32:], "dynamic").imbalance_TL.mean())
        live = score_placement(placement, counts[-32:], "live").imbalance_TL.mean()
        assert answer.fitted_imbalance - 1e-9 <= live <= 1.01 * answer.fitted_imbalance  # whole tokens of ~60
        fills, rounds = plan_rebalance(current, placement, SHAPE)
        assert decode_fills(answer.fills_U8) == fills and decode_rounds(answer.chunks_C6) == rounds
        solver.submit(counts, current)  # a new job replaces the old one's state: never the old job's answer
        assert solver.poll()["job"] == first["job"] + 1  # (a thread may have answered the tiny solve already)
        assert "result" in wait_for(solver) and solver.poll()["job"] == first["job"] + 1
    finally:
        solver.close()


@pytest.mark.parametrize("where", ["process", "thread"])
def test_a_policy_that_raises_is_reported_as_text(where, window):
    counts, current = window
    solver = BackgroundSolver(where, "deepseek", {}, SHAPE, policy_fn=failing_policy)
    try:
        solver.submit(counts, current)
        assert wait_for(solver)["error"] == "RuntimeError: injected solver failure"
    finally:
        solver.close()


def test_a_thread_is_ready_at_once():
    solver = BackgroundSolver("thread", "deepseek", {}, SHAPE)
    assert solver.wait_ready(0)
    solver.close()


def test_a_policy_a_process_cannot_take_is_refused():
    with pytest.raises(ValueError, match="picklable"):
        BackgroundSolver("process", "deepseek", {}, SHAPE, policy_fn=lambda counts, cluster: None)
    with pytest.raises(ValueError, match="cannot be paused"):
        BackgroundSolver("thread", "deepseek", {}, SHAPE, cpu_share=0.5)


def test_a_loaded_placement_is_relabelled_and_planned_without_a_fit(window):
    counts, current = window
    given = fit_placement("deepseek", counts, current.cluster)
    solver = BackgroundSolver("thread", "deepseek", {}, SHAPE)
    solver.submit(None, current, given)
    answer = wait_for(solver)["result"]
    assert np.array_equal(answer.placement.phy2log_LP, plan_migration(current, given).realised.phy2log_LP)
    assert answer.fitted_imbalance is None and len(answer.fills_U8) >= answer.moves[0]


def test_a_paced_helper_says_when_it_is_ready_then_answers_and_is_left_running(window):
    counts, current = window
    solver = BackgroundSolver("process", "cpsat", {"time_limit_s": 0.5}, SHAPE, cpu_share=0.3)
    try:
        assert solver.wait_ready(120) and solver.wait_ready(0)  # imports done, pacer started; asked again: at once
        for _ in range(2):  # the pacer of each job stops with it, leaving the helper able to take the next
            solver.submit(counts, current)
            assert "result" in wait_for(solver)
    finally:
        solver.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the helper's memory map (Linux)")
def test_the_helper_process_solves_without_torch_and_is_reaped_on_close(window):
    counts, current = window
    import torch  # noqa: F401  (the parent has torch loaded, as a decode worker does)

    solver = BackgroundSolver("process", "cpsat", {"time_limit_s": 0.5, "good_enough": 1.001}, SHAPE)
    process = solver._process
    try:
        solver.submit(counts, current)
        assert "result" in wait_for(solver)
        with open(f"/proc/{process.pid}/maps") as maps:
            assert "libtorch" not in maps.read()
    finally:
        solver.close()
    assert process.poll() is not None and solver._process is None


def test_a_fit_that_gains_less_than_min_gain_is_kept_with_nothing_to_move(window):
    counts, current = window
    for min_gain, kept in ((0.01, False), (100.0, True)):  # the current placement fits mirrored loads: a fit gains
        solver = BackgroundSolver("thread", "deepseek", {}, SHAPE, min_gain=min_gain)
        solver.submit(counts, current)
        answer = wait_for(solver)["result"]
        serving = score_placement(current, counts[-32:], "dynamic").imbalance_TL.mean()
        assert answer.kept == kept and 0.01 < answer.gain < 100
        if kept:
            assert answer.placement is current or np.array_equal(answer.placement.phy2log_LP, current.phy2log_LP)
            assert answer.moves == (0, 0) and len(answer.fills_U8) == 0 and len(answer.chunks_C6) == 0
            assert answer.fitted_imbalance == pytest.approx(serving)
        else:
            assert answer.fitted_imbalance == pytest.approx(serving / (1 + answer.gain))
            assert len(answer.fills_U8) >= answer.moves[0] > 0


def test_a_fit_no_placement_could_make_worth_moving_to_is_not_even_run(window):
    counts, current = window
    scored = counts[-32:]
    serving = score_placement(current, scored, "dynamic").imbalance_TL.mean()
    room = serving / imbalance_lower_bound(scored.reshape(-1, scored.shape[-1]), 20, 4).mean() - 1
    assert room > 0.01
    for min_gain in (1.01 * room, 0.99 * room):  # the policy raises: the fit runs only if it could gain min_gain
        solver = BackgroundSolver("thread", "deepseek", {}, SHAPE, policy_fn=failing_policy, min_gain=min_gain)
        solver.submit(counts, current)
        job = wait_for(solver)
        if min_gain > room:
            answer = job["result"]
            assert answer.kept and answer.fit_skipped and answer.gain == pytest.approx(room)
            assert answer.moves == (0, 0) and len(answer.fills_U8) == 0
            assert answer.fitted_imbalance == pytest.approx(serving)
        else:
            assert "injected solver failure" in job["error"]


# A parent that starts a paced helper (from its main thread, or from another thread that lives on) and gives it a
# job that would run for a minute (a policy that sleeps, imported by the helper from PYTHONPATH), says so, and waits
# to be killed.
SLOW_POLICY = """
import time

def slow_policy(counts_TLE, cluster):
    time.sleep(60)
"""
PARENT = """
import sys, threading, time
import numpy as np
from eplb.rebalance.background_solver import BackgroundSolver
from eplb.rebalance.move_plan import TransferShape
from placement import ClusterSpec, fit_placement
from slow_policy import slow_policy

def start():
    counts = np.ones((4, 1, 8), dtype=np.int64)
    current = fit_placement("deepseek", counts, ClusterSpec(num_gpus=2, slots_per_gpu=5, gpus_per_node=2))
    shape = TransferShape(hidden_size=8, intermediate_size=16, element_size=4, max_bytes_per_round=256,
                          failures_tolerated=1)
    solver = BackgroundSolver("process", "deepseek", dict(), shape, policy_fn=slow_policy, cpu_share=0.5)
    assert solver.wait_ready(120)
    solver.submit(counts, current)
    print("solving", flush=True)
    time.sleep(600)

if {from_main_thread}:
    start()
else:
    threading.Thread(target=start).start()
"""


@pytest.mark.parametrize("from_main_thread", [True, False], ids=["started-from-main-thread", "started-from-a-thread"])
def test_the_helper_and_its_pacer_end_in_the_middle_of_a_job_with_a_parent_killed_outright(tmp_path, new_session,
                                                                                           from_main_thread):
    (tmp_path / "slow_policy.py").write_text(SLOW_POLICY)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, str(tmp_path)])}
    session = new_session([sys.executable, "-c", PARENT.format(from_main_thread=from_main_thread)], env=env,
                          stdout=subprocess.PIPE, text=True)
    assert session.process.stdout.readline() == "solving\n"
    members = session.wait_for(lambda found: len(found) == 3, timeout_s=30)  # parent, helper, pacer
    assert sum("-m eplb.rebalance.background_solver" in command for command in members.values()) == 1
    assert sum("cpu_pacer.py" in command for command in members.values()) == 1
    session.process.send_signal(signal.SIGKILL)
    session.process.wait()
    assert session.survivors_after(5.0) == {}


def patch_job(recent_LE, start, max_moves, threshold, drift_LE=None, max_swaps=0, ring_order_LG=None) -> PatchJob:
    """A patch job from `start` (drift swaps in every layer when `drift_LE` is given)."""
    return PatchJob(Followed.of(start, ring_order_LG), np.asarray(recent_LE, dtype=float),
                    None if drift_LE is None else np.asarray(drift_LE, dtype=float), np.arange(start.num_layers),
                    max_moves, threshold, max_swaps)


def experts_per_gpu(placement) -> list:
    """Each layer's GPUs as sorted expert lists, in GPU order: the placement up to its slot order within a GPU."""
    cluster = placement.cluster
    return [sorted(map(sorted, layer.reshape(cluster.num_gpus, cluster.slots_per_gpu).tolist()))
            for layer in placement.phy2log_LP]


@pytest.mark.parametrize("where", ["process", "thread"])
def test_a_burst_patch_moves_a_few_slots_to_the_burst_and_back_to_the_fit_when_it_has_passed(where, window):
    counts, _ = window
    fitted = fit_placement("deepseek", counts, ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4))
    calm_LE = counts.mean(0)
    replicas_LE = np.stack([np.bincount(row, minlength=16) for row in fitted.phy2log_LP])
    hot_L = np.where(replicas_LE == 1, calm_LE, -1).argmax(1)  # each layer's busiest single-replica expert
    burst_LE = calm_LE.copy()
    burst_LE[[0, 1], hot_L] *= 8
    calm, burst = (score_placement(fitted, load[None], "dynamic").imbalance_TL.mean() for load in (calm_LE, burst_LE))
    assert burst > calm + 0.1
    threshold = (calm + burst) / 2  # the burst is patched, the calm load is not
    solver = BackgroundSolver(where, "deepseek", {}, SHAPE)
    try:
        solver.submit(None, fitted, patch=patch_job(burst_LE, fitted, 2, threshold))
        patched = wait_for(solver)["result"]
        assert not patched.kept and patched.fitted_imbalance is None
        assert 0 < patched.moves[0] <= 2 * 2 and len(patched.fills_U8) >= patched.moves[0]
        for layer, hot in enumerate(hot_L):  # the bursting expert lives on more GPUs than before
            gpus_before = {slot // 5 for slot in np.flatnonzero(fitted.phy2log_LP[layer] == hot)}
            gpus_after = {slot // 5 for slot in np.flatnonzero(patched.placement.phy2log_LP[layer] == hot)}
            assert len(gpus_after) > len(gpus_before)
        assert score_placement(patched.placement, burst_LE[None], "dynamic").imbalance_TL.mean() < burst - 0.05
        solver.submit(None, patched.placement, patch=patch_job(calm_LE, fitted, 2, threshold))
        undone = wait_for(solver)["result"]  # the burst has passed: back to the fit, moving as few slots as it took
        assert not undone.kept and experts_per_gpu(undone.placement) == experts_per_gpu(fitted)
        assert undone.moves[0] == patched.moves[0]
        solver.submit(None, fitted, patch=patch_job(calm_LE, fitted, 2, threshold))
        calm_answer = wait_for(solver)["result"]
        assert calm_answer.kept and calm_answer.moves == (0, 0) and len(calm_answer.fills_U8) == 0
    finally:
        solver.close()


@pytest.mark.parametrize("where", ["process", "thread"])
def test_a_patch_job_with_drift_swaps_follows_the_new_mix_and_hands_back_the_followed_fit(where):
    """A `cpsat` chain layout fitted to one mix, the mix moved on: the patch job swaps replica sets toward it (the
    answer serves the new mix better and names the followed fit, the next patches' start), keeps the ring layout's
    replica sets, and without drift_LE makes no swap."""
    rng = np.random.default_rng(3)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=3, gpus_per_node=8)
    old_LE, new_LE = rng.gamma(2.0, 100.0, (2, 1, 20))
    fitted = fit_placement("cpsat", rng.poisson(old_LE, (16, 1, 20)), cluster, routing="dynamic", time_limit_s=0.5)
    steps_TLE = rng.poisson(new_LE, (32, 1, 20))
    solver = BackgroundSolver(where, "cpsat", {}, SHAPE)
    try:
        solver.submit(None, fitted, patch=patch_job(new_LE, fitted, 2, 10.0, new_LE, 4))  # no burst moves
        answer = wait_for(solver)["result"]
        assert not answer.kept and answer.followed is not None
        assert answer.swap_seconds_per_layer > 0  # what the next patches' stride is set from
        followed = answer.followed.placement
        assert experts_per_gpu(answer.placement) == experts_per_gpu(followed)  # the swaps are the patch
        moved = (followed.phy2log_LP != fitted.phy2log_LP)
        assert 0 < len(np.unique(fitted.phy2log_LP[moved])) <= 2 * 4
        assert (sorted(np.bincount(followed.phy2log_LP[0], minlength=20))
                == sorted(np.bincount(fitted.phy2log_LP[0], minlength=20)))
        assert (score_placement(answer.placement, steps_TLE, "live").imbalance_TL.mean()
                < score_placement(fitted, steps_TLE, "live").imbalance_TL.mean())
        solver.submit(None, fitted, patch=patch_job(new_LE, fitted, 2, 10.0))
        no_swaps = wait_for(solver)["result"]
        assert no_swaps.kept and no_swaps.swap_seconds_per_layer is None
    finally:
        solver.close()


def test_a_refit_is_followed_as_relabelled_its_rings_in_its_gpu_map_s_order(window):
    counts, current = window
    solver = BackgroundSolver("thread", "deepseek", {}, SHAPE)
    try:
        solver.submit(counts, current)
        answer = wait_for(solver)["result"]
    finally:
        solver.close()
    plan = plan_migration(current, fit_placement("deepseek", counts, current.cluster))
    assert np.array_equal(answer.followed.placement.phy2log_LP, answer.placement.phy2log_LP)  # the serving labels
    order_LG = answer.followed.ring_order_LG
    assert (order_LG == plan.gpu_map_G).all() and order_LG.shape == (2, 4)


def test_a_patch_checks_each_layer_s_bursts_in_its_ring_order():
    """A chain layout relabelled by a GPU map (as a refit's is) whose exact split serves the recent load within the
    threshold: a patch handed its ring order keeps it; judged in label order, the water-filling overstates it and
    a burst move would break the ring."""
    gpus, slots, experts = 128, 3, 256
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
    load_E = np.random.default_rng(2).gamma(2.0, 100.0, experts)
    _, _, replicas_E = replicate_greedy(load_E[None], gpus * slots)
    in_ring_GS = chain_layout(load_E, replicas_E[0], gpus, slots, "random", 2).reshape(gpus, slots)
    order_G = np.random.default_rng(3).permutation(gpus)
    relabelled_GS = np.empty_like(in_ring_GS)
    relabelled_GS[order_G] = in_ring_GS
    fitted = Placement.equal_split(relabelled_GS.reshape(1, -1), cluster, experts)
    load_E[28] *= 1.2
    solver = BackgroundSolver("thread", "cpsat", {}, SHAPE)
    try:
        for ring_order_LG, kept in ((order_G[None], True), (None, False)):
            solver.submit(None, fitted, patch=patch_job(load_E[None], fitted, 2, 1.005, ring_order_LG=ring_order_LG))
            assert wait_for(solver)["result"].kept is kept
    finally:
        solver.close()
