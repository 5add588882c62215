"""A `cpsat` fit stops within moments when the thread that waits for its layers is interrupted (Ctrl-C, a signal
turned into an exception), at any budget: no layer already submitted runs on, and a CP-SAT solve in progress is
stopped; a fit left alone is unchanged by the stop checks (bit-identical placements)."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from ortools.sat.python import cp_model

from placement import ClusterSpec, fit_placement
from placement.policies.fit_stop import FitStop, FitStopped
from traces.synthetic import SyntheticConfig, generate_trace

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def counts_TLE() -> np.ndarray:
    return generate_trace(SyntheticConfig(num_steps=40, num_layers=6, num_experts=64, top_k=4, tokens_per_step=512,
                                          seed=1)).counts_TLE


# Run in a child process: the test sends Ctrl-C to the process that fits, and a signal that lands after the fit has
# returned would stop whatever that process runs next (here, only the child).
INTERRUPTED_FIT = """
import json, os, signal, sys, threading, time
from placement import ClusterSpec, fit_placement
from traces.synthetic import SyntheticConfig, generate_trace
counts_TLE = generate_trace(SyntheticConfig(num_steps=40, num_layers=6, num_experts=64, top_k=4, tokens_per_step=512,
                                            seed=1)).counts_TLE
cluster = ClusterSpec(num_gpus=16, slots_per_gpu=5, gpus_per_node=8)
timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))  # Ctrl-C, as the shell sends it
began = time.monotonic()
timer.start()
try:
    fit_placement("cpsat", counts_TLE, cluster, work_limit=1e5, workers=2, routing=sys.argv[1])
    outcome = "finished"
except KeyboardInterrupt:
    outcome = "interrupted"
took = time.monotonic() - began
timer.cancel()
alive = any(t.name.startswith("ThreadPoolExecutor") and t.is_alive() for t in threading.enumerate())
print(json.dumps({"outcome": outcome, "seconds": took, "pool_alive": alive}))
"""


@pytest.mark.parametrize("routing", ["dynamic", "static"])
def test_an_interrupted_fit_with_a_huge_budget_ends_within_two_seconds(routing):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.run([sys.executable, "-c", INTERRUPTED_FIT, routing], capture_output=True, text=True,
                           timeout=120, env=env, cwd=REPO_ROOT)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["outcome"] == "interrupted" and found["seconds"] < 2.5 and not found["pool_alive"], found


def test_the_stop_checks_leave_a_fit_bit_identical(counts_TLE):
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=9, gpus_per_node=8)
    first, second = (fit_placement("cpsat", counts_TLE[:, :2], cluster, work_limit=0.5, workers=2) for _ in range(2))
    assert np.array_equal(first.phy2log_LP, second.phy2log_LP)
    assert first.weights_LP.tobytes() == second.weights_LP.tobytes()


def test_a_stop_ends_a_running_solve_and_raises_after_it():
    """A subset-sum CP-SAT cannot settle within its 60 s: stopped after 0.2 s, it ends at once."""
    rng = np.random.default_rng(0)
    weights = [int(w) for w in rng.integers(10**6, 10**7, 60)]
    model = cp_model.CpModel()
    x = [model.new_bool_var(f"x{i}") for i in range(60)]
    model.add(sum(w * v for w, v in zip(weights, x)) == sum(weights) // 2 + 1)
    model.maximize(sum((i % 7) * v for i, v in enumerate(x)))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 60
    solver.parameters.num_workers = 1
    stop = FitStop()
    timer = threading.Timer(0.2, stop.stop)
    began = time.monotonic()
    timer.start()
    with pytest.raises(FitStopped):
        with stop.solving(solver):
            solver.solve(model)
    assert time.monotonic() - began < 2
