"""One rank's rebalance attempt from rank 0's answer to its switch or its end (the protocol: `rebalancer`).

Legend: G ranks.

Every rank reads the same messages at the same step (`protocol.Field`), so every rank takes the same decision: wait,
fail, keep, or broadcast the answer and move its weights round by round; switch when every rank moved them and
accepts; a patch's layers switch as their weights land. A failure anywhere drops the attempt on every rank at the
same step and leaves the placement serving.
"""

import logging
import time

import numpy as np

from collectives import Communicator
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.rebalance.attempt import Attempt, last_rounds
from eplb.rebalance.background_solver import SolveResult
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.drift import DriftWatch
from eplb.rebalance.host_copies import HostCopies
from eplb.rebalance.live_patches import LivePatches
from eplb.rebalance.move_plan import decode_for_rank
from eplb.rebalance.protocol import Field, SolveStatus
from eplb.rebalance.refit_clock import RefitClock
from eplb.rebalance.solve_answer import unpack_answer
from eplb.rebalance.solving import Rank0Solver
from eplb.rebalance.stats import RebalanceStats
from eplb.rebalance.transfer import WeightMover, tag_base
from placement import Placement, PlacementFormatError
from placement.patch_planner import Followed

logger = logging.getLogger(__name__)


class AttemptRunner:
    """The attempt under way on this rank (None: idle) and the placement serving.

    Args:
        config: the rebalancer's settings.
        comm: the group's communicator.
        layers: this rank's MoE layers.
        parts: (mover, host copies, rank 0's solver, stats, drift watch) the rebalancer built.
        refits: when refits are due (an ended refit restarts the interval; a due refit replaces a queued patch).
        patches: the patches' clock and planner (None: no patches).
        placement: the placement serving now.
    """

    def __init__(self, config: RebalanceConfig, comm: Communicator, layers: list[MoEDecodeLayer],
                 parts: tuple[WeightMover, HostCopies, Rank0Solver, RebalanceStats, DriftWatch], refits: RefitClock,
                 patches: LivePatches | None, placement: Placement) -> None:
        self.config, self.comm, self.layers = config, comm, layers
        self.mover, self.host_copies, self.solver, self.stats, self.drift = parts
        self.refits, self.patches = refits, patches
        self.placement = placement
        self.attempt: Attempt | None = None

    def poll_solve(self, step: int, received_G: np.ndarray | None) -> None:
        """Act on rank 0's solve status once it is about this attempt (`take_answer`)."""
        if received_G is None or received_G[0, Field.ATTEMPT] != self.stats.attempts:
            return  # rank 0's status for this attempt arrives with the next step
        self.take_answer(step, received_G[0])

    def take_answer(self, step: int, rank0_message: np.ndarray) -> None:
        """Act on rank 0's solve status in `rank0_message` (its message, about this attempt's job): wait, fail,
        keep, or broadcast the answer, start moving and post the first round in this same step (a patch: and start
        the next patch's job from its target once due)."""
        attempt, comm = self.attempt, self.comm
        status = SolveStatus(int(rank0_message[Field.SOLVE_STATUS]))
        if status == SolveStatus.RUNNING:
            return
        job = self.solver.job()
        if attempt.patch:
            self.patches.answered(job.get("result"))
        if status == SolveStatus.FAILED:
            self.fail(f"the solve failed on rank 0: {job.get('error', 'see rank 0 log')}" if comm.rank == 0
                      else "the solve failed on rank 0")
            return
        if status == SolveStatus.KEPT:
            self._keep(job.get("result"))
            return
        num_fills, num_chunks = int(rank0_message[Field.NUM_FILLS]), int(rank0_message[Field.NUM_CHUNKS])
        answer = self.solver.broadcast_answer(self.placement, num_fills, num_chunks)
        # Every rank holds the same bytes now, so every rank reaches the same verdict: no agreement needed.
        try:
            target, fitted, fills_U8, chunks_C6 = unpack_answer(answer, self.placement, num_fills, num_chunks,
                                                                self.config.policy)
        except PlacementFormatError as exc:
            self.fail(f"the solved placement is invalid: {exc}")
            return
        fills, rounds = decode_for_rank(fills_U8, chunks_C6, comm.rank)
        if comm.rank == 0:
            attempt.followed = job["result"].followed
        attempt.start_moving(self.placement, target, fitted, fills, rounds,
                             self.mover.staging_for(list(fills.values())),
                             job["result"].moves if comm.rank == 0 else None,
                             last_rounds(fills_U8, chunks_C6) if attempt.patch else {})  # refits switch at once
        attempt.broadcast_step = step
        self._prepare_and_advance(attempt)  # the first round moves during this very step
        if attempt.patch:
            switched_now = bool(self.stats.patch_steps) and self.stats.patch_steps[-1] == step
            if self.patches.clock.broadcast(step, attempt.fit_step, attempt.moving_steps, attempt.queued,
                                            switched_now):
                self.queue_patch(step)

    def queue_patch(self, step: int) -> None:
        """Start the next patch's job now, while the patch under way moves its weights: it starts from that patch's
        drift swaps and is planned from its target, and becomes an attempt at its switch, its answer often ready by
        then. Every rank calls it at the same step."""
        self.patches.submit(self.solver, self.attempt.followed, self.attempt.target)
        self.patches.clock.queued(step)

    def move_round(self, step: int, received_G: np.ndarray | None) -> None:
        """Switch when every rank reported all rounds moved; else prepare a few layers, complete the round posted
        before the last decode step (it moved meanwhile) and post the next."""
        attempt, comm = self.attempt, self.comm
        current = received_G is not None and bool((received_G[:, Field.ATTEMPT] == self.stats.attempts).all())
        if current and not received_G[:, Field.TRANSFERS_OK].all():
            failed = np.flatnonzero(received_G[:, Field.TRANSFERS_OK] == 0).tolist()
            self.fail(f"a weight transfer failed or timed out on rank(s) {[comm.members[r] for r in failed]}")
            return
        if current and attempt.reported_all:
            # Every round moved and every rank said so with the last step: switch, if every rank accepts.
            self._switch(step, bool(received_G[:, Field.ACCEPTS_SWITCH].all()), received_G)
            return
        if current and attempt.patch and received_G[:, Field.ACCEPTS_SWITCH].all():
            # A patch's layers switch as their weights land: round r completes at the broadcast's step + r + 1, and
            # every rank's message of that step says whether it succeeded.
            landed = attempt.layers_landed(step - attempt.broadcast_step - 1)
            if landed:
                self._switch_layers(attempt, landed)
        self._prepare_and_advance(attempt)

    def _switch_layers(self, attempt: Attempt, layers: list[int]) -> None:
        """Install `layers` of a patch's target ahead of its other layers (every rank at the same step): their
        staged experts, tables and host copies; the placement serving (and on rank 0 the one the patches follow)
        takes those layers."""
        attempt.install(layers, self.layers, self.mover, self.host_copies)
        attempt.switched_L.update(layers)
        self.stats.early_layer_switches += len(layers)
        self.placement = self.placement.with_layers_of(attempt.target, layers)
        self.patches.landed(attempt.followed, layers)  # a failure after this leaves these layers' swaps serving

    def _prepare_and_advance(self, attempt: Attempt) -> None:
        """Prepare a few of `attempt`'s layers, complete the round in flight and post the next."""
        attempt.prepare_layers(self.comm.device, self.host_copies)
        tags = tag_base(self.stats.attempts, attempt.next_round)
        attempt.advance(self.mover, self.config.transfer_timeout_s, tags, self.stats)

    def _switch(self, step: int, accept: bool, received_G: np.ndarray) -> None:
        """Install the target on every layer (staged experts into their slots, its tables, its host copies)."""
        attempt = self.attempt
        if not accept:
            self.fail("a rank refused the switch")
            return
        # A patch's layers switched as their weights landed are installed already.
        attempt.install([index for index in range(len(self.layers)) if index not in attempt.switched_L], self.layers,
                        self.mover, self.host_copies)
        self.placement = attempt.target
        self.attempt = None
        if attempt.patch:
            self._patch_switched(step, attempt, received_G)
            return
        if self.patches is not None:
            self.patches.refit(attempt.followed or Followed.of(attempt.target))
        self.drift.restart(attempt.fitted_imbalance)
        self.stats.record_switch(step, attempt.fit_step, time.perf_counter() - attempt.fit_time, attempt.moves)
        logger.info("switched to the new placement at step %d (%d fills)", step, len(attempt.fills))

    def _patch_switched(self, step: int, attempt: Attempt, received_G: np.ndarray) -> None:
        """A patch switched: its drift swaps stay for the next patches (rank 0), and the patch queued while it moved
        becomes the attempt, its answer taken now if rank 0's message said it was done and no refit is due (which
        would replace it)."""
        self.patches.landed(attempt.followed)
        self.drift.restart(self.drift.fitted_imbalance)  # the fit's level stays the drift trigger's
        self.stats.record_patch(step, attempt.fit_step, attempt.moves, attempt.broadcast_step,
                                attempt.moving_steps, len(attempt.switched_L))
        logger.info("switched to a burst patch at step %d (%d fills)", step, len(attempt.fills))
        queued_step = self.patches.clock.take_queued(step)
        if queued_step is not None:  # the next patch, solving since this one moved
            self.stats.attempts += 1
            self.attempt = Attempt(fit_step=queued_step, patch=True, queued=True)
            if not self.refits.due:  # rank 0's message was about the queued job while this patch moved
                self.take_answer(step, received_G[0])

    def _keep(self, answer: SolveResult | None) -> None:
        """End the attempt with the placement serving unchanged (the fit gained less than min_gain, or a patch
        would change no slot; `answer` is rank 0's). After a refit, the drift trigger's level is then measured again
        on the steps served from here, so that traffic no placement serves better does not start attempt after
        attempt."""
        if self.attempt.patch:
            self.attempt = None
            return
        self.stats.kept += 1
        if answer is not None:
            logger.info("kept the placement serving: a new fit would gain %s%.2f%% on the window (min_gain %.2f%%)",
                        "at most " if answer.fit_skipped else "", 100 * answer.gain, 100 * self.config.min_gain)
        self.drift.restart()
        self.attempt = None
        self.refits.ended()

    def fail(self, reason: str) -> None:
        """Drop the attempt: the old placement keeps serving; try again at the next interval (a patch: at the
        next patch)."""
        patch = self.attempt.patch
        if self.patches is not None:
            self.patches.clock.drop()  # a job queued from a target that will not serve
        self.stats.failures.append(f"burst patch: {reason}" if patch else reason)
        logger.warning("%s abandoned, the current placement keeps serving: %s", "burst patch" if patch else "rebalance",
                       reason)
        self.attempt = None
        if not patch:
            self.refits.ended()
