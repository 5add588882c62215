"""A synthetic decode loop with a `Rebalancer`, for the live demo, the tests and the benchmark: shifting traffic,
rebalances while decoding, and ranks that die (SIGKILL) or are drained.

Legend: T steps, L layers, E experts, W ranks as first formed.

Tokens belong to original ranks: step t's tokens are split over the W original ranks as in `synthetic_decode`, and
a rank serves its share; when a rank is lost, its sequences are re-queued to another unit (counted, never served
here) and the survivors serve theirs. Each rank checks every step's output against the dense layer, records per
step what it computed and how long the step took (the rebalancer's work before the step included), and at the end
checks that each slot holds the weights of the expert the placement serving names.
"""

import os
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from collectives import CollectiveError, CollectiveTimeoutError, Communicator
from eplb.live.dense_reference import dense_moe
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_config import MoELayerConfig
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.live.rebalance_config import RebalanceConfig
from eplb.live.rebalancer import Rebalancer
from eplb.live.synthetic_decode import DecodeSetup, model_weights, step_inputs_LND, tokens_per_rank
from eplb.live.replica_assignment import ReplicaTables, slot_quotas_EX, slot_quotas_P
from placement import ClusterSpec, Placement, PlacementFormatError, fit_placement
from traces.synthetic import SyntheticConfig, generate_trace


@dataclass(frozen=True)
class Faults:
    """Faults to inject (original ranks and step indices).

    Attributes:
        kills: (rank, step): that rank's process is killed outright (SIGKILL) after the first layer of that step.
        drains: (rank, step): every rank calls `mark_failed(rank)` before that step.
        refuse_switch_rank: this rank refuses every switch.
        failing_solve: the policy raises.
        stalled_transfer_rank: this rank's first weight transfer of a rebalance hangs past its timeout.
    """

    kills: tuple[tuple[int, int], ...] = ()
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


def shifting_traffic_setup(world_size: int, steps: int, *, experts: int = 32, top_k: int = 4, tokens: int = 256,
                           hidden: int = 64, layers: int = 2, fit_steps: int = 30, slots: int | None = None,
                           routing: str = "dynamic", time_limit_s: float = 2.0, seed: int = 0) -> DecodeSetup:
    """The live demo's setup: skewed synthetic traffic whose expert mix changes a third of the way in (experts
    relabelled at random), and a `cpsat` placement fitted on the `fit_steps` steps before the run."""
    trace = generate_trace(SyntheticConfig(num_steps=fit_steps + steps, num_layers=layers, num_experts=experts,
                                           top_k=top_k, tokens_per_step=tokens, seed=seed))
    counts = trace.counts_TLE.copy()
    shift = fit_steps + steps // 3
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
    num_layers, num_ranks = setup.placement.num_layers, comm.world_size
    me = comm.original_rank
    gate, experts = model_weights(setup)
    gate, experts = gate.to(comm.device), [weights.to(comm.device) for weights in experts]
    recorder = LoadRecorder(config.window, num_layers, setup.config.num_experts, comm.device, scope=recorder_scope)
    layers = [MoEDecodeLayer(setup.config, setup.placement, layer, comm, gate,
                             experts[layer].select(MoEDecodeLayer.slots_of_rank(setup.placement, layer, comm.rank)),
                             routing=setup.routing, recorder=recorder, compile_routing=setup.compile_routing)
              for layer in range(num_layers)]
    rebalancer = Rebalancer(config, comm, layers, recorder, setup.placement,
                            policy_fn=failing_policy if faults.failing_solve else None)
    if faults.stalled_transfer_rank == me:
        _stall_transfers(comm, config.transfer_timeout_s)
    report = LoopReport(original_rank=me)
    kills = {step: rank for rank, step in faults.kills}
    drains = {step: rank for rank, step in faults.drains}
    load_at = dict(loads)
    step = 0
    while step < steps:
        split = tokens_per_rank(step, setup.tokens_per_step, num_ranks, setup.seed)
        try:
            if step in drains and drains[step] in comm.members:
                recovery = rebalancer.mark_failed(drains[step], step)
                if recovery is None:
                    report.drained = True
                    break
                report.requeued += split[drains[step]]
                report.recoveries.append({"lost_ranks": recovery.lost_ranks, "resume_step": recovery.resume_step,
                                          "seconds": recovery.seconds, "drained": True})
            if step in load_at:
                try:
                    rebalancer.load(load_at.pop(step), step)
                except (PlacementFormatError, RuntimeError) as exc:
                    report.load_errors.append(str(exc))
            began = time.perf_counter()
            busy_before, phase_before = rebalancer.in_progress, rebalancer.phase
            rebalancer.step(step, accept_switch=faults.refuse_switch_rank != me)
            pause = time.perf_counter() - began
            start = sum(split[:me])
            mine = step_inputs_LND(setup, step)[:, start : start + split[me]].to(comm.device)
            outputs = []
            for index, layer in enumerate(layers):
                outputs.append(layer(mine[index]))
                if index == 0 and kills.get(step) == me:
                    comm.store.set("eplb/demo/killed_at", repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
            recorder.next_step()
            if comm.device.type == "cuda":
                torch.cuda.synchronize(comm.device)
            seconds = time.perf_counter() - began
        except CollectiveError:
            detected_at = time.time()
            recovery = rebalancer.recover(step)
            lost_split = tokens_per_rank(recovery.resume_step, setup.tokens_per_step, num_ranks, setup.seed)
            report.requeued += sum(lost_split[rank] for rank in recovery.lost_ranks)
            report.recoveries.append({"lost_ranks": recovery.lost_ranks, "resume_step": recovery.resume_step,
                                      "seconds": recovery.seconds, "detected_at": detected_at,
                                      "killed_at": _killed_at(comm), "restored_experts": recovery.restored_experts})
            step = recovery.resume_step
            continue
        for index, out in enumerate(outputs):
            dense = dense_moe(mine[index], gate, experts[index], setup.config)
            report.max_abs_err = max(report.max_abs_err, float((out - dense).abs().max()) if len(out) else 0.0)
        report.steps[step] = {
            "seconds": seconds,
            "pause_seconds": pause,
            "phase": f"{phase_before}>{rebalancer.phase}",
            "rebalancing": busy_before or rebalancer.in_progress,
            "world_size": comm.world_size,
            "group_rank": comm.rank,
            "computed_L": [int(layer.last_step["computed_S"].sum()) for layer in layers],
            "planned_gpu_LG": [layer.last_step["quota_P"].view(-1, layer.slots_per_gpu).sum(1).tolist()
                               for layer in layers],
            "counts_LE": [layer.last_step["counts_E"].tolist() for layer in layers],
            "completed_at": time.time(),
        }
        step += 1
    rebalancer.close()
    report.stats = vars(rebalancer.stats)
    if not report.drained:
        report.slots_match_placement = all(
            torch.equal(layer.slot_experts.gate_ADF, experts[index].select(
                MoEDecodeLayer.slots_of_rank(rebalancer.placement, index, comm.rank)).gate_ADF)
            and torch.equal(layer.slot_experts.down_AFD, experts[index].select(
                MoEDecodeLayer.slots_of_rank(rebalancer.placement, index, comm.rank)).down_AFD)
            for index, layer in enumerate(layers))
        report.final_phy2log_LP = rebalancer.placement.phy2log_LP
        report.final_members = list(comm.members)
    return report


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


def summarize_rebalancing(reports: list, setup: DecodeSetup, failed_rank: int | None = None) -> dict:
    """The demo's figures over every rank that finished (`reports` in original rank order; a killed rank's entry
    is its error). Imbalance is max / mean over the group's ranks of the rows each computed, mean over layers,
    then over steps; tokens lost = picks the quotas left out plus rows a reporting rank did not compute; before =
    the start placement routed on the traffic of the steps after the last switch (on its own group size, also
    when the group has shrunk since); after = as measured after the last switch."""
    finished = [r for r in reports if isinstance(r, LoopReport) and not r.drained]
    served = [r for r in reports if isinstance(r, LoopReport)]
    steps = sorted(set().union(*(r.steps for r in finished)))
    served_by = {step: [r for r in served if step in r.steps] for step in steps}
    measured, lost, worst_time, rebalancing, waited = {}, 0, {}, {}, 0
    for step in steps:
        ranks = served_by[step]
        # Rows per GPU: as computed by the ranks that reported the step, as planned for a rank that died later
        # (every survivor's rows equal its plan, which `tokens_lost` checks).
        planned_LG = np.array(ranks[0].steps[step]["planned_gpu_LG"], dtype=float)
        rows_LG = planned_LG.copy()
        for r in ranks:
            rows_LG[:, r.steps[step]["group_rank"]] = r.steps[step]["computed_L"]
        measured[step] = float(np.mean(rows_LG.max(1) / np.maximum(rows_LG.mean(1), 1e-12)))
        lost += int(np.sum(ranks[0].steps[step]["counts_LE"]) - rows_LG.sum())
        worst_time[step] = max(r.steps[step]["seconds"] for r in ranks)
        rebalancing[step] = any(r.steps[step]["rebalancing"] for r in ranks)
    quiet = [worst_time[s] for s in steps if not rebalancing[s]]
    busy = [worst_time[s] for s in steps if rebalancing[s]]
    median_quiet = float(np.median(quiet)) if quiet else 0.0
    for step in steps:  # a step waited if the rebalancer's work before it outlasted a whole quiet decode step
        waited += any(r.steps[step]["pause_seconds"] > median_quiet for r in served_by[step])
    stats = finished[0].stats
    switches = stats["switch_steps"]
    after_steps = [s for s in steps if switches and s >= switches[-1]]
    before, basis = _imbalance_before(setup, finished[0], after_steps, steps)
    recoveries = finished[0].recoveries
    kill_to_step = None
    if recoveries and recoveries[0].get("killed_at"):
        resume = recoveries[0]["resume_step"]
        done = [r.steps[resume]["completed_at"] for r in finished if resume in r.steps]
        kill_to_step = max(done) - recoveries[0]["killed_at"] if done else None
    return {
        "steps": len(steps),
        "world_size": setup.placement.cluster.num_gpus,
        "world_size_at_end": len(finished[0].final_members),
        "routing": setup.routing,
        "max_abs_err_vs_dense": max(r.max_abs_err for r in finished),
        "imbalance_before": before,
        "imbalance_before_basis": basis,
        "imbalance_after": float(np.mean([measured[s] for s in after_steps])) if after_steps else None,
        "rebalances": stats["rebalances"],
        "rebalance_failures": stats["failures"],
        "rebalances_kept": stats["kept"],
        "bytes_moved": int(sum(r.stats["bytes_received"] for r in finished)),
        "tokens_lost": lost,
        "requests_requeued": finished[0].requeued,
        "failed_rank": failed_rank,
        "recoveries": [{k: v for k, v in rec.items() if k not in ("detected_at", "killed_at")} for rec in recoveries],
        "seconds_from_kill_to_first_step": kill_to_step,
        "decode_steps_waiting_on_rebalance": int(waited),
        "step_time_p99_ratio": float(np.percentile(busy, 99) / np.percentile(quiet, 99)) if busy and quiet else None,
        "step_time_p99_ratio_interval": p99_ratio_interval(busy, quiet),
        "step_time_ms": {"p50_quiet": _ms(quiet, 50), "p99_quiet": _ms(quiet, 99), "p50_rebalancing": _ms(busy, 50),
                         "p99_rebalancing": _ms(busy, 99), "steps_rebalancing": len(busy)},
        "step_time_ms_by_phase": _by_phase(finished[0], worst_time),
        "lag_steps": stats["lag_steps"],
        "lag_seconds": [round(x, 3) for x in stats["lag_seconds"]],
        "slots_match_placement": all(r.slots_match_placement for r in finished),
        "survivors": finished[0].final_members,
    }


def _imbalance_before(setup: DecodeSetup, report: LoopReport, after_steps: list[int],
                      steps: list[int]) -> tuple[float | None, str]:
    """The start placement routed (as the layers route) on the expert counts of the steps after the last switch
    (all steps when there was none): what serving would have seen without rebalancing, on the same traffic."""
    start = setup.placement
    tables = [ReplicaTables.build(start, layer) for layer in range(start.num_layers)]
    values = []
    for step in after_steps or steps:
        per_layer = []
        for layer, counts in enumerate(report.steps[step]["counts_LE"]):
            quota_EX = slot_quotas_EX(torch.as_tensor(counts), tables[layer], setup.routing)
            gpu = slot_quotas_P(quota_EX, tables[layer]).view(start.cluster.num_gpus, -1).sum(1).double()
            per_layer.append(float(gpu.max() / gpu.mean().clamp_min(1e-9)))
        values.append(float(np.mean(per_layer)))
    basis = "after the last switch" if after_steps else "every step (no switch)"
    return (float(np.mean(values)) if values else None), f"start placement routed on the steps {basis}"


PHASES = {  # a step's rebalancer phase before > after its work -> what the step carried
    "idle>idle": "quiet",
    "idle>solving": "start (the window taken, the solve submitted)",
    "solving>solving": "solving in the background",
    "solving>moving": "answer broadcast, staging allocated",
    "solving>idle": "solve done, nothing worth moving (or the solve failed)",
    "moving>moving": "a round of weights moved",
    "moving>idle": "switch (or a failed move)",
}


def _by_phase(report: LoopReport, worst_time: dict[int, float]) -> dict[str, dict]:
    """Step time (slowest rank) by what the rebalancer did before the step, on one rank's record of the phases."""
    groups: dict[str, list[float]] = {}
    for step, seconds in worst_time.items():
        if step in report.steps:
            groups.setdefault(PHASES.get(report.steps[step]["phase"], report.steps[step]["phase"]), []).append(seconds)
    return {name: {"steps": len(values), "p50": _ms(values, 50), "p90": _ms(values, 90)}
            for name, values in groups.items()}


def p99_ratio_interval(busy: list[float], quiet: list[float], draws: int = 1000,
                       seed: int = 0) -> list[float] | None:
    """A 90% bootstrap interval of p99(busy) / p99(quiet): both groups of step times resampled with replacement
    `draws` times (seeded, so a run's figures repeat). Where a few slow steps set each p99, the interval shows how
    far the ratio moves with which of them fall in a run."""
    if len(busy) < 2 or len(quiet) < 2:
        return None
    rng = np.random.default_rng(seed)
    busy_p99 = np.percentile(rng.choice(np.asarray(busy), (draws, len(busy))), 99, axis=1)
    quiet_p99 = np.percentile(rng.choice(np.asarray(quiet), (draws, len(quiet))), 99, axis=1)
    low, high = np.percentile(busy_p99 / quiet_p99, [5, 95])
    return [round(float(low), 4), round(float(high), 4)]


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 3) if values else None
