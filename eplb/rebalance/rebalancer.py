"""Rebalancing a running EP group between decode steps: the per-step protocol.

Legend: L layers, E experts, G ranks (one GPU each), S slots per rank, P = G x S, T steps in the recorder's window,
U fills and C chunks of a solve's answer.

The worker calls `Rebalancer.step(step)` on every rank before each decode step. It never waits on a solve or a
transfer, and its agreements cost no collective: each step every rank sends a short message (`protocol.Field`)
with its expert counts in the first layer's all-gather (which the layer runs anyway), and at the next step every
rank reads the same messages and takes the same decision. Over the steps (`protocol.Phase`):

1. idle: every `interval` steps (or at once when some rank saw the imbalance drift, `drift`), take the group's
   window [T, L, E] (all-reduced, unless the recorder keeps the group's counts) and start the policy on rank 0 in
   the background (`BackgroundSolver`: a helper process at a low CPU priority, or a thread; no collective runs
   there: every collective stays on the worker's thread, in step order); `load(file)` starts the same way with a
   given placement;
2. solving: rank 0's message says whether the solve is running, failed or done (`protocol.SolveStatus`), and the
   size of its answer; a fit that beats the placement serving by less than `min_gain` on the window ends the
   attempt there (nothing is worth moving); when done, rank 0 broadcasts, in one collective, the placement
   relabelled to move the fewest experts (`plan_migration`) and the weight moves planned beside the solve
   (`move_plan.plan_rebalance`: moved slots into staging buffers, and the host copies the new placement needs, in
   rounds); each rank keeps its part (`attempt.Attempt`) and posts the first round in the same step;
3. moving: one round of chunks per step (no rank sends or receives more than `max_bytes_per_step`), posted before
   the decode step and completed before the next (it moves while the step runs, `transfer`), and the routing
   tables of a layer or a few that the target changes built; each rank's message says whether its transfers
   succeeded; R rounds are posted from the broadcast's step on, the last completed R steps after it;
4. switch: the step after that, if every rank's transfers succeeded and every rank accepts, each copies the staged
   experts into the slots and installs the new tables on every layer, between two steps: a step runs wholly on the
   old or the new placement (R + 1 steps from the broadcast). A patch's layers switch as their weights land: a
   layer whose fills all lie in the rounds every rank completed (its tables built) switches on its own, the layers
   whose burst moves come or go planned first (`SolveResult.first_layers`), so they serve rounds sooner; a step
   runs each layer wholly on its old or its new slots.
A failure or timeout anywhere (solve, transfer, a refusal) drops the staged state on every rank at the same step,
leaves the old placement serving, is logged once, and the next attempt comes at the next interval.

Patches (`RebalanceConfig.patches`; `live_patches`): between refits, every `patches.every` steps while no refit is
under way, a patch attempt whose job rank 0's `placement.patch_planner.PatchPlanner` makes (the planner the replay
drives too): drift swaps of the placement the patches follow, burst moves on top; it comes back kept when no slot
would change, else it moves a few experts and switches the same way, only the layers it changes getting new tables.
While a patch moves, the next patch's job starts from its target (`patch_clock.PatchClock`), so a patch of R rounds
follows the last every R + 1 steps. A failed patch drops the queued one. A refit that comes due while a patch is
still solving replaces it; one that comes due while a patch moves waits the few steps to its switch. No patch starts
while a refit is under way: its moves read and keep serving slots a patch would change.

A rank that dies surfaces as a `CollectiveError`; `recover` and `mark_failed` re-form the group (`recovery`).
"""

import time

import numpy as np
import torch

from collectives import CollectiveError, Communicator
from collectives.membership import Heartbeat
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.rebalance.attempt import Attempt
from eplb.rebalance.attempt_runner import AttemptRunner
from eplb.rebalance.background_solver import PolicyFn
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.drift import DriftWatch
from eplb.rebalance.host_copies import HostCopies
from eplb.rebalance.live_patches import LivePatches
from eplb.rebalance.protocol import Field, Phase, SolveStatus, message
from eplb.rebalance.recovery import GroupRecovery, RecoveryReport, agree_and_regroup
from eplb.rebalance.refit_clock import RefitClock
from eplb.rebalance.settings_checks import check_loadable, check_settings
from eplb.rebalance.solving import Rank0Solver
from eplb.rebalance.stats import RebalanceStats
from eplb.rebalance.transfer import WeightMover
from placement import Placement, load_placement
from placement.forecast import hedged_window

__all__ = ["Rebalancer", "RebalanceStats", "RecoveryReport"]


class Rebalancer:
    """Rebalances one rank's MoE layers with its peers; see the module docstring for the protocol.

    Constructed on every rank of the group at the same point (it builds the host copies collectively). A peer that
    dies meanwhile is recovered from as in serving: the survivors start without it, or, when some expert lived only
    on it, every survivor's constructor raises `CollectiveError` saying so.

    Args:
        config: the settings, the same on every rank.
        comm: the group's communicator (joined with a `store_address` for `recover` and heartbeats).
        layers: this rank's MoE layers, layer i serving layer i of `placement`.
        recorder: the load recorder the layers write to.
        placement: the placement serving now.
        policy_fn: a custom policy (counts_TLE, cluster) -> Placement; default `config.policy` via `fit_placement`.
    """

    def __init__(self, config: RebalanceConfig, comm: Communicator, layers: list[MoEDecodeLayer],
                 recorder: LoadRecorder, placement: Placement, *, policy_fn: PolicyFn | None = None) -> None:
        check_settings(config, comm, layers, recorder, placement)
        self.config, self.comm, self.layers, self.recorder = config, comm, layers, recorder
        self.placement_members = list(comm.members)  # original rank of each GPU of the placement
        self.failures_tolerated = config.failures_tolerated_for(comm.world_size)
        self.stats = RebalanceStats()
        self.host_copies = HostCopies(len(layers), comm, self.failures_tolerated)
        self.mover = WeightMover(comm, layers, self.host_copies.copy_of)
        self.drift = DriftWatch(config)
        self.recovery = GroupRecovery(config, comm, layers, recorder, self.mover, self.host_copies, self.stats)
        self.refits = RefitClock(config.interval)
        self.patches = None if config.patches is None else LivePatches(config.patches, comm, recorder, placement)
        shape = self.mover.transfer_shape(config.max_bytes_per_step, self.failures_tolerated)
        self.solver = Rank0Solver(config, comm, shape, policy_fn)
        self.run = AttemptRunner(config, comm, layers, (self.mover, self.host_copies, self.solver, self.stats,
                                                        self.drift), self.refits, self.patches, placement)
        if comm.rank == 0:
            # Start the helper process now and let its imports finish before decode starts (the other ranks wait
            # for this rank in the collectives below: at most half their timeout), not beside the first steps.
            self.solver.background().wait_ready(comm.timeout_s / 2)
        self._heartbeat = _start_heartbeat(comm, config)
        try:
            self.host_copies.build(placement, self.mover, config.max_bytes_per_step, self.stats)  # collective
            comm.barrier()  # every rank leaves here together, so no rank's first decode step waits on the start-up
        except CollectiveError:  # a peer died while the group started: serve without it, as after any death
            survivors, target = self.recovery.start_without_the_lost(placement, self.placement_members)
            if target is not None:
                self.run.placement, self.placement_members = target, survivors
                if self.patches is not None:
                    self.patches.regrouped(target)

    @property
    def placement(self) -> Placement:
        """The placement serving now."""
        return self.run.placement

    @property
    def phase(self) -> Phase:
        """"idle", "solving" (waiting on the background solve) or "moving" (weights in flight, then the switch)."""
        if self.run.attempt is None:
            return Phase.IDLE
        return Phase.SOLVING if self.run.attempt.target is None else Phase.MOVING

    @property
    def transfer_in_flight(self) -> bool:
        """True while a round of a rebalance's weights is posted and not yet completed (it moves during the decode
        step that follows `step`)."""
        return self.run.attempt is not None and self.run.attempt.in_flight is not None

    @property
    def in_progress(self) -> bool:
        """True while a rebalance or a burst patch is under way (solving, moving or about to switch)."""
        return self.run.attempt is not None

    @property
    def refit_in_progress(self) -> bool:
        """True while a refit or a loaded placement is under way (not a burst patch)."""
        return self.run.attempt is not None and not self.run.attempt.patch

    @property
    def host_copy_bytes(self) -> int:
        """Bytes of expert weights this rank keeps in host memory for its peers' failures."""
        return self.host_copies.nbytes

    def step(self, step: int, accept_switch: bool = True) -> None:
        """Do this step's share of rebalancing; call on every rank before decode step `step`.

        `accept_switch=False` on any rank refuses a switch that would come at the next step: the old placement keeps
        serving everywhere and the next attempt comes at the next interval. A `CollectiveError` escaping here means
        a peer died: call `recover`.
        """
        self.drift.note_step(self.layers)
        received_G = self._received_G()
        if received_G is not None and received_G[:, Field.DRIFTED].any():
            self.refits.request()  # every rank reads the same flags: a refit at the first step that may start one
        drifted = started = False
        if not self.refit_in_progress:
            self.refits.tick()
            if self.patches is not None:
                self.patches.clock.tick()
            if self.phase != Phase.MOVING:  # idle, or a patch still solving, which a due refit replaces
                drifted, started = self._maybe_start(step)
        if not started and self.phase == Phase.SOLVING:
            self.run.poll_solve(step, received_G)
        elif not started and self.phase == Phase.MOVING:
            if self.patches is not None and self.patches.clock.queue_due(step):  # due at the broadcast: now
                self.run.queue_patch(step)
            self.run.move_round(step, received_G)
        # Rank 0's solve status: this attempt's job while it solves, the queued patch's while a patch moves.
        solving = self.phase == Phase.SOLVING or (self.patches is not None and self.patches.clock.job_queued)
        status, sizes = self.solver.status() if solving else (SolveStatus.RUNNING, (0, 0))
        transfers_ok = self.run.attempt is None or self.run.attempt.transfers_ok
        self.layers[0].piggyback = torch.tensor(
            message(self.stats.attempts, status, sizes, transfers_ok=transfers_ok, accepts_switch=accept_switch,
                    drifted=drifted), dtype=torch.int64)

    def request_rebalance(self) -> None:
        """Start a rebalance attempt at the next `step` instead of at the next interval (as an operator's manual
        trigger does, e.g. SGLang's rebalance request; after a burst patch that is moving, when it has switched).
        Call on every rank at the same step; no-op while a refit is under way."""
        if not self.refit_in_progress:
            self.refits.request()

    def wait_for_solve(self, timeout_s: float | None = None) -> None:
        """On rank 0, while an attempt is solving, block until the solve has finished (done, kept or failed; at most
        `timeout_s`, default `solve_timeout_s`); no-op elsewhere. The other ranks then wait in the next step's first
        collective, so decode pauses for the solve, as a synchronous rebalance would: for a worker whose steps are
        far shorter than a solve and that wants the switch a known number of steps after the start (tests, demos
        of tiny models), never for serving."""
        if self.comm.rank != 0 or self.phase != Phase.SOLVING:
            return
        end = time.monotonic() + (self.config.solve_timeout_s if timeout_s is None else timeout_s)
        while self.solver.status()[0] == SolveStatus.RUNNING and time.monotonic() < end:
            time.sleep(0.005)

    def _received_G(self) -> np.ndarray | None:
        """[G, len(Field)] what every rank sent with the last step (None before the first step or after a
        regroup)."""
        received = self.layers[0].piggyback_received
        self.layers[0].piggyback_received = None
        return None if received is None else received.cpu().numpy()

    def load(self, placement: Placement | str, step: int) -> None:
        """Swap in a placement from a file (or object) the same way as a solved one: planned in the background
        (rank 0's copy), moved in chunks over the next steps, switched when every rank agrees. Call on every rank
        at the same step.

        Raises:
            PlacementFormatError: the placement is for another shape (layers, experts, GPUs, slots); nothing
                changes then.
            RuntimeError: a rebalance is already under way, or a burst patch is moving (a patch still solving is
                dropped).
        """
        target = placement if isinstance(placement, Placement) else load_placement(placement)
        check_loadable(target, self.placement, self.layers, self.comm.world_size)
        if self.in_progress and self.phase == Phase.SOLVING and self.run.attempt.patch:
            self.run.attempt = None  # its answer, when it comes, is about an older attempt and ignored
        if self.in_progress:
            raise RuntimeError("a rebalance is under way; load a placement when `in_progress` is False")
        self.stats.attempts += 1
        self.solver.submit(None, self.placement, target)
        self.run.attempt = Attempt(fit_step=step)

    def _maybe_start(self, step: int) -> tuple[bool, bool]:
        """Start a refit if one is due (interval, a request, or drift seen by any rank), replacing a patch still
        solving, else a burst patch if one is due and nothing is under way; return (this rank's drift flag for this
        step's message, whether an attempt started)."""
        if self.refits.due and self.recorder.steps_recorded > 0:
            self._start_refit(step)
            return False, True
        patch_due = self.patches is not None and self.patches.clock.due
        started = patch_due and self.run.attempt is None and self.recorder.steps_recorded > 0
        if started:
            self.patches.clock.started()
            self.stats.attempts += 1
            self.patches.submit(self.solver, None, self.placement)
            self.run.attempt = Attempt(fit_step=step, patch=True)
        return self.drift.check(self.refits.steps_since_attempt), started

    def _start_refit(self, step: int) -> None:
        """Start a refit attempt on the recorder's window (rank 0 solves in the background)."""
        self.refits.started()
        window_TLE = self.recorder.counts_TLE()
        if self.recorder.scope == "rank":  # this rank's tokens: all-reduce (a collective, on every rank)
            window_TLE = self.comm.all_reduce_sum(window_TLE)
        self.stats.attempts += 1
        if self.comm.rank == 0:
            self.solver.submit(self._fit_window(window_TLE.cpu().numpy()), self.placement)
        self.run.attempt = Attempt(fit_step=step)

    def _fit_window(self, window_TLE: np.ndarray) -> np.ndarray:
        """What rank 0 fits: the recorded window, or with `forecast="trend"` the window moved to the steps its
        placement will serve, from the last measured lag (0 before the first switch) for one interval."""
        if self.config.forecast == "none":
            return window_TLE
        lag = self.stats.lag_steps[-1] if self.stats.lag_steps else 0
        return hedged_window(window_TLE, lag, self.config.interval)

    def recover(self, step: int, max_attempts: int | None = None) -> RecoveryReport:
        """After a `CollectiveError` on this rank (a peer died): agree with the other survivors on who is left,
        re-form the group and serve a placement for it (`recovery`); the worker recomputes from `resume_step`.
        Every survivor calls it; a rank the others took for dead gets a `CollectiveError` and must leave.

        Raises:
            CollectiveError: this rank was left out, or recovery failed `max_attempts` times (default: once per
                member), or an expert had every copy on the lost ranks.
        """
        return agree_and_regroup(self.comm, self.config, lambda survivors: self._regroup(survivors, step),
                                 max_attempts)

    def mark_failed(self, original_rank: int, step: int) -> RecoveryReport | None:
        """Drain rank `original_rank` on purpose, as if it had died: call on every rank at the same step. The
        drained rank leaves the group and gets None (its sequences go elsewhere); the others get the recovery."""
        if original_rank not in self.comm.members:
            raise ValueError(f"rank {original_rank} is not in the group {self.comm.members}")
        if original_rank == self.comm.original_rank:
            self.close()
            self.comm.leave()
            return None
        return self._regroup([m for m in self.comm.members if m != original_rank], step)

    def _regroup(self, survivors: list[int], step: int) -> RecoveryReport:
        """Drop any attempt, re-form the group of `survivors` (original ranks) and, when ranks were lost, serve the
        survivors' placement (`GroupRecovery.regroup`); the next step then starts a rebalance for the smaller
        group."""
        began = time.perf_counter()
        if self.in_progress:
            broken = "a weight transfer failed, " if not self.run.attempt.transfers_ok else ""
            self.run.fail(f"{broken}the group is re-forming")
        report, target = self.recovery.regroup(survivors, step, self.placement, self.placement_members, began)
        if target is not None:
            self.run.placement, self.placement_members = target, list(survivors)
            if self.patches is not None:
                self.patches.regrouped(target)
            self.drift.restart()
            self.refits.request()
        return report

    def close(self) -> None:
        """Stop the heartbeat and the solver (at the end of serving)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self.solver.close()


def _start_heartbeat(comm: Communicator, config: RebalanceConfig) -> Heartbeat | None:
    """This rank's heartbeat in the rendezvous store, which the survivors' agreement reads (None: no store, or
    a group of one)."""
    if comm.store is None or comm.world_size == 1:
        return None
    return Heartbeat(f"{comm.store.host}:{comm.store.port}", comm.original_rank, config.heartbeat_interval_s)
