"""Refits that no patch waits for (`RebalanceConfig.refit_adopt_layers`): rank 0 solves a refit in a helper of its
own while the patches go on, then hands the refit's layers to the patches, a few per patch.

Legend: L layers, G GPUs, T steps of the window, E experts.

Why: a refit moved as one attempt blocks the patches from its start to its switch (its weight moves read and keep
serving slots that a patch would change), 555-935 steps at the full shape, and a group that patches only between
refits loses much of what the patches gain (docs/rebalancing.md, 'A refit in flight blocks patches'). Adopted by the
patches instead, each of the refit's layers is planned against the placement serving when its patch starts, so no
plan goes stale, and the burst moves and drift swaps go on throughout. The layers come in the order of the refit's
gain on them (the scored steps of its window), and layers it does not improve are left to the patches.

Only rank 0 holds this state; the other ranks see patches as before. A refit adopted to its last layer counts as a
switch in rank 0's `RebalanceStats` (its lag: from the window's end to that patch's switch).
"""

import logging
import time
from dataclasses import dataclass

import numpy as np

from eplb.rebalance.background_solver import SolveResult
from eplb.rebalance.solving import Rank0Solver
from eplb.rebalance.stats import RebalanceStats
from placement import Placement

logger = logging.getLogger(__name__)


@dataclass
class Adoption:
    """What one patch job takes of a refit: `layers` of `placement` (the refit as relabelled against the placement
    serving when it was solved), rings in the order `ring_order_G`; `number` says which refit."""

    number: int
    placement: Placement
    layers: np.ndarray
    ring_order_G: np.ndarray


@dataclass
class _Pending:
    """A solved refit whose layers the patches are adopting (`order`: the layers to adopt, most gain first)."""

    number: int
    result: SolveResult
    order: list[int]
    fit_step: int
    fit_time: float
    handed: int = 0  # layers of `order` given to patch jobs, switched or still in flight
    adopted: int = 0  # layers of `order` in patches that switched (or came back kept: already serving)


class RefitAdoption:
    """Rank 0's refits for adoption by the patches (see the module docstring).

    Args:
        layers_per_patch: the most layers one patch adopts (`RebalanceConfig.refit_adopt_layers`).
        solver: the refits' own background solver (the patches keep theirs).
        solve_timeout_s: a refit still solving after this long is abandoned.
    """

    def __init__(self, layers_per_patch: int, solver: Rank0Solver, solve_timeout_s: float) -> None:
        self.layers_per_patch, self.solver, self.solve_timeout_s = layers_per_patch, solver, solve_timeout_s
        self.pending: _Pending | None = None
        self._solving: tuple[int, float] | None = None  # (fit step, perf_counter at the start) of the refit solving
        self._refits = 0

    @property
    def in_progress(self) -> bool:
        """True while a refit solves or has layers left to adopt."""
        return self._solving is not None or self.pending is not None

    def start(self, window_TLE: np.ndarray, current: Placement, step: int) -> None:
        """Solve a refit on `window_TLE` [T, L, E] (already forecast, if the config asks) from `current`, unless one
        is still solving (its window is as recent as the steps allow); one being adopted goes on until this one's
        answer replaces it."""
        if self._solving is not None:
            logger.info("a refit is still solving at step %d: no other starts", step)
            return
        self.solver.submit(window_TLE, current)
        self._solving = (step, time.perf_counter())

    def poll(self, stats: RebalanceStats) -> None:
        """Take the refit's answer once it is done: kept (not worth it), failed (logged in `stats.failures`), or
        pending adoption from the next patch job on."""
        if self._solving is None:
            return
        job = self.solver.job()
        fit_step, began = self._solving
        if not job:
            return
        if "result" not in job and "error" not in job:
            if time.monotonic() - job["started"] > self.solve_timeout_s:
                job["error"] = f"the solve ran past solve_timeout_s={self.solve_timeout_s:g}"
            else:
                return
        self._solving = None
        if "error" in job:
            stats.failures.append(f"refit: {job['error']}")
            logger.warning("refit abandoned, the patches go on from the placement serving: %s", job["error"])
            return
        result: SolveResult = job["result"]
        if result.kept:
            stats.kept += 1
            logger.info("kept the placement serving: a new fit would gain %.2f%% on the window",
                        100 * (result.gain or 0.0))
            return
        gains_L = result.layer_gains_L
        if gains_L is None:
            order = list(range(result.placement.num_layers))
        else:
            order = [int(layer) for layer in np.argsort(-gains_L, kind="stable") if gains_L[layer] > 0]
        if not order:  # the fit gains on no layer: nothing to adopt
            stats.kept += 1
            return
        self._refits += 1
        self.pending = _Pending(self._refits, result, order, fit_step, began)
        logger.info("refit solved at step %d: %d layers to adopt, %d a patch", fit_step, len(order),
                    self.layers_per_patch)

    def next_layers(self) -> Adoption | None:
        """The layers the next patch job adopts (None: none left to hand out), counted as handed."""
        pending = self.pending
        if pending is None or pending.handed >= len(pending.order):
            return None
        layers = np.array(pending.order[pending.handed:pending.handed + self.layers_per_patch], dtype=np.int64)
        pending.handed += len(layers)
        return Adoption(pending.number, pending.result.followed, layers, pending.result.ring_order_LG[0])

    def adopted(self, number: int, layers: np.ndarray, step: int, stats: RebalanceStats) -> None:
        """A patch that adopted `layers` of refit `number` switched (or came back kept): when they were the last,
        the refit counts as switched at `step`."""
        pending = self.pending
        if pending is None or pending.number != number:
            return  # a refit superseded since
        pending.adopted += len(layers)
        if pending.adopted >= len(pending.order):
            stats.record_switch(step, pending.fit_step, time.perf_counter() - pending.fit_time, None)
            logger.info("refit of step %d adopted by the patches at step %d", pending.fit_step, step)
            self.pending = None

    def dropped(self) -> None:
        """The patch jobs in flight will not switch (a failure, a drop, a regroup): hand their layers out again."""
        if self.pending is not None:
            self.pending.handed = self.pending.adopted

    def clear(self) -> None:
        """Forget the refit solving and the one being adopted (a placement was loaded, or the group re-formed)."""
        self.pending, self._solving = None, None

    def close(self) -> None:
        self.solver.close()
