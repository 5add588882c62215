"""Surviving a dead rank: the survivors agree on who is left, re-form the group, and serve at once a placement for
themselves, restoring from host copies the experts that lived only on the dead ranks.

Legend: L layers, E experts, G GPUs of the placement before, G' after; S slots per GPU before, S' after.

A rank that dies surfaces on the others as a `CollectiveError` from a decode or rebalance collective. The worker
then calls `Rebalancer.recover(step)` on every survivor: the survivors agree on who is left (heartbeats in the
rendezvous store, `collectives.membership`; `agree_and_regroup` retries when another rank dies meanwhile),
re-form the group, and `GroupRecovery` installs the survivors' placement (`survivor_placement`): the dead
ranks' share of replicated experts goes to the surviving replicas, and experts that lived only on dead ranks come
back from a survivor's host copy (every expert has copies on `failures_tolerated` + 1 ranks, `host_copies`). The
worker recomputes the step in flight (`RecoveryReport.resume_step`) and the next rebalance, at once, fits the
smaller group. `Rebalancer.mark_failed(rank)` drains a rank the same way on purpose.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from collectives import CollectiveError, Communicator
from collectives.membership import agree_on_survivors
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.live.replica_assignment import ReplicaTables
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.host_copies import HostCopies
from eplb.rebalance.stats import RebalanceStats
from eplb.rebalance.survivor_placement import placement_without, survivor_fills
from eplb.rebalance.transfer import WeightMover, tag_base
from placement import Placement

logger = logging.getLogger(__name__)

MIN_RECOVERY_BYTES_PER_ROUND = 1 << 30  # no decode step runs during a recovery: its rounds may be large


@dataclass(frozen=True)
class RecoveryReport:
    """The outcome of a recovery: the original ranks lost, the step to recompute from, how long it took, and how
    many experts had every copy in a slot on the lost ranks (restored from host copies)."""

    lost_ranks: list[int]
    resume_step: int
    seconds: float
    restored_experts: int

    def as_dict(self) -> dict:
        """The report as the rebalancer's stats keep it."""
        return asdict(self)


def agree_and_regroup(comm: Communicator, config: RebalanceConfig, regroup: Callable[[list[int]], RecoveryReport],
                      max_attempts: int | None = None) -> RecoveryReport:
    """Agree with the other survivors on who is left, then `regroup(survivors)` (original ranks); again from the
    agreement when that fails (another rank died meanwhile), up to `max_attempts` times (default: once per member).

    Raises:
        CollectiveError: this rank was left out, or every attempt failed.
    """
    attempts = max_attempts or len(comm.members)
    for attempt in range(attempts):
        try:
            survivors = agree_on_survivors(comm.store, comm.generation, comm.members, comm.original_rank,
                                           config.heartbeat_timeout_s,
                                           wait_s=config.heartbeat_timeout_s + 2 * comm.timeout_s)
            return regroup(survivors)
        except CollectiveError as exc:
            if "left out" in str(exc) or attempt == attempts - 1:
                raise
            logger.warning("recovery attempt %d failed (%s); agreeing again", attempt + 1, exc)
    raise AssertionError("unreachable")


class GroupRecovery:
    """Re-forms this rank's group and serves the survivors' placement (the rebalancer's side of a recovery).

    Args:
        config: the rebalancer's settings (`max_bytes_per_step`; the heartbeat timeout for the agreement).
        comm: the group's communicator.
        layers: this rank's MoE layers.
        recorder: the load recorder (its window chooses what the survivors replicate).
        mover: moves the weights (`transfer.WeightMover`).
        host_copies: this rank's host copies (`host_copies.HostCopies`), the source of experts lost from every slot.
        stats: the rebalancer's; the bytes received and each recovery are recorded there.
    """

    def __init__(self, config: RebalanceConfig, comm: Communicator, layers: list[MoEDecodeLayer],
                 recorder: LoadRecorder, mover: WeightMover, host_copies: HostCopies, stats: RebalanceStats) -> None:
        self.config, self.comm, self.layers, self.recorder = config, comm, layers, recorder
        self.mover, self.host_copies, self.stats = mover, host_copies, stats

    def regroup(self, survivors: list[int], step: int, placement: Placement, members: list[int],
                began: float, host_copies_built: bool = True) -> tuple[RecoveryReport, Placement | None]:
        """Re-form the group of `survivors` (original ranks) from `placement`, whose GPU g was original rank
        `members[g]`, and, when ranks were lost, install the survivors' placement (collective); returns the report
        (`began`: `time.perf_counter()` at the start) and the placement now serving (None: unchanged).
        `host_copies_built=False`: no rank holds host copies yet (a death during start-up); the survivors'
        placement is filled from their slots alone."""
        comm = self.comm
        comm.regroup(survivors)
        resume = comm.min_over_ranks(step)
        lost = [gpu for gpu, member in enumerate(members) if member not in survivors]
        kept = [gpu for gpu, member in enumerate(members) if member in survivors]  # old GPU of each new rank
        target, restored = None, 0
        if lost:  # else every rank lives (a transfer broke a connection, say): the same placement serves on
            target, restored = self._restore(placement, lost, kept, self._load_LE(), host_copies_built)
        self.layers[0].piggyback = self.layers[0].piggyback_received = None  # messages of the old group
        self.recorder.discard_current_step()
        report = RecoveryReport([members[gpu] for gpu in lost], resume, time.perf_counter() - began, restored)
        self.stats.recoveries.append(report.as_dict())
        if lost:
            logger.warning("recovered without ranks %s: %d survivors serve from step %d (%.2f s)", report.lost_ranks,
                           len(survivors), resume, report.seconds)
        else:
            logger.warning("re-formed the group with every rank; the placement is unchanged")
        return report, target

    def start_without_the_lost(self, placement: Placement, members: list[int]) -> tuple[list[int], Placement | None]:
        """After a `CollectiveError` while the group started (a peer died building the host copies): agree with
        the other survivors on who is left, drop the half-built host copies, and serve the survivors' placement
        filled from their slots, its host copies built anew; with every rank alive (a connection broke), build the
        host copies again. Returns (the survivors, the placement now serving or None: unchanged); the report is the
        first of `stats.recoveries`.

        Raises:
            CollectiveError: this rank was left out, or an expert lived only on the lost ranks (no host copy of it
                existed yet): the group cannot serve without them and must be restarted; nothing was served.
        """
        began = time.perf_counter()
        outcome: list = []

        def regroup(survivors: list[int]) -> RecoveryReport:
            self.host_copies.copies_L = [{} for _ in self.layers]
            report, target = self.regroup(survivors, 0, placement, members, began, host_copies_built=False)
            if target is None:
                self.host_copies.build(placement, self.mover, self.config.max_bytes_per_step, self.stats)
            self.comm.barrier()
            outcome[:] = [list(survivors), target]
            return report

        agree_and_regroup(self.comm, self.config, regroup)
        return outcome[0], outcome[1]

    def _load_LE(self) -> np.ndarray:
        """[L, E] the window's load, the same on every survivor (collective): all-reduced when each rank records its
        own tokens, else rank 0's copy of the group's counts (a survivor may have finished the step in flight where
        another did not)."""
        comm, load_LE = self.comm, self.recorder.window_load_LE()
        load_LE = comm.all_reduce_sum(load_LE) if self.recorder.scope == "rank" else comm.broadcast(load_LE, 0)
        return load_LE.cpu().numpy()

    def _restore(self, old: Placement, lost: list[int], kept: list[int], load_LE: np.ndarray,
                 host_copies_built: bool = True) -> tuple[Placement, int]:
        """Move the weights the survivors' placement needs and install it on every layer (collective, on the
        re-formed group); returns the placement now serving and the count of experts restored from host copies.

        Args:
            old: the placement serving before, on G GPUs.
            lost: its GPUs that are gone.
            kept: its GPU of each rank of the new group, in order.
            load_LE: [L, E] the window's load, to choose what to replicate.

        Raises:
            CollectiveError: an expert had every copy on the lost ranks, or a transfer failed (another death):
                nothing is installed, and every survivor agrees again from `old`.
        """
        comm, mover, host_copies = self.comm, self.mover, self.host_copies
        target = placement_without(old, lost, load_LE)
        try:
            fills, restored = survivor_fills(old, target, lost, kept, host_copies.failures_tolerated,
                                             host_copies_built)
        except LookupError as exc:
            if not host_copies_built:
                raise CollectiveError(f"cannot start without the lost ranks: {exc}: they died before the host "
                                      f"copies of their experts were built; restart the group") from exc
            raise CollectiveError(f"cannot recover: {exc}: {len(lost)} ranks were lost at once, with "
                                  f"failures_tolerated={host_copies.failures_tolerated} (raise it to keep more host "
                                  "copies)") from exc
        staging = mover.staging_for(fills)
        budget = max(self.config.max_bytes_per_step, MIN_RECOVERY_BYTES_PER_ROUND)
        mover.run_all(fills, staging, budget, tag_base(comm.generation, 0), self.stats)
        # Commit only when every survivor's transfers succeeded: a rank whose transfer failed (another death) never
        # reaches this agreement, so the others' fails too, and every survivor agrees again from the old placement.
        comm.min_over_ranks(1)
        # Commit: copy the staged experts into the slots (grown when the survivors need more slots each).
        old_slots, new_slots = old.cluster.slots_per_gpu, target.cluster.slots_per_gpu
        for index, layer in enumerate(self.layers):
            weights = layer.slot_experts
            if new_slots != old_slots:
                weights = mover.grown(index, weights, new_slots)
            mover.copy_staged_slots(index, weights, staging)
            layer.install(target, ReplicaTables.build(target, index, comm.device), weights)
            host_copies.keep(index, host_copies.wanted(target, index), staging)
        return target, restored
