"""The rebalancer's solve, off the decode process: a helper process, or a thread.

A process shares neither the interpreter lock nor the scheduler's favour with decode: the `cpsat` policy's Python
parts (building models, scoring candidates) would otherwise hold the lock for long stretches while the decode thread
waits for it. The process starts once, as `python -m eplb.rebalance.background_solver` (so it imports only what
solving needs: no torch, and not the worker's main module, which a multiprocessing spawn would run again; its imports
run in the background), talks over a socket pair, and solves one job at a time, optionally paced to a share of the
time (`eplb.rebalance.cpu_pacer`). It runs at the decode processes' own priority: a solve must land within its
interval, and a lower one starves it whenever anything CPU-bound runs beside, while where decode ranks fill every core
no priority keeps background work from delaying them (only the pacer's cap does). A job is the recorder's window (or a
placement loaded from a file, or a burst patch's recent load and the last fitted placement) and the placement serving
now; its answer the new placement relabelled to move the fewest experts, the move counts, and the weight moves planned
(slow Python at the full shape, which would otherwise stall a decode step on every rank; figures: docs/rebalancing.md,
'The background solve'). The process ends when its parent does, however the parent ends and also in the middle of a
job (`collectives.lifeline`); `close` ends it sooner, by closing its socket.
"""
import dataclasses
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from collectives.lifeline import end_with_parent, parent_of_child
from eplb.rebalance.cpu_pacer import Pacer, stop_process
from eplb.rebalance.move_plan import TransferShape, encode_fills, encode_rounds, plan_rebalance
from placement import ClusterSpec, Placement, fit_placement, oblivious_moves, plan_migration
from placement.patch_planner import Followed, PatchJob, burst_layers_L, plan_patch
from placement.scoring import score_placement

PolicyFn = Callable[[np.ndarray, ClusterSpec], Placement]  # (counts_TLE, cluster) -> placement


READY_JOB = 0  # the job number of the helper's first message, "imports done, ready" (jobs count from 1)
SCORED_STEPS = 32  # the last steps of the window the fitted imbalance is measured on (the drift trigger's level)


@dataclass(frozen=True)
class SolveResult:
    """A job's answer.

    Attributes:
        placement: the new placement, relabelled to move the fewest experts from the one serving.
        moves: (experts moved, experts a slot-by-slot remap would move).
        fitted_imbalance: mean over the window's last steps and its layers, under the routing the layers run (the
            optimal per-step split standing for the live router, which is within a token of it on chain layouts
            and takes a step at a time): the level the refit-on-drift trigger compares served steps with (None for
            a placement given, not fitted).
        fills_U8, chunks_C6: the weight moves (`move_plan.plan_rebalance`, encoded).
        kept: the new placement fits the window less than `min_gain` better than the one serving, which keeps
            serving: `placement` is the serving one, nothing to move, and `fitted_imbalance` the serving one's level.
        gain: the new placement's fitted level against the serving one's on the same steps (serving / new - 1;
            None for a placement given); with `fit_skipped`, the most any placement could gain (serving / the
            window's lower bound - 1).
        fit_skipped: kept without fitting: the serving placement is within min_gain of the window's lower bound.
        followed: what the patches after this answer start from once it switches, in the serving GPUs' labels, with
            the order of the GPUs each layer is a ring in: a refit's placement as relabelled (in the order of its GPU
            map), a patch's start with its drift swaps (`placement.patch_planner`).
        swap_seconds_per_layer: a patch's drift swaps, seconds per layer they ran in (None: none ran), which sets
            how many layers the next patches swap in (`PatchPlanner.measured`).
        first_layers: a patch's layers whose burst moves come or go, planned first (their fills take the first
            rounds, and a live patch switches each layer as its weights land); None for a refit.
    """

    placement: Placement
    moves: tuple[int, int]
    fitted_imbalance: float | None
    fills_U8: np.ndarray
    chunks_C6: np.ndarray
    kept: bool = False
    gain: float | None = None
    fit_skipped: bool = False
    followed: Followed | None = None
    swap_seconds_per_layer: float | None = None
    first_layers: np.ndarray | None = None


def solve(counts_TLE: np.ndarray | None, current: Placement, policy: str, options: dict, policy_fn: PolicyFn | None,
          shape: TransferShape, target: Placement | None = None, min_gain: float = 0.0,
          patch: PatchJob | None = None) -> SolveResult:
    """Fit a placement on the window `counts_TLE` (or take `target` as it is, or patch for bursts), relabel it to
    move the fewest experts from `current`, and plan the weight moves; with `min_gain` > 0, a fit that beats
    `current` on the window by less than that (relative) is not worth moving weights for, and comes back `kept`, as
    does a window on which `current` is already within `min_gain` of the lower bound (`placement.bounds`), without a
    fit. A patch that leaves every slot of `current` as it is comes back `kept`."""
    if patch is not None:
        return _patch(current, patch, shape)
    fitted = gain = serving = None
    routing = "static" if options.get("routing") == "static" else "dynamic"
    scored = None if counts_TLE is None else counts_TLE[-SCORED_STEPS:]
    if scored is not None:
        scores = score_placement(current, scored, routing)
        serving = float(scores.imbalance_TL.mean())
    if target is None and min_gain > 0:
        # No placement fits the window better than its per-step lower bound (`placement.bounds`, scored beside
        # the imbalance): when the one serving is already within min_gain of it, no fit can be worth moving to,
        # and the fit (the job's main cost) is skipped.
        most = serving / float(scores.lower_bound_TL.mean()) - 1
        if most < min_gain:
            return _kept(current, serving, most, fit_skipped=True)
    if target is None:
        if policy_fn is not None:
            target = policy_fn(counts_TLE, current.cluster)
        else:
            target = fit_placement(policy, counts_TLE, current.cluster, **(options if policy == "cpsat" else {}))
    plan = plan_migration(current, target)
    if scored is not None:
        fitted = float(score_placement(plan.realised, scored, routing).imbalance_TL.mean())
        gain = serving / fitted - 1
        if min_gain > 0 and gain < min_gain:
            return _kept(current, serving, gain)
    fills, rounds = plan_rebalance(current, plan.realised, shape)
    return SolveResult(plan.realised, (plan.num_moves, oblivious_moves(current, target)), fitted,
                       encode_fills(fills), encode_rounds(rounds), gain=gain,
                       followed=Followed.of(plan.realised, np.tile(plan.gpu_map_G, (target.num_layers, 1))))


def _patch(current: Placement, job: PatchJob, shape: TransferShape) -> SolveResult:
    """The patch `job` plans (`placement.patch_planner.plan_patch`), each GPU's experts matched to the slots of the
    same GPU of `current`, and its weight moves, the layers whose burst moves come or go first; `kept` when it holds
    every slot's expert where `current` does (new static weights alone are not worth a switch)."""
    planned = plan_patch(job)
    plan = plan_migration(current, planned.target, relabel_gpus=False)
    if np.array_equal(plan.realised.phy2log_LP, current.phy2log_LP):
        return dataclasses.replace(_kept(current, None, None), swap_seconds_per_layer=planned.swap_seconds_per_layer)
    urgent = np.flatnonzero(burst_layers_L(planned, job.start.placement, current))
    fills, rounds = plan_rebalance(current, plan.realised, shape, urgent.tolist())
    return SolveResult(plan.realised, (plan.num_moves, oblivious_moves(current, planned.target)), None,
                       encode_fills(fills), encode_rounds(rounds), followed=planned.followed,
                       swap_seconds_per_layer=planned.swap_seconds_per_layer, first_layers=urgent)


def _kept(current: Placement, serving: float | None, gain: float | None, fit_skipped: bool = False) -> SolveResult:
    """The answer that keeps `current` serving (nothing to move)."""
    empty = np.zeros((0, 8), dtype=np.int64), np.zeros((0, 6), dtype=np.int64)
    return SolveResult(current, (0, 0), serving, *empty, kept=True, gain=gain, fit_skipped=fit_skipped)


class BackgroundSolver:
    """Runs `solve` jobs in the background, one at a time; `submit` and `poll` never block.

    Args:
        in_process: "process" (a helper process, the default for serving) or "thread".
        shape: what the weight moves' schedule needs (sizes, element size, bytes per round).
        policy_fn: a custom policy; with a process it must be picklable (a module-level function).
        cpu_share: the share of the time the helper process may run while it solves (1: no cap; below 1 needs
            `in_process="process"` and a POSIX OS).
        min_gain: a fit must beat the placement serving by this much on the window to be moved to (see `solve`).
    """

    def __init__(self, in_process: str, policy: str, options: dict, shape: TransferShape,
                 policy_fn: PolicyFn | None = None, cpu_share: float = 1.0, min_gain: float = 0.0) -> None:
        if in_process not in ("process", "thread"):
            raise ValueError(f"in_process must be 'process' or 'thread'; got {in_process!r}")
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share must be in (0, 1]; got {cpu_share:g}")
        if cpu_share < 1 and in_process != "process":
            raise ValueError("cpu_share below 1 paces a helper process: set in_process='process' (a thread "
                             "cannot be paused)")
        if in_process == "process" and policy_fn is not None:
            try:
                pickle.dumps(policy_fn)
            except Exception as exc:
                raise ValueError("policy_fn must be picklable (a module-level function) to solve in a process; "
                                 "or set solve_in='thread'") from exc
        self.in_process, self.policy, self.options, self.policy_fn = in_process, policy, options, policy_fn
        self.shape, self.min_gain = shape, min_gain
        self._job = 0
        self._box: dict = {}
        self._ready = False
        self._conn = None
        self._process: subprocess.Popen | None = None
        if in_process == "process":
            self._conn, self._process = _start_helper((policy, options, policy_fn, shape, cpu_share, min_gain))
        else:
            import_solving_modules(policy, policy_fn)

    def submit(self, counts_TLE: np.ndarray | None, current: Placement, target: Placement | None = None,
               patch: PatchJob | None = None) -> None:
        """Start a job: fit on the window `counts_TLE`, or take `target` (a loaded placement), or patch for bursts,
        and plan the moves from `current` (a job still running is abandoned: its answer will be ignored)."""
        self._job += 1
        self._box = {"job": self._job, "started": time.monotonic()}
        if self._conn is not None:
            self._conn.send((self._job, counts_TLE, current, target, patch))
        else:
            threading.Thread(target=self._solve_in_thread, args=(self._box, counts_TLE, current, target, patch),
                             name="eplb-solve", daemon=True).start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the helper process to have imported what it solves with and started its pacer
        (call once, before the first `submit`, where a wait costs nothing, so that its start-up
        does not run beside the first decode steps); True when it is ready (a thread always is)."""
        if self._conn is None or self._ready:
            return True
        try:
            if self._conn.poll(timeout_s):
                job, _, _ = self._conn.recv()
                self._ready = job == READY_JOB
        except (EOFError, OSError):
            return False
        return self._ready

    def poll(self) -> dict:
        """The current job's state: {} before any, else with "result" (a `SolveResult`) or "error" (text) once
        done, and "started" (monotonic seconds)."""
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

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the helper process (a job in flight is abandoned) and reap it."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            stop_process(self._process, timeout_s)  # a paused helper ends when its watcher resumes it (one cycle)
            self._process = None

    def _solve_in_thread(self, box: dict, counts_TLE: np.ndarray | None, current: Placement,
                         target: Placement | None, patch: PatchJob | None) -> None:
        try:
            box["result"] = solve(counts_TLE, current, self.policy, self.options, self.policy_fn, self.shape, target,
                                  self.min_gain, patch)
        except Exception as exc:  # reported to every rank by the next poll
            box["error"] = f"{type(exc).__name__}: {exc}"


def _start_helper(settings: tuple) -> tuple[Connection, subprocess.Popen]:
    """Start the helper process and hand it `settings` (policy, options, policy_fn, shape, cpu_share, min_gain):
    the connection to it and the process."""
    ours, theirs = socket.socketpair()
    package_root = str(Path(__file__).resolve().parents[2])  # where `eplb` imports from, as in this process
    paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS",
                                                                                                  "1")}
    parent_pid, from_main_thread = parent_of_child()
    try:
        process = subprocess.Popen([sys.executable, "-m", "eplb.rebalance.background_solver", str(theirs.fileno()),
                                    str(parent_pid), str(int(from_main_thread))],
                                   pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    conn.send(settings)
    return conn, process


def import_solving_modules(policy: str, policy_fn: PolicyFn | None) -> None:
    """Imports now what a solve imports on first use (the cpsat policy's OR-Tools, scipy for the migration plan),
    where the start-up waits anyway: in the first solve these imports would run at the helper's low priority beside
    busy decode ranks, and hold that solve for tens of steps."""
    if policy_fn is None and policy == "cpsat":
        import placement.policies.cpsat_policy  # noqa: F401
    import scipy.optimize  # noqa: F401
    import scipy.sparse  # noqa: F401


def _serve(conn, policy: str, options: dict, policy_fn: PolicyFn | None, shape: TransferShape,
           cpu_share: float, min_gain: float) -> None:
    """The helper process: answer jobs until the connection closes, paced to `cpu_share` while it solves."""
    import_solving_modules(policy, policy_fn)
    pacer = Pacer(cpu_share)
    try:
        conn.send((READY_JOB, True, None))
        while True:
            try:
                job, counts_TLE, current, target, patch = conn.recv()
            except (EOFError, OSError):
                return
            pacer.on()
            try:
                answer = (job, True, solve(counts_TLE, current, policy, options, policy_fn, shape, target, min_gain,
                                           patch))
            except Exception as exc:
                answer = (job, False, f"{type(exc).__name__}: {exc}")
            finally:
                pacer.off()
            try:
                conn.send(answer)
            except (EOFError, OSError):
                return
    finally:
        pacer.close()


def helper_main(fd: int, parent_pid: int, from_main_thread: bool) -> None:
    """The helper process's entry: end with the parent (`collectives.lifeline.end_with_parent`), read the settings
    from the connection on `fd`, then serve jobs."""
    end_with_parent(parent_pid, from_main_thread)
    conn = Connection(fd)
    try:
        settings = conn.recv()
    except (EOFError, OSError):
        return
    _serve(conn, *settings)


if __name__ == "__main__":
    # Run through the module's own name, so that answers pickle as `eplb.rebalance.background_solver.SolveResult`.
    from eplb.rebalance.background_solver import helper_main as main

    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
