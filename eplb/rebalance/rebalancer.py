"""Rebalancing a running EP group between decode steps, and surviving a rank that dies.

Legend: L layers, E experts, G ranks (one GPU each), S slots per rank, P = G x S, T steps in the recorder's window.

The worker calls `Rebalancer.step(step)` on every rank before each decode step. It never waits on a solve or a
transfer, and its agreements cost no collective: each step every rank sends a seven-number message with its expert
counts in the first layer's all-gather (which the layer runs anyway), and at the next step every rank reads the
same messages and takes the same decision. Over the steps:

1. idle: every `interval` steps (or at once when some rank saw the imbalance drift), take the group's window
   [T, L, E] (all-reduced, unless the recorder keeps the group's counts) and start the policy on rank 0 in the
   background (`BackgroundSolver`: a helper process at a low CPU priority, or a thread; no collective runs there:
   every collective stays on the worker's thread, in step order); `load(file)` starts the same way with a given
   placement;
2. solving: rank 0's message says whether the solve is running, failed or done, and the size of its answer; a
   fit that beats the placement serving by less than `min_gain` on the window ends the attempt there (nothing is
   worth moving); when done, rank 0 broadcasts, in one collective, the placement relabelled to move the fewest experts
   (`plan_migration`) and the weight moves planned beside the solve (`move_plan.plan_rebalance`: moved slots
   into staging buffers, and the host copies the new placement needs, in rounds); each rank keeps its part;
3. moving: one round of chunks per step (no rank sends or receives more than `max_bytes_per_step`), posted before
   the decode step and completed before the next (it moves while the step runs), and one layer's routing tables
   built; each rank's message says whether its transfers succeeded;
4. switch: the step after the last round, if every rank's transfers succeeded and every rank accepts, each copies
   the staged experts into the slots and installs the new tables on every layer, between two steps: a step runs
   wholly on the old or the new placement.
A failure or timeout anywhere (solve, transfer, a refusal) drops the staged state on every rank at the same step,
leaves the old placement serving, is logged once, and the next attempt comes at the next interval.

A rank that dies surfaces on the others as a `CollectiveError` from a decode or rebalance collective. The worker
then calls `recover(step)`: the survivors agree on who is left (heartbeats in the rendezvous store,
`collectives.membership`), re-form the group, and serve at once a placement for the survivors
(`survivor_placement`): experts that lived only on dead ranks come back from a survivor's host copy (every expert
has copies on `failures_tolerated` + 1 ranks, so any that many ranks may die at once), the dead ranks' share of
replicated experts goes to the surviving replicas; the step in flight is recomputed by
the worker (`RecoveryReport.resume_step`), and the next rebalance, at once, fits the smaller group.
`mark_failed(rank)` drains a rank the same way on purpose.
"""

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from collectives import CollectiveError, Communicator
from collectives.membership import Heartbeat, agree_on_survivors
from eplb.rebalance.background_solver import BackgroundSolver, PolicyFn, SolveResult
from eplb.live.experts import ExpertWeights
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_layer import MoEDecodeLayer, check_placement_fits
from eplb.rebalance.move_plan import (Chunk, Fill, TransferShape, backup_wanted, decode_for_rank, holders_of, plan_fills,
                                 schedule_chunks)
from eplb.rebalance.config import RebalanceConfig
from eplb.live.replica_assignment import ReplicaTables
from eplb.rebalance.solve_answer import pack_answer, packed_size, unpack_answer
from eplb.rebalance.survivor_placement import placement_without, survivor_fills
from eplb.rebalance.weight_moves import matrix_of, start_round
from placement import Placement, PlacementFormatError, load_placement
from placement.replay import drifted_steps

logger = logging.getLogger(__name__)

@dataclass
class RebalanceStats:
    """What the rebalancer did on this rank."""

    rebalances: int = 0
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    bytes_received: int = 0  # weights received for rebalances and recoveries
    backup_bytes_at_start: int = 0  # weights received to build the host copies at start
    switch_steps: list[int] = field(default_factory=list)
    lag_steps: list[int] = field(default_factory=list)  # from the end of the fit window to the switch
    lag_seconds: list[float] = field(default_factory=list)
    kept: int = 0  # attempts whose fit gained less than min_gain: the placement serving kept serving
    expert_moves: list[int] = field(default_factory=list)  # per switch: slots filled from another slot or rank
    oblivious_moves: list[int] = field(default_factory=list)  # per switch: slots a slot-by-slot remap would fill
    recoveries: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class RecoveryReport:
    """The outcome of a recovery: the original ranks lost, the step to recompute from, how long it took."""

    lost_ranks: list[int]
    resume_step: int
    seconds: float
    restored_experts: int


class Rebalancer:
    """Rebalances one rank's MoE layers with its peers; see the module docstring for the protocol.

    Constructed on every rank of the group at the same point (it builds the host copies collectively).

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
        if len(layers) != placement.num_layers or recorder.num_layers != placement.num_layers:
            raise ValueError(f"layers ({len(layers)}) and recorder.num_layers ({recorder.num_layers}) must match the "
                             f"placement's {placement.num_layers} layers")
        first = layers[0].config
        row_bytes = max(first.hidden_size, first.intermediate_size) * layers[0].slot_experts.gate_ADF.element_size()
        if config.max_bytes_per_step < row_bytes:
            raise ValueError(f"max_bytes_per_step={config.max_bytes_per_step} is below one row of an expert's "
                             f"weights ({row_bytes} bytes); raise it")
        if config.transfer_timeout_s >= comm.timeout_s:
            raise ValueError(f"transfer_timeout_s={config.transfer_timeout_s:g} must be below the communicator's "
                             f"timeout_s={comm.timeout_s:g}, so that the agreement after a transfer outlasts it")
        self.config, self.comm, self.layers, self.recorder = config, comm, layers, recorder
        self.placement = placement
        self.placement_members = list(comm.members)  # original rank of each GPU of the placement
        self.failures_tolerated = config.failures_tolerated_for(comm.world_size)
        if config.failures_tolerated is not None and comm.world_size > 1 and \
                config.failures_tolerated >= comm.world_size:
            raise ValueError(f"failures_tolerated={config.failures_tolerated} must be below the group's "
                             f"{comm.world_size} ranks (someone must survive); lower it")
        self.policy_fn = policy_fn
        self.stats = RebalanceStats()
        self.backup: list[dict[int, ExpertWeights]] = [{} for _ in layers]
        self._state = "idle"
        self._steps_since_attempt = 0
        self._due_now = False
        self._imbalance: list[float] = []  # planned imbalance of each step served since the last switch
        self._fitted_imbalance: float | None = None  # the serving placement's fitted level, when known
        self._solve: dict = {}
        self._solver: BackgroundSolver | None = None
        if comm.rank == 0:
            # Start the helper process now and let its imports finish before decode starts (the other ranks wait
            # for this rank in the collectives below: at most half their timeout), not beside the first steps.
            self._solver_here().wait_ready(comm.timeout_s / 2)
        self._heartbeat = None
        if comm.store is not None and comm.world_size > 1:
            self._heartbeat = Heartbeat(f"{comm.store.host}:{comm.store.port}", comm.original_rank,
                                        config.heartbeat_interval_s)
        self._sync_backups()
        self.stats.backup_bytes_at_start, self.stats.bytes_received = self.stats.bytes_received, 0
        comm.barrier()  # every rank leaves here together, so no rank's first decode step waits on the start-up

    # ----- the per-step entry point -----

    @property
    def phase(self) -> str:
        """"idle", "solving" (waiting on the background solve) or "moving" (weights in flight, then the switch)."""
        return self._state

    @property
    def transfer_in_flight(self) -> bool:
        """True while a round of a rebalance's weights is posted and not yet completed (it moves during the decode
        step that follows `step`)."""
        return self._solve.get("in_flight") is not None

    @property
    def in_progress(self) -> bool:
        """True while a rebalance is under way (solving, moving or about to switch)."""
        return self._state != "idle"

    def step(self, step: int, accept_switch: bool = True) -> None:
        """Do this step's share of rebalancing; call on every rank before decode step `step`.

        `accept_switch=False` on any rank refuses a switch that would come at the next step: the old placement keeps
        serving everywhere and the next attempt comes at the next interval. A `CollectiveError` escaping here means
        a peer died: call `recover`.
        """
        self._note_imbalance()
        received = self._received()
        drifted = 0
        if self._state == "idle":
            drifted = self._maybe_start(step, received)
        elif self._state == "solving":
            self._poll_solve(received)
        elif self._state == "moving":
            self._move_round(step, received)
        self._send(*self._solve_status(), ok=int(self._solve.get("ok", True)), accept=int(accept_switch),
                   drifted=drifted)

    # Each step every rank sends [attempt, solve status (rank 0), transfers ok, accepts a switch, drifted, fills and
    # chunks in rank 0's answer] along with its counts in the first layer's all-gather; the next step every rank
    # reads the same [W, 7] and decides.

    def _send(self, solve_status: int, answer_sizes: tuple[int, int], ok: int, accept: int, drifted: int) -> None:
        message = [self.stats.attempts, solve_status, ok, accept, drifted, *answer_sizes]
        self.layers[0].piggyback = torch.tensor(message, dtype=torch.int64)

    def _received(self) -> np.ndarray | None:
        """[W, 7] what every rank sent with the last step (None before the first step or after a regroup)."""
        received = self.layers[0].piggyback_received
        self.layers[0].piggyback_received = None
        return None if received is None else received.cpu().numpy()

    def _solve_status(self) -> tuple[int, tuple[int, int]]:
        """Rank 0's view of the background solve: 0 running (or none), 1 done, 2 failed, 3 done with nothing worth
        moving (the fit gained less than min_gain); and when done, the fills and chunks of its answer (what the
        others allocate for its broadcast)."""
        if self._state != "solving" or self.comm.rank != 0:
            return 0, (0, 0)
        job = self._solver_here().poll()
        if "error" in job:
            return 2, (0, 0)
        if "result" in job:
            if job["result"].kept:
                return 3, (0, 0)
            return 1, (len(job["result"].fills_N8), len(job["result"].chunks_C6))
        if time.monotonic() - job["started"] > self.config.solve_timeout_s:
            job["error"] = f"the solve ran past solve_timeout_s={self.config.solve_timeout_s:g}"
            return 2, (0, 0)
        return 0, (0, 0)

    def _solver_here(self) -> BackgroundSolver:
        """This rank's background solver (rank 0 solves; after a regroup rank 0 may be another process)."""
        if self._solver is None:
            options = {"time_limit_s": self.config.time_limit_s, "routing": self.config.routing,
                       "workers": self.config.solve_threads, "good_enough": self.config.good_enough}
            first = self.layers[0].config
            shape = TransferShape(first.hidden_size, first.intermediate_size,
                                  self.layers[0].slot_experts.gate_ADF.element_size(), self.config.max_bytes_per_step,
                                  self.failures_tolerated)
            self._solver = BackgroundSolver(self.config.solve_in, self.config.policy, options, shape, self.policy_fn,
                                            cpu_share=self.config.solve_cpu_share, min_gain=self.config.min_gain)
        return self._solver

    def load(self, placement: Placement | str, step: int) -> None:
        """Swap in a placement from a file (or object) the same way as a solved one: planned in the background
        (rank 0's copy), moved in chunks over the next steps, switched when every rank agrees. Call on every rank
        at the same step.

        Raises:
            PlacementFormatError: the placement is for another shape (layers, experts, GPUs, slots); nothing
                changes then.
            RuntimeError: a rebalance is already under way.
        """
        target = placement if isinstance(placement, Placement) else load_placement(placement)
        current = self.placement
        if (target.num_layers, target.num_experts, target.cluster.num_gpus, target.cluster.slots_per_gpu) != (
                current.num_layers, current.num_experts, current.cluster.num_gpus, current.cluster.slots_per_gpu):
            raise PlacementFormatError(
                f"the placement is for {target.num_layers} layers x {target.num_experts} experts on "
                f"{target.cluster.num_gpus} GPUs x {target.cluster.slots_per_gpu} slots; this group serves "
                f"{current.num_layers} x {current.num_experts} on {current.cluster.num_gpus} x "
                f"{current.cluster.slots_per_gpu}: place again for this group"
            )
        for index, layer in enumerate(self.layers):
            check_placement_fits(target, index, layer.config, self.comm.world_size)
        if self.in_progress:
            raise RuntimeError("a rebalance is under way; load a placement when `in_progress` is False")
        self.stats.attempts += 1
        if self.comm.rank == 0:
            self._solver_here().submit(None, current, target)
        self._solve = {"fit_step": step, "fit_time": time.perf_counter()}
        self._state = "solving"

    # ----- 1. start -----

    def _maybe_start(self, step: int, received: np.ndarray | None) -> int:
        """Start a rebalance if one is due (interval, or drift seen by any rank last step); return this rank's
        drift flag for this step's message."""
        config = self.config
        self._steps_since_attempt += 1
        due = self._due_now or self._steps_since_attempt >= config.interval
        due = due or (received is not None and bool(received[:, 4].any()))
        if due and self.recorder.steps_recorded > 0:
            self._due_now, self._steps_since_attempt = False, 0
            self.stats.attempts += 1
            window = self.recorder.counts_TLE()
            if self.recorder.scope == "rank":  # this rank's tokens: all-reduce (a collective, on every rank)
                window = self.comm.all_reduce_sum(window)
            if self.comm.rank == 0:
                self._solver_here().submit(window.cpu().numpy(), self.placement)
            self._solve = {"fit_step": step, "fit_time": time.perf_counter()}
            self._state = "solving"
            return 0
        checks = (config.refit_on_drift is not None and self._steps_since_attempt % config.drift_check_every == 0
                  and (self._fitted_imbalance is not None or len(self._imbalance) >= 2 * config.drift_steps))
        return int(checks and self._drifted())

    # ----- 2. solving -----

    def _poll_solve(self, received: np.ndarray | None) -> None:
        box, comm = self._solve, self.comm
        if received is None or received[0, 0] != self.stats.attempts:
            return  # rank 0's status for this attempt arrives with the next step
        status = int(received[0, 1])
        if status == 0:
            return
        job = self._solver_here().poll() if comm.rank == 0 else {}
        if status == 2:
            self._fail(f"the solve failed on rank 0: {job.get('error', 'see rank 0 log')}" if comm.rank == 0
                       else "the solve failed on rank 0")
            return
        if status == 3:
            self._keep(job.get("result"))
            return
        num_fills, num_chunks = int(received[0, 5]), int(received[0, 6])
        answer = comm.broadcast(torch.from_numpy(pack_answer(job["result"])) if comm.rank == 0
                                else torch.zeros(packed_size(self.placement, num_fills, num_chunks),
                                                 dtype=torch.int64, device=comm.device), 0).cpu().numpy()
        # Every rank holds the same bytes now, so every rank reaches the same verdict: no agreement needed.
        try:
            target, fitted, fills_N8, chunks_C6 = unpack_answer(answer, self.placement, num_fills, num_chunks,
                                                          self.config.policy)
        except PlacementFormatError as exc:
            self._fail(f"the solved placement is invalid: {exc}")
            return
        if comm.rank == 0:
            box["moves"] = job["result"].moves
        box["fitted_imbalance"] = fitted
        fills, rounds = decode_for_rank(fills_N8, chunks_C6, comm.rank)
        self._start_moving(target, fills, rounds)

    def _start_moving(self, target: Placement, fills: dict[int, Fill], rounds: list[list[Chunk]]) -> None:
        """Allocate the staging buffers of this rank's fills and go to moving."""
        staging = self._staging_for(list(fills.values()))
        self._solve.update(target=target, fills=fills, rounds=rounds, round=0, staging=staging, tables={},
                           backups={}, ok=True)
        self._state = "moving"

    # ----- 3. moving -----

    def _move_round(self, step: int, received: np.ndarray | None) -> None:
        box, comm = self._solve, self.comm
        current = received is not None and bool((received[:, 0] == self.stats.attempts).all())
        if current and not received[:, 2].all():
            self._fail("a weight transfer failed or timed out on rank(s) "
                       f"{[comm.members[r] for r in np.flatnonzero(received[:, 2] == 0).tolist()]}")
            return
        if current and box.get("reported_all"):
            # Every round moved and every rank said so with the last step: switch, if every rank accepts.
            self._switch(step, bool(received[:, 3].all()))
            return
        tables = [layer for layer in range(len(self.layers)) if layer not in box["tables"]]
        if tables:  # one layer's routing tables and host copies a step, so that the switch only installs them
            box["tables"][tables[0]] = ReplicaTables.build(box["target"], tables[0], comm.device)
            box["backups"][tables[0]] = self.backups_of(box["target"], tables[0])
        # The round posted before the last decode step has moved meanwhile: complete it, then post the next.
        if box.get("in_flight") is not None:
            in_flight, box["in_flight"] = box["in_flight"], None
            try:
                self.stats.bytes_received += in_flight.finish(self.config.transfer_timeout_s)
            except CollectiveError as exc:
                box["ok"] = False
                logger.warning("weight transfer failed on this rank: %s", exc)
        if box["round"] < len(box["rounds"]):
            box["in_flight"] = start_round(comm, box["rounds"][box["round"]], box["fills"], self._source,
                                           self._staged, tag_base=_tag_base(self.stats.attempts, box["round"]))
            box["round"] += 1
        box["reported_all"] = box.get("in_flight") is None and box["round"] >= len(box["rounds"]) and not tables[1:]

    def _source(self, fill: Fill, matrix: int) -> torch.Tensor:
        if fill.src_kind == "slot":
            return matrix_of(self.layers[fill.layer].slot_experts, matrix, fill.src_index)
        return matrix_of(self.backup[fill.layer][fill.src_index], matrix, 0)

    def _staged(self, fill: Fill, matrix: int) -> torch.Tensor:
        return matrix_of(self._solve["staging"][(fill.dst_kind, fill.layer, fill.dst_index)], matrix, 0)

    # ----- 4. switch -----

    def _switch(self, step: int, accept: bool) -> None:
        box, comm = self._solve, self.comm
        if not accept:
            self._fail("a rank refused the switch")
            return
        target: Placement = box["target"]
        for index, layer in enumerate(self.layers):
            self._copy_staged_slots(index, layer.slot_experts, box["staging"])
            layer.install(target, box["tables"][index])
            self._keep_backups(index, box["backups"][index], box["staging"])
        self.placement = target
        self._fitted_imbalance = box.get("fitted_imbalance")
        self.stats.rebalances += 1
        self.stats.switch_steps.append(step)
        self.stats.lag_steps.append(step - box["fit_step"])
        self.stats.lag_seconds.append(time.perf_counter() - box["fit_time"])
        if box.get("moves"):  # known on rank 0 (and on every rank for a loaded placement)
            self.stats.expert_moves.append(box["moves"][0])
            self.stats.oblivious_moves.append(box["moves"][1])
        self._imbalance.clear()
        self._solve, self._state = {}, "idle"
        logger.info("switched to the new placement at step %d (%d fills)", step, len(box["fills"]))

    def _keep(self, answer: SolveResult | None) -> None:
        """End the attempt with the placement serving unchanged (the fit gained less than min_gain; `answer` is
        rank 0's). The drift trigger's level is then measured again on the steps served from here, so that traffic
        no placement serves better does not start attempt after attempt."""
        self.stats.kept += 1
        if answer is not None:
            logger.info("kept the placement serving: a new fit would gain %s%.2f%% on the window (min_gain %.2f%%)",
                        "at most " if answer.fit_skipped else "", 100 * answer.gain, 100 * self.config.min_gain)
        self._fitted_imbalance = None
        self._imbalance.clear()
        self._solve, self._state, self._steps_since_attempt = {}, "idle", 0

    def _fail(self, reason: str) -> None:
        """Drop the attempt: the old placement keeps serving; try again at the next interval."""
        self.stats.failures.append(reason)
        logger.warning("rebalance abandoned, the current placement keeps serving: %s", reason)
        self._solve, self._state, self._steps_since_attempt = {}, "idle", 0

    # ----- drift -----

    def _note_imbalance(self) -> None:
        """Append the last step's planned imbalance (mean over layers; one host read), keeping the first and the
        last `drift_steps` steps since the switch, which the drift check compares."""
        if self.config.refit_on_drift is None or "quota_P" not in self.layers[0].last_step:
            return
        per_layer = []
        for layer in self.layers:
            gpu_tokens = layer.last_step["quota_P"].view(-1, layer.slots_per_gpu).sum(1).double()
            per_layer.append(gpu_tokens.max() / gpu_tokens.mean().clamp_min(1e-9))
        self._imbalance.append(float(torch.stack(per_layer).mean()))
        span, keep = self.config.drift_steps, max(self.config.drift_steps, self.config.drift_check_every)
        if len(self._imbalance) > span + 2 * keep:
            del self._imbalance[span:-keep]

    def _drifted(self) -> bool:
        """The replay's refit-on-drift rule (`placement.replay.drifted_steps`) on the steps served since the last
        check: a step more imbalanced than `refit_on_drift` x the placement's fitted imbalance. A placement with no
        fitted level (the one at start, or one loaded from a file) is measured against its first `drift_steps`
        served steps instead."""
        level = self._fitted_imbalance
        if level is None:
            level = float(np.mean(self._imbalance[: self.config.drift_steps]))
        recent = self._imbalance[-self.config.drift_check_every:]
        return bool(drifted_steps(np.array(recent), level, self.config.refit_on_drift).any())

    # ----- host copies -----

    def _sync_backups(self) -> None:
        """Fill this rank's host copies for the placement serving now (collective, at start)."""
        shape = (self.placement.cluster.num_gpus, self.placement.cluster.slots_per_gpu)
        fills, sends = [], {}
        for layer in range(self.placement.num_layers):
            experts_GS = self.placement.phy2log_LP[layer].reshape(shape)
            wanted = [(gpu, "backup", expert, expert)
                      for gpu, expert in backup_wanted(experts_GS, self.failures_tolerated)]
            fills += plan_fills(layer, wanted, holders_of(experts_GS, None), sends)
        staging = self._staging_for(fills)
        self._solve = {"staging": staging}
        self._run_all(fills, self.config.max_bytes_per_step, tag_base=_tag_base(0, 0))
        for (_, layer, expert), weights in staging.items():
            self.backup[layer][expert] = weights
        self._solve = {}

    def _run_all(self, fills: list[Fill], budget: int, tag_base: int) -> None:
        config = self.layers[0].config
        rounds = schedule_chunks(fills, config.hidden_size, config.intermediate_size,
                                 self.layers[0].slot_experts.gate_ADF.element_size(), budget)
        for index, chunks in enumerate(rounds):
            self.stats.bytes_received += start_round(self.comm, chunks, fills, self._source, self._staged,
                                                     tag_base=tag_base + index * 10_000).finish()

    def _staging_for(self, fills: list[Fill]) -> dict[tuple[str, int, int], ExpertWeights]:
        """Empty buffers for this rank's fills: (kind, layer, index) -> one expert, slots on the device, host copies
        in host memory."""
        return {(fill.dst_kind, fill.layer, fill.dst_index):
                self._empty(fill.layer, 1, self.comm.device if fill.dst_kind == "slot" else "cpu")
                for fill in fills if fill.dst_rank == self.comm.rank}

    def _copy_staged_slots(self, layer: int, weights: ExpertWeights, staging: dict) -> None:
        """Copy the staged experts of `layer` into their slots of `weights` (between two steps)."""
        for (kind, staged_layer, slot), staged in staging.items():
            if kind == "slot" and staged_layer == layer:
                for matrix, stack in enumerate(_stacks(weights)):
                    stack[slot].copy_(matrix_of(staged, matrix, 0))

    def backups_of(self, placement: Placement, layer: int) -> list[int]:
        """The experts of `layer` this rank keeps host copies of under `placement` (`backup_wanted`)."""
        experts_GS = placement.phy2log_LP[layer].reshape(placement.cluster.num_gpus, placement.cluster.slots_per_gpu)
        return [expert for rank, expert in backup_wanted(experts_GS, self.failures_tolerated)
                if rank == self.comm.rank]

    def _keep_backups(self, layer: int, experts: list[int], staging: dict) -> None:
        """This rank's host copies of `layer`: those of `experts`, staged ones, else kept ones."""
        self.backup[layer] = {expert: staging.get(("backup", layer, expert)) or self.backup[layer][expert]
                              for expert in experts}

    @property
    def host_copy_bytes(self) -> int:
        """Bytes of expert weights this rank keeps in host memory for its peers' failures."""
        return sum(stack.nbytes for copies in self.backup for weights in copies.values() for stack in _stacks(weights))

    def _empty(self, layer: int, count: int, device) -> ExpertWeights:
        weights = self.layers[layer].slot_experts
        _, hidden, inner = weights.gate_ADF.shape
        return ExpertWeights.empty(count, hidden, inner, weights.gate_ADF.dtype, device)

    # ----- failures -----

    def recover(self, step: int, max_attempts: int | None = None) -> RecoveryReport:
        """After a `CollectiveError` on this rank (a peer died): agree with the other survivors on who is left,
        re-form the group and serve a placement for it; the worker recomputes from `resume_step`. Every survivor
        calls it; a rank the others took for dead gets a `CollectiveError` and must leave.

        Raises:
            CollectiveError: this rank was left out, or recovery failed `max_attempts` times (default: once per
                member), or an expert had every copy on the lost ranks.
        """
        attempts = max_attempts or len(self.comm.members)
        for attempt in range(attempts):
            try:
                survivors = agree_on_survivors(
                    self.comm.store, self.comm.generation, self.comm.members, self.comm.original_rank,
                    self.config.heartbeat_timeout_s, wait_s=self.config.heartbeat_timeout_s + 2 * self.comm.timeout_s)
                return self._regroup_and_restore(survivors, step)
            except CollectiveError as exc:
                if "left out" in str(exc) or attempt == attempts - 1:
                    raise
                logger.warning("recovery attempt %d failed (%s); agreeing again", attempt + 1, exc)
        raise AssertionError("unreachable")

    def mark_failed(self, original_rank: int, step: int) -> RecoveryReport | None:
        """Drain rank `original_rank` on purpose, as if it had died: call on every rank at the same step. The
        drained rank leaves the group and gets None (its sequences go elsewhere); the others get the recovery."""
        if original_rank not in self.comm.members:
            raise ValueError(f"rank {original_rank} is not in the group {self.comm.members}")
        if original_rank == self.comm.original_rank:
            self.close()
            self.comm.leave()
            return None
        return self._regroup_and_restore([m for m in self.comm.members if m != original_rank], step)

    def _regroup_and_restore(self, survivors: list[int], step: int) -> RecoveryReport:
        began = time.perf_counter()
        if self.in_progress:
            broken = "a weight transfer failed, " if not self._solve.get("ok", True) else ""
            self._fail(f"{broken}the group is re-forming")
        comm, old = self.comm, self.placement
        old_members = list(self.placement_members)
        comm.regroup(survivors)
        resume = comm.min_over_ranks(step)
        lost = [gpu for gpu, member in enumerate(old_members) if member not in survivors]
        kept = [gpu for gpu, member in enumerate(old_members) if member in survivors]  # old GPU of each new rank
        if not lost:  # every rank lives (a transfer broke a connection, say): the same placement serves on
            self.layers[0].piggyback = self.layers[0].piggyback_received = None
            self.recorder.discard_current_step()
            report = RecoveryReport([], resume, time.perf_counter() - began, 0)
            self.stats.recoveries.append({"lost_ranks": [], "resume_step": resume, "seconds": report.seconds,
                                          "restored_experts": 0})
            logger.warning("re-formed the group with every rank; the placement is unchanged")
            return report
        # The same load on every survivor (collective): all-reduced, or rank 0's copy of the group's counts (a
        # survivor may have finished the step in flight where another did not).
        load_LE = self.recorder.window_load_LE()
        load = (comm.all_reduce_sum(load_LE) if self.recorder.scope == "rank" else comm.broadcast(load_LE, 0))
        load = load.cpu().numpy()
        target = placement_without(old, lost, load)
        old_shape = (old.cluster.num_gpus, old.cluster.slots_per_gpu)
        new_shape = (target.cluster.num_gpus, target.cluster.slots_per_gpu)
        try:
            fills, restored = survivor_fills(old, target, lost, kept, self.failures_tolerated)
        except LookupError as exc:
            raise CollectiveError(f"cannot recover: {exc}: {len(lost)} ranks were lost at once, with "
                                  f"failures_tolerated={self.failures_tolerated} (raise it to keep more host "
                                  "copies)") from exc
        staging = self._staging_for(fills)
        self._solve = {"staging": staging}
        self._run_all(fills, max(self.config.max_bytes_per_step, 1 << 30), tag_base=_tag_base(comm.generation, 0))
        # Commit only when every survivor's transfers succeeded: a rank whose transfer failed (another death) never
        # reaches this agreement, so the others' fails too, and every survivor agrees again from the old placement.
        comm.min_over_ranks(1)
        # Commit: every transfer succeeded on this rank; copy the staged experts into the slots (grown if needed).
        for index, layer in enumerate(self.layers):
            weights = layer.slot_experts
            if new_shape[1] != old_shape[1]:
                grown = self._empty(index, new_shape[1], comm.device)
                for old_stack, new_stack in zip(_stacks(weights), _stacks(grown)):
                    new_stack[: old_shape[1]].copy_(old_stack)
                weights = grown
            self._copy_staged_slots(index, weights, staging)
            layer.install(target, ReplicaTables.build(target, index, comm.device), weights)
            self._keep_backups(index, self.backups_of(target, index), staging)
        self.placement, self.placement_members = target, list(survivors)
        self._fitted_imbalance = None
        self.layers[0].piggyback = self.layers[0].piggyback_received = None  # messages of the old group
        self._solve = {}
        self.recorder.discard_current_step()
        self._imbalance.clear()
        self._due_now = True  # fit a placement for the smaller group at the next step
        report = RecoveryReport([old_members[gpu] for gpu in lost], resume, time.perf_counter() - began, restored)
        self.stats.recoveries.append({"lost_ranks": report.lost_ranks, "resume_step": resume,
                                      "seconds": report.seconds, "restored_experts": restored})
        logger.warning("recovered without ranks %s: %d survivors serve from step %d (%.2f s)", report.lost_ranks,
                       len(survivors), resume, report.seconds)
        return report

    def close(self) -> None:
        """Stop the heartbeat and the solver (at the end of serving)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._solver is not None:
            self._solver.close()


def _stacks(weights: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return weights.gate_ADF, weights.up_ADF, weights.down_AFD


def _tag_base(attempt: int, round_index: int) -> int:
    """Message tags of one round of one attempt, apart from every other round's (tags are 32-bit)."""
    return (attempt % 200) * 10_000_000 + (round_index % 1000) * 10_000
