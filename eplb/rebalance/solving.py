"""Rank 0's background solve as the per-step protocol sees it: starting a job, its status for rank 0's message,
and its answer handed to every rank in one broadcast.

Legend: T steps of the window, L layers, E experts, U fills and C chunks of the answer.

Only rank 0 solves; after a regroup rank 0 may be another process, which starts its own solver on first use.
"""

import time

import numpy as np
import torch

from collectives import Communicator
from eplb.rebalance.background_solver import BackgroundSolver, PolicyFn
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.move_plan import TransferShape
from eplb.rebalance.protocol import SolveStatus
from eplb.rebalance.solve_answer import pack_answer, packed_size
from placement import Placement
from placement.patch_planner import PatchJob


class Rank0Solver:
    """The group's background solve, run on whichever process is rank 0 now.

    Args:
        config: the rebalancer's settings (policy, its options, the solve's timeout, CPU share and min_gain).
        comm: the group's communicator.
        shape: what planning the weight moves needs (`move_plan.TransferShape`).
        policy_fn: a custom policy (counts_TLE, cluster) -> Placement, else `config.policy`.
    """

    def __init__(self, config: RebalanceConfig, comm: Communicator, shape: TransferShape,
                 policy_fn: PolicyFn | None) -> None:
        self.config, self.comm, self.shape, self.policy_fn = config, comm, shape, policy_fn
        self._solver: BackgroundSolver | None = None

    def background(self) -> BackgroundSolver:
        """This process's background solver, started on first use (call on rank 0 only)."""
        if self._solver is None:
            config = self.config
            options = {"time_limit_s": config.time_limit_s, "routing": config.routing,
                       "workers": config.solve_threads, "good_enough": config.good_enough}
            self._solver = BackgroundSolver(config.solve_in, config.policy, options, self.shape, self.policy_fn,
                                            cpu_share=config.solve_cpu_share, min_gain=config.min_gain)
        return self._solver

    def submit(self, counts_TLE: np.ndarray | None, current: Placement, target: Placement | None = None,
               patch: PatchJob | None = None) -> None:
        """On rank 0, start a job: fit on the window counts_TLE [T, L, E] (or take `target`, or patch for bursts)
        and plan the moves from `current`; nothing on the other ranks."""
        if self.comm.rank == 0:
            self.background().submit(counts_TLE, current, target, patch)

    def job(self) -> dict:
        """Rank 0's current job (`BackgroundSolver.poll`); {} on the other ranks."""
        return self.background().poll() if self.comm.rank == 0 else {}

    def status(self) -> tuple[SolveStatus, tuple[int, int]]:
        """Rank 0's status of the running job, and when done, the fills and chunks of its answer (what the others
        allocate for its broadcast); running on the other ranks. A job past `solve_timeout_s` is marked failed."""
        if self.comm.rank != 0:
            return SolveStatus.RUNNING, (0, 0)
        job = self.background().poll()
        if "error" in job:
            return SolveStatus.FAILED, (0, 0)
        if "result" in job:
            if job["result"].kept:
                return SolveStatus.KEPT, (0, 0)
            return SolveStatus.DONE, (len(job["result"].fills_U8), len(job["result"].chunks_C6))
        if time.monotonic() - job["started"] > self.config.solve_timeout_s:
            job["error"] = f"the solve ran past solve_timeout_s={self.config.solve_timeout_s:g}"
            return SolveStatus.FAILED, (0, 0)
        return SolveStatus.RUNNING, (0, 0)

    def broadcast_answer(self, current: Placement, num_fills: int, num_chunks: int) -> np.ndarray:
        """Rank 0's packed answer (`solve_answer`) on every rank (collective; the others allocate its size from
        rank 0's message)."""
        comm = self.comm
        if comm.rank == 0:
            answer = torch.from_numpy(pack_answer(self.job()["result"]))
        else:
            answer = torch.zeros(packed_size(current, num_fills, num_chunks), dtype=torch.int64, device=comm.device)
        return comm.broadcast(answer, 0).cpu().numpy()

    def close(self) -> None:
        """Stop the helper process, if this process started one."""
        if self._solver is not None:
            self._solver.close()
