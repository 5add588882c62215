"""The rebalancer's background solve, in a helper process and in a thread: an answer relabelled to move the
fewest experts with its fitted imbalance (the drift trigger's level), a policy's error reported as text, an
abandoned job's answer ignored, and a policy a process cannot take refused up front."""

import time

import numpy as np
import pytest

from eplb.live.background_solver import BackgroundSolver
from eplb.live.rebalancing_loop import failing_policy
from placement import ClusterSpec, fit_placement, plan_migration
from placement.scoring import score_placement


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
    solver = BackgroundSolver(where, "deepseek", {})
    try:
        solver.submit(counts, current)
        placement, (moves, oblivious), fitted = wait_for(solver)["result"]
        expected = plan_migration(current, fit_placement("deepseek", counts, current.cluster))
        assert np.array_equal(placement.phy2log_LP, expected.realised.phy2log_LP)
        assert moves == expected.num_moves <= oblivious
        # The drift trigger's level: the placement's imbalance on the window under the live router.
        assert fitted == pytest.approx(score_placement(placement, counts[-32:], "live").imbalance_TL.mean())
        solver.submit(counts, current)  # a new job replaces the old one's state
        assert "result" not in solver.poll()
        assert "result" in wait_for(solver)
    finally:
        solver.close()


@pytest.mark.parametrize("where", ["process", "thread"])
def test_a_policy_that_raises_is_reported_as_text(where, window):
    counts, current = window
    solver = BackgroundSolver(where, "deepseek", {}, policy_fn=failing_policy)
    try:
        solver.submit(counts, current)
        assert wait_for(solver)["error"] == "RuntimeError: injected solver failure"
    finally:
        solver.close()


def test_a_policy_a_process_cannot_take_is_refused():
    with pytest.raises(ValueError, match="picklable"):
        BackgroundSolver("process", "deepseek", {}, policy_fn=lambda counts, cluster: None)
