"""The rebalancer's solve, off the decode process: a helper process at a low CPU priority, or a thread.

A process shares neither the interpreter lock nor the scheduler's favour with decode: the `cpsat` policy's Python
parts (building models, scoring candidates) would otherwise hold the lock for milliseconds at a time while the
decode thread waits for it. The process starts once (its imports take a second or two, in the background) and
solves one job at a time; a job is the recorder's window and the placement serving now, and its answer the new
placement relabelled to move the fewest experts, with the move counts. The process ends when its parent does (its
pipe closes), even if the parent was killed.
"""

import multiprocessing as mp
import os
import pickle
import threading
import time
from collections.abc import Callable

import numpy as np

from placement import ClusterSpec, Placement, fit_placement, oblivious_moves, plan_migration
from placement.scoring import score_placement

LOW_PRIORITY_NICE = 10  # CPU share about 1/10 of a decode process when they compete (19 starves it)
PolicyFn = Callable[[np.ndarray, ClusterSpec], Placement]  # (counts_TLE, cluster) -> placement


SCORED_STEPS = 32  # the last steps of the window the fitted imbalance is measured on (the drift trigger's level)


def solve(counts_TLE: np.ndarray, current: Placement, policy: str, options: dict,
          policy_fn: PolicyFn | None) -> tuple[Placement, tuple[int, int], float]:
    """The new placement for the window, relabelled to move the fewest experts from `current`; (experts moved,
    experts a slot-by-slot remap would move); and its fitted imbalance (mean over the window's last steps and its
    layers, under the routing the layers run), the level the refit-on-drift trigger compares served steps with."""
    if policy_fn is not None:
        target = policy_fn(counts_TLE, current.cluster)
    else:
        target = fit_placement(policy, counts_TLE, current.cluster, **(options if policy == "cpsat" else {}))
    plan = plan_migration(current, target)
    routing = "static" if options.get("routing") == "static" else "live"
    fitted = float(score_placement(plan.realised, counts_TLE[-SCORED_STEPS:], routing).imbalance_TL.mean())
    return plan.realised, (plan.num_moves, oblivious_moves(current, target)), fitted


class BackgroundSolver:
    """Runs `solve` jobs in the background, one at a time; `submit` and `poll` never block.

    Args:
        in_process: "process" (a helper process, the default for serving) or "thread".
        policy_fn: a custom policy; with a process it must be picklable (a module-level function).
    """

    def __init__(self, in_process: str, policy: str, options: dict, policy_fn: PolicyFn | None = None) -> None:
        if in_process not in ("process", "thread"):
            raise ValueError(f"in_process must be 'process' or 'thread'; got {in_process!r}")
        if in_process == "process" and policy_fn is not None:
            try:
                pickle.dumps(policy_fn)
            except Exception as exc:
                raise ValueError("policy_fn must be picklable (a module-level function) to solve in a process; "
                                 "or set solve_in='thread'") from exc
        self.in_process, self.policy, self.options, self.policy_fn = in_process, policy, options, policy_fn
        self._job = 0
        self._box: dict = {}
        self._conn = None
        if in_process == "process":
            parent, child = mp.get_context("spawn").Pipe()
            process = mp.get_context("spawn").Process(target=_serve, args=(child, policy, options, policy_fn),
                                                      name="eplb-solver", daemon=True)
            process.start()
            child.close()
            self._conn, self._process = parent, process

    def submit(self, counts_TLE: np.ndarray, current: Placement) -> None:
        """Start a job (a job still running is abandoned: its answer will be ignored)."""
        self._job += 1
        self._box = {"job": self._job, "started": time.monotonic()}
        if self._conn is not None:
            self._conn.send((self._job, counts_TLE, current))
        else:
            threading.Thread(target=self._solve_in_thread, args=(self._box, counts_TLE, current),
                             name="eplb-solve", daemon=True).start()

    def poll(self) -> dict:
        """The current job's state: {} before any, else with "result" (placement, moves, fitted imbalance) or
        "error" (text) once done, and "started" (monotonic seconds)."""
        while self._conn is not None and self._conn.poll():
            try:
                job, ok, payload = self._conn.recv()
            except (EOFError, OSError):
                self._box.setdefault("error", "the solver process ended")
                self._conn = None
                break
            if job == self._box.get("job"):
                self._box["result" if ok else "error"] = payload
        return self._box

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _solve_in_thread(self, box: dict, counts_TLE: np.ndarray, current: Placement) -> None:
        low_priority()
        try:
            box["result"] = solve(counts_TLE, current, self.policy, self.options, self.policy_fn)
        except Exception as exc:  # reported to every rank by the next poll
            box["error"] = f"{type(exc).__name__}: {exc}"


def _serve(conn, policy: str, options: dict, policy_fn: PolicyFn | None) -> None:
    """The helper process: answer jobs until the pipe closes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    low_priority()
    while True:
        try:
            job, counts_TLE, current = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = (job, True, solve(counts_TLE, current, policy, options, policy_fn))
        except Exception as exc:
            answer = (job, False, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return


def low_priority() -> None:
    """Give this thread (and the threads it starts) a low CPU priority where the OS allows it (on Linux nice is per
    thread, so this leaves the rest of the process alone)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOW_PRIORITY_NICE)
    except (AttributeError, OSError):
        pass
