"""A synthetic decode loop over a real EP group: MoE layers whose gates follow a synthetic routing trace.

Legend: T steps, L layers, E experts, G ranks (GPUs), K top-k, N tokens of the whole group in a step, D hidden size.

For the demo and the benchmark of the live layer. The traffic is skewed and drifting as in `traces.synthetic`: a
trace gives, per step and layer, each expert's share p of the picks; a token's hidden state carries
log p + Gumbel noise in its first E dimensions and the gate reads exactly those (gate weight [I_E | 0]), so its
top-k is a draw of K distinct experts in proportion to p (the Gumbel top-k trick) and the layer's real gate
reproduces the trace's traffic. Every rank builds the same weights and inputs from the seed, keeps its own tokens
(an uneven share of each step), and checks its outputs against the dense single-process layer.
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from collectives import Communicator
from eplb.harness.dense_reference import dense_moe
from eplb.live.experts import ExpertWeights
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_config import MoELayerConfig
from eplb.live.moe_layer import MoEDecodeLayer
from placement import Placement


@dataclass(frozen=True)
class DecodeSetup:
    """What every rank needs to run the loop: the model shape, the placement, the traffic and the seed."""

    config: MoELayerConfig
    placement: Placement
    share_TLE: np.ndarray  # [T, L, E] float, each expert's share of the picks per step and layer
    tokens_per_step: int
    routing: str
    seed: int = 0
    record: bool = True
    check_dense: bool = True
    compile_routing: bool = False


@dataclass
class RankReport:
    """One rank's measurements over the loop (per step and layer)."""

    computed_TL: list = field(default_factory=list)  # rows this rank's slots computed
    planned_gpu_TLG: list = field(default_factory=list)  # tokens the quotas gave each GPU (same on every rank)
    picks_TL: list = field(default_factory=list)  # picks of the whole group
    max_abs_err: float = 0.0
    seconds_per_step: list = field(default_factory=list)
    cpu_seconds_per_step: list = field(default_factory=list)  # this process's CPU time (all its threads)
    window_load_LE: np.ndarray | None = None


def tokens_per_rank(step: int, total: int, world_size: int, seed: int) -> list[int]:
    """An uneven split of a step's `total` tokens over the ranks (decode batches differ), the same on every rank."""
    weights = np.random.default_rng([seed, step]).dirichlet(np.full(world_size, 2.0))
    split = np.floor(weights * total).astype(int)
    split[: total - split.sum()] += 1
    return split.tolist()


def step_inputs_LND(setup: DecodeSetup, step: int) -> torch.Tensor:
    """[L, N, D] the hidden states of step `step` for the whole group (log share + Gumbel noise, then zeros)."""
    config = setup.config
    generator = torch.Generator().manual_seed(setup.seed * 1_000_003 + step)
    log_share = torch.as_tensor(np.log(np.maximum(setup.share_TLE[step], 1e-9)), dtype=torch.float32)
    uniform = torch.rand(log_share.shape[0], setup.tokens_per_step, config.num_experts, generator=generator)
    gumbel = -torch.log(-torch.log(uniform.clamp(1e-9, 1 - 1e-9)))
    x = torch.zeros(log_share.shape[0], setup.tokens_per_step, config.hidden_size)
    x[..., : config.num_experts] = log_share[:, None, :] + gumbel
    return x


def model_weights(setup: DecodeSetup) -> tuple[torch.Tensor, list[ExpertWeights]]:
    """The gate weight [E, D] ([I_E | 0]) and each layer's expert weights, from the seed."""
    config = setup.config
    gate = torch.zeros(config.num_experts, config.hidden_size)
    gate[:, : config.num_experts] = torch.eye(config.num_experts)
    experts = [ExpertWeights.random(config.num_experts, config.hidden_size, config.intermediate_size,
                                    setup.seed + 100 + layer) for layer in range(setup.placement.num_layers)]
    return gate, experts


def run_decode_loop(comm: Communicator, setup: DecodeSetup, steps: int) -> RankReport:
    """Run `steps` decode steps of every layer on this rank; return what it measured."""
    num_layers = setup.placement.num_layers
    gate, experts = model_weights(setup)
    gate, experts = gate.to(comm.device), [weights.to(comm.device) for weights in experts]
    recorder = LoadRecorder(steps, num_layers, setup.config.num_experts, comm.device) if setup.record else None
    layers = [MoEDecodeLayer(setup.config, setup.placement, layer, comm, gate,
                             experts[layer].select(MoEDecodeLayer.slots_of_rank(setup.placement, layer, comm.rank)),
                             routing=setup.routing, recorder=recorder, compile_routing=setup.compile_routing)
              for layer in range(num_layers)]
    report = RankReport()
    slots = setup.placement.cluster.slots_per_gpu
    for step in range(steps):
        split = tokens_per_rank(step, setup.tokens_per_step, comm.world_size, setup.seed)
        start = sum(split[: comm.rank])
        mine = step_inputs_LND(setup, step)[:, start : start + split[comm.rank]].to(comm.device)
        began, began_cpu = time.perf_counter(), time.process_time()
        outputs = [layer(mine[index]) for index, layer in enumerate(layers)]
        if recorder is not None:
            recorder.next_step()
        if comm.device.type == "cuda":
            torch.cuda.synchronize(comm.device)
        report.seconds_per_step.append(time.perf_counter() - began)
        report.cpu_seconds_per_step.append(time.process_time() - began_cpu)
        report.computed_TL.append([int(layer.last_step["computed_S"].sum()) for layer in layers])
        report.planned_gpu_TLG.append([layer.last_step["quota_P"].view(-1, slots).sum(1).tolist() for layer in layers])
        report.picks_TL.append([int(layer.last_step["quota_P"].sum()) for layer in layers])
        if setup.check_dense:
            for index, out in enumerate(outputs):
                dense = dense_moe(mine[index], gate, experts[index], setup.config)
                report.max_abs_err = max(report.max_abs_err, float((out - dense).abs().max()) if len(out) else 0.0)
    if recorder is not None:
        report.window_load_LE = recorder.window_load_LE().cpu().numpy()
    return report


def summarize(reports: list[RankReport], routing: str) -> dict:
    """The loop's figures over all ranks: imbalance measured (rows each rank computed) and planned (the quotas),
    mean over steps and layers; tokens lost (picks minus rows computed); worst error against the dense layer."""
    computed_GTL = np.array([r.computed_TL for r in reports], dtype=float)
    planned_TLG = np.array(reports[0].planned_gpu_TLG, dtype=float)
    picks_TL = np.array(reports[0].picks_TL)
    measured = computed_GTL.max(0) / np.maximum(computed_GTL.mean(0), 1e-12)
    planned = planned_TLG.max(-1) / np.maximum(planned_TLG.mean(-1), 1e-12)
    return {
        "steps": int(picks_TL.shape[0]),
        "world_size": len(reports),
        "routing": routing,
        "max_abs_err_vs_dense": max(r.max_abs_err for r in reports),
        "imbalance_measured": float(measured.mean()),
        "imbalance_planned": float(planned.mean()),
        "tokens_lost": int(picks_TL.sum() - computed_GTL.sum()),
        "seconds_per_step_mean": float(np.mean([np.mean(r.seconds_per_step) for r in reports])),
    }
