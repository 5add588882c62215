"""A synthetic decode loop with a `Rebalancer`, for the live demo, the tests and the benchmark: shifting traffic,
rebalances while decoding, and ranks that die (SIGKILL) or are drained.

Legend: T steps, L layers, E experts, G ranks as first formed, N tokens, D hidden size.

Tokens belong to original ranks: step t's tokens are split over the W original ranks as in `synthetic_decode`, and
a rank serves its share; when a rank is lost, its sequences are re-queued to another unit (counted, never served
here) and the survivors serve theirs. Each rank records per step what it computed and how long the step took (the
rebalancer's work before the step included; making the step's inputs not), and at the end checks every step's
output against the dense layer and that each slot holds the weights of the expert the placement serving names.
"""

import os
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from collectives import CollectiveError, CollectiveTimeoutError, Communicator
from eplb.harness.dense_reference import dense_moe
from eplb.live.experts import ExpertWeights
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_config import MoELayerConfig
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.rebalancer import Rebalancer
from eplb.harness.synthetic_decode import DecodeSetup, model_weights, step_inputs_LND, tokens_per_rank
from placement import ClusterSpec, Placement, PlacementFormatError, fit_placement
from traces.synthetic import SyntheticConfig, generate_trace


@dataclass(frozen=True)
class Faults:
    """Faults to inject (original ranks and step indices).

    Attributes:
        kills: (rank, step): that rank's process is killed outright (SIGKILL) after the first layer of that step;
            several ranks may die at the same step.
        kills_while_moving: (rank, n): that rank is killed after the first layer of the n-th step (1: the first)
            that runs with a round of a rebalance's weights in flight (`Rebalancer.transfer_in_flight`).
        kill_in_answer_broadcast: this rank is killed as it enters the broadcast of a solve's answer (rank 0
            sends it; the others are waiting in the collective).
        kill_at_start: this rank is killed as the rebalancers start (the others are building the host copies).
        drains: (rank, step): every rank calls `mark_failed(rank)` before that step.
        refuse_switch_rank: this rank refuses every switch.
        failing_solve: the policy raises.
        stalled_transfer_rank: this rank's first weight transfer of a rebalance hangs past its timeout.
    """

    kills: tuple[tuple[int, int], ...] = ()
    kills_while_moving: tuple[tuple[int, int], ...] = ()
    kill_in_answer_broadcast: int | None = None
    kill_at_start: int | None = None
    drains: tuple[tuple[int, int], ...] = ()
    refuse_switch_rank: int | None = None
    failing_solve: bool = False
    stalled_transfer_rank: int | None = None


@dataclass
class LoopReport:
    """One rank's record of the loop (steps recomputed after a failure keep their last run)."""

    original_rank: int
    steps: dict[int, dict] = field(default_factory=dict)
    max_abs_err: float = 0.0
    requeued: int = 0
    recoveries: list[dict] = field(default_factory=list)
    drained: bool = False
    stats: dict = field(default_factory=dict)
    slots_match_placement: bool = False
    final_phy2log_LP: np.ndarray | None = None
    final_members: list[int] = field(default_factory=list)
    load_errors: list[str] = field(default_factory=list)
    host_copy_bytes: int = 0
    host_copies_match_placement: bool = False
    failures_tolerated: int = 1


def shifting_traffic_setup(world_size: int, steps: int, *, experts: int = 32, top_k: int = 4, tokens: int = 256,
                           hidden: int = 64, layers: int = 2, fit_steps: int = 30, slots: int | None = None,
                           routing: str = "dynamic", time_limit_s: float = 2.0, seed: int = 0,
                           shift_step: int | None = None) -> DecodeSetup:
    """The live demo's setup: skewed synthetic traffic whose expert mix changes at step `shift_step` of the run
    (default: a third of the way in; experts relabelled at random), and a `cpsat` placement fitted on the
    `fit_steps` steps before the run."""
    trace = generate_trace(SyntheticConfig(num_steps=fit_steps + steps, num_layers=layers, num_experts=experts,
                                           top_k=top_k, tokens_per_step=tokens, seed=seed))
    counts = trace.counts_TLE.copy()
    shift = fit_steps + (steps // 3 if shift_step is None else shift_step)
    counts[shift:] = counts[shift:][..., np.random.default_rng(seed + 1).permutation(experts)]
    cluster = ClusterSpec(num_gpus=world_size, slots_per_gpu=slots or experts // world_size + 2,
                          gpus_per_node=world_size)
    placement = fit_placement("cpsat", counts[:fit_steps], cluster, time_limit_s=time_limit_s,
                              routing="static" if routing == "static" else "dynamic", seed=seed)
    config = MoELayerConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_experts=experts, top_k=top_k)
    return DecodeSetup(config, placement, counts[fit_steps:] / (tokens * top_k), tokens, routing, seed)


def failing_policy(counts_TLE: np.ndarray, cluster: ClusterSpec) -> Placement:
    """A policy that always raises (fault injection)."""
    raise RuntimeError("injected solver failure")


def run_rebalancing_loop(comm: Communicator, setup: DecodeSetup, steps: int, config: RebalanceConfig,
                         faults: Faults = Faults(), loads: tuple[tuple[int, str], ...] = (),
                         recorder_scope: str = "group") -> LoopReport:
    """Run `steps` decode steps of every layer with a rebalancer on this rank; return what it measured.

    `loads`: (step, placement file): every rank calls `Rebalancer.load(file)` before that step (a refusal is
    recorded in the report's `load_errors`, and serving goes on). `recorder_scope`: the load recorder's (the
    group's counts: a rebalance starts without a collective; "rank": the window is all-reduced)."""
    rank = _start_rank(comm, setup, config, faults, recorder_scope)
    me, num_ranks = comm.original_rank, setup.placement.cluster.num_gpus  # tokens are split over the ranks started
    report = LoopReport(original_rank=me)
    for recovery in rank.rebalancer.stats.recoveries:  # a rank lost while the group started: served without it
        report.requeued += sum(tokens_per_rank(0, setup.tokens_per_step, num_ranks, setup.seed)[r]
                               for r in recovery["lost_ranks"])
        report.recoveries.append({**recovery, "at_start": True, "killed_at": _killed_at(comm)})
    kills = _Kills({step for r, step in faults.kills if r == me}, {n for r, n in faults.kills_while_moving if r == me})
    drains = {step: r for r, step in faults.drains}
    load_at = dict(loads)
    outputs_by_step: dict[int, list[torch.Tensor]] = {}  # checked against the dense layer after the run
    step = 0
    while step < steps:
        split = tokens_per_rank(step, setup.tokens_per_step, num_ranks, setup.seed)
        try:
            if step in drains and drains[step] in comm.members and not _drain(rank, report, drains[step], step, split):
                break
            if step in load_at:
                try:
                    rank.rebalancer.load(load_at.pop(step), step)
                except (PlacementFormatError, RuntimeError) as exc:
                    report.load_errors.append(str(exc))
            outputs, timing = _timed_step(rank, step, split, faults.refuse_switch_rank != me, kills)
        except CollectiveError:
            step = _recover(rank, report, num_ranks, step)
            continue
        outputs_by_step[step] = outputs
        report.steps[step] = _step_record(rank, timing)
        step += 1
    rank.rebalancer.close()
    report.max_abs_err = _max_err_vs_dense(setup, rank.gate, rank.experts, outputs_by_step, me, num_ranks)
    _finish_report(rank, report)
    return report


@dataclass
class _Rank:
    """What this rank runs the loop with."""

    comm: Communicator
    setup: DecodeSetup
    gate: torch.Tensor
    experts: list[ExpertWeights]
    recorder: LoadRecorder
    layers: list[MoEDecodeLayer]
    rebalancer: Rebalancer


@dataclass
class _Kills:
    """When this rank dies: at the steps `steps`, or at the n-th step run with weights in flight, n in `moving`."""

    steps: set[int]
    moving: set[int]
    steps_moving: int = 0

    def doomed(self, step: int, transfer_in_flight: bool) -> bool:
        """Whether this rank dies during `step` (counts the steps run with weights in flight)."""
        self.steps_moving += transfer_in_flight
        return step in self.steps or (transfer_in_flight and self.steps_moving in self.moving)


def _start_rank(comm: Communicator, setup: DecodeSetup, config: RebalanceConfig, faults: Faults,
                recorder_scope: str) -> _Rank:
    """This rank's model, layers, recorder and rebalancer, with the faults that act on the communicator."""
    gate, experts = model_weights(setup)
    gate, experts = gate.to(comm.device), [weights.to(comm.device) for weights in experts]
    num_layers = setup.placement.num_layers
    recorder = LoadRecorder(config.window, num_layers, setup.config.num_experts, comm.device, scope=recorder_scope)
    layers = [MoEDecodeLayer(setup.config, setup.placement, layer, comm, gate,
                             experts[layer].select(MoEDecodeLayer.slots_of_rank(setup.placement, layer, comm.rank)),
                             routing=setup.routing, recorder=recorder, compile_routing=setup.compile_routing)
              for layer in range(num_layers)]
    if faults.kill_at_start == comm.original_rank:
        _die(comm)
    rebalancer = Rebalancer(config, comm, layers, recorder, setup.placement,
                            policy_fn=failing_policy if faults.failing_solve else None)
    if faults.stalled_transfer_rank == comm.original_rank:
        _stall_transfers(comm, config.transfer_timeout_s)
    if faults.kill_in_answer_broadcast == comm.original_rank:
        _die_in_broadcast(comm)
    return _Rank(comm, setup, gate, experts, recorder, layers, rebalancer)


def _drain(rank: _Rank, report: LoopReport, drained: int, step: int, split: list[int]) -> bool:
    """Every rank drains original rank `drained` before `step`; False on the drained rank itself (it leaves)."""
    recovery = rank.rebalancer.mark_failed(drained, step)
    if recovery is None:
        report.drained = True
        return False
    report.requeued += split[drained]
    report.recoveries.append({"lost_ranks": recovery.lost_ranks, "resume_step": recovery.resume_step,
                              "seconds": recovery.seconds, "drained": True})
    return True


def _timed_step(rank: _Rank, step: int, split: list[int], accept_switch: bool,
                kills: _Kills) -> tuple[list[torch.Tensor], dict]:
    """The rebalancer's step and every layer's forward on this rank's tokens of `step`; the outputs [N, D] per
    layer and the step's timing and phases (the making of the inputs is not timed)."""
    comm, rebalancer, me = rank.comm, rank.rebalancer, rank.comm.original_rank
    start = sum(split[:me])
    mine_LND = step_inputs_LND(rank.setup, step)[:, start : start + split[me]].to(comm.device)
    began = time.perf_counter()
    busy_before, phase_before = rebalancer.in_progress, rebalancer.phase
    rebalancer.step(step, accept_switch=accept_switch)
    pause = time.perf_counter() - began
    doomed = kills.doomed(step, rebalancer.transfer_in_flight)
    outputs = []
    for index, layer in enumerate(rank.layers):
        outputs.append(layer(mine_LND[index]))
        if index == 0 and doomed:
            _die(comm)
    rank.recorder.next_step()
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)
    seconds = time.perf_counter() - began
    return outputs, {"seconds": seconds, "pause_seconds": pause, "phase_before": phase_before,
                     "busy_before": busy_before}


def _step_record(rank: _Rank, timing: dict) -> dict:
    """What the report keeps of a step served: its timing, the rebalancer's phases, and what each layer planned
    and computed."""
    rebalancer, layers = rank.rebalancer, rank.layers
    return {
        "seconds": timing["seconds"],
        "pause_seconds": timing["pause_seconds"],
        "phase": f"{timing['phase_before']}>{rebalancer.phase}",
        "rebalancing": timing["busy_before"] or rebalancer.in_progress,
        "world_size": rank.comm.world_size,
        "group_rank": rank.comm.rank,
        "computed_L": [int(layer.last_step["computed_S"].sum()) for layer in layers],
        "planned_gpu_LG": [layer.last_step["quota_P"].view(-1, layer.slots_per_gpu).sum(1).tolist()
                           for layer in layers],
        "counts_LE": [layer.last_step["counts_E"].tolist() for layer in layers],
        "completed_at": time.time(),
    }


def _recover(rank: _Rank, report: LoopReport, num_ranks: int, step: int) -> int:
    """After a `CollectiveError` during `step`: recover, count the lost ranks' tokens as re-queued; the step to
    resume from."""
    detected_at = time.time()
    recovery = rank.rebalancer.recover(step)
    lost_split = tokens_per_rank(recovery.resume_step, rank.setup.tokens_per_step, num_ranks, rank.setup.seed)
    report.requeued += sum(lost_split[r] for r in recovery.lost_ranks)
    report.recoveries.append({"lost_ranks": recovery.lost_ranks, "resume_step": recovery.resume_step,
                              "seconds": recovery.seconds, "detected_at": detected_at,
                              "killed_at": _killed_at(rank.comm), "restored_experts": recovery.restored_experts})
    return recovery.resume_step


def _finish_report(rank: _Rank, report: LoopReport) -> None:
    """The rebalancer's stats and host memory, and, on a rank still serving, whether each slot and host copy
    holds the expert the placement serving names, the placement and the members."""
    rebalancer, experts = rank.rebalancer, rank.experts
    report.stats = vars(rebalancer.stats)
    report.host_copy_bytes, report.failures_tolerated = rebalancer.host_copy_bytes, rebalancer.failures_tolerated
    if report.drained:
        return
    placement, me = rebalancer.placement, rank.comm.rank
    report.slots_match_placement = all(
        torch.equal(layer.slot_experts.gate_ADF,
                    experts[index].select(MoEDecodeLayer.slots_of_rank(placement, index, me)).gate_ADF)
        and torch.equal(layer.slot_experts.down_AFD,
                        experts[index].select(MoEDecodeLayer.slots_of_rank(placement, index, me)).down_AFD)
        for index, layer in enumerate(rank.layers))
    copies = rebalancer.host_copies
    report.host_copies_match_placement = all(sorted(copies.copies_L[index]) == copies.wanted(placement, index)
                                             for index in range(placement.num_layers))
    report.final_phy2log_LP = placement.phy2log_LP
    report.final_members = list(rank.comm.members)


def _max_err_vs_dense(setup: DecodeSetup, gate: torch.Tensor, experts: list, outputs_by_step: dict[int, list],
                      me: int, num_ranks: int) -> float:
    """The largest |output - dense layer output| over the steps this rank served (each step's inputs made again
    from the seed). Checked after the run, so that the dense layers' CPU time does not compete with the timed
    steps of the other ranks."""
    worst = 0.0
    for step, outputs in outputs_by_step.items():
        split = tokens_per_rank(step, setup.tokens_per_step, num_ranks, setup.seed)
        start = sum(split[:me])
        mine = step_inputs_LND(setup, step)[:, start : start + split[me]].to(gate.device)
        for index, out in enumerate(outputs):
            if len(out):
                dense = dense_moe(mine[index], gate, experts[index], setup.config)
                worst = max(worst, float((out - dense).abs().max()))
    return worst


def _die(comm: Communicator) -> None:
    """Kill this rank's process outright (SIGKILL), saying when in the store first."""
    comm.store.set("eplb/demo/killed_at", repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _die_in_broadcast(comm: Communicator) -> None:
    """Make this rank die as it enters its next broadcast (the rebalancer's only one outside recovery carries a
    solve's answer), with its peers waiting in the collective."""
    def dying(*args, **kwargs):
        _die(comm)

    comm.broadcast = dying


def _killed_at(comm: Communicator) -> float | None:
    """When a rank killed by `Faults.kills` said it was about to die (wall clock), if it did."""
    if comm.store is None or not comm.store.check(["eplb/demo/killed_at"]):
        return None
    return float(comm.store.get("eplb/demo/killed_at"))


class _StalledExchange:
    """An exchange that was never posted and whose wait hangs past the transfer timeout, then fails."""

    def __init__(self, comm: Communicator, timeout_s: float) -> None:
        self.comm, self.timeout_s = comm, timeout_s

    def wait(self, timeout_s: float | None = None) -> None:
        time.sleep(1.5 * self.timeout_s)
        raise CollectiveTimeoutError(f"rank {self.comm.original_rank}: exchange stalled (injected)")


def _stall_transfers(comm: Communicator, timeout_s: float) -> None:
    """Make this rank's next weight transfer hang past `timeout_s` and then fail, as a stuck link would; later
    transfers go through."""
    start_exchange = comm.start_exchange

    def stalled(*args, **kwargs) -> _StalledExchange:
        comm.start_exchange = start_exchange
        return _StalledExchange(comm, timeout_s)

    comm.start_exchange = stalled
