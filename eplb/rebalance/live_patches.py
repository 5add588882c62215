"""The live rebalancer's patches on one rank: their clock on every rank and, on rank 0, their planner.

Legend: T recent steps read, L layers, E experts.

A patch is an attempt like a refit (solved on rank 0, broadcast, moved, switched), whose job is planned by
`placement.patch_planner.PatchPlanner`, the same planner the replay drives: rank 0 alone holds it (what the patches
follow, whose turn it is for drift swaps); the other ranks see a patch as any attempt.
"""

import torch

from collectives import Communicator
from eplb.live.load_recorder import LoadRecorder
from eplb.rebalance.background_solver import SolveResult
from eplb.rebalance.patch_clock import PatchClock
from eplb.rebalance.solving import Rank0Solver
from placement import Placement
from placement.patch_planner import Followed, PatchPlanner, PatchSettings


class LivePatches:
    """Patches of one rank's rebalancer.

    Args:
        settings: the patch settings (`RebalanceConfig.patches`).
        comm: the group's communicator.
        recorder: the load recorder the layers write to.
        placement: the placement serving now, which the first patches follow.
    """

    def __init__(self, settings: PatchSettings, comm: Communicator, recorder: LoadRecorder,
                 placement: Placement) -> None:
        self.settings, self.comm, self.recorder = settings, comm, recorder
        self.clock = PatchClock(settings.every)
        self.planner = PatchPlanner(settings, placement) if comm.rank == 0 else None

    def submit(self, solver: Rank0Solver, start: Followed | None, current: Placement) -> None:
        """Read the recent load (an all-reduce on every rank when the recorder keeps this rank's tokens) and, on rank
        0, submit the next patch's job, from `start` (rank 0's: the target of a patch still moving; None: the
        placement followed), planned from `current`. Every rank calls it at the same step."""
        settings = self.settings
        windows = (settings.window, settings.drift_window) if settings.drift_swaps else (settings.window,)
        recent_TLE = self.recorder.counts_TLE(last=max(windows))  # one read, one all-reduce for both windows
        sums_WLE = torch.stack([recent_TLE[-window:].sum(0) for window in windows])
        if self.recorder.scope == "rank":  # this rank's tokens: all-reduce (a collective, on every rank)
            sums_WLE = self.comm.all_reduce_sum(sums_WLE)
        means = [total.cpu().numpy() / min(window, len(recent_TLE)) for total, window in zip(sums_WLE, windows)]
        if self.planner is not None:
            job = self.planner.job(means[0], means[1] if len(means) > 1 else None, start)
            solver.submit(None, current, patch=job)

    def answered(self, result: SolveResult | None) -> None:
        """Rank 0: a patch job's answer; its drift swaps' cost sets the next patches' stride."""
        if self.planner is not None and result is not None:
            self.planner.measured(result.swap_seconds_per_layer)

    def landed(self, followed: Followed | None, layers=None) -> None:
        """A patch switched (in `layers` only, when given); rank 0 keeps its drift swaps for the next patches."""
        if self.planner is not None and followed is not None:
            self.planner.landed(followed, layers)

    def refit(self, followed: Followed) -> None:
        """A refit or a loaded placement serves: the patches follow it."""
        if self.planner is not None:
            self.planner.refit(followed)

    def regrouped(self, placement: Placement) -> None:
        """The group re-formed and serves `placement`: the patches follow it, planned by whichever process is rank 0
        now (after rank 0's death another one)."""
        self.planner = PatchPlanner(self.settings, placement) if self.comm.rank == 0 else None
