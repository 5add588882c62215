"""The live dynamic router: split one step's tokens of each expert over its replicas, in whole tokens.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, M experts spanning two or more
GPUs (movable), X the most GPUs one expert spans.

This is the function a decode worker runs every step (and the simulator replays): torch in, torch out, on the
device the counts live on, no Python loop over experts. Each call runs a fixed number of damped water-filling
rounds with Nesterov momentum (see `placement.dynamic_split` for the method, the same in numpy, and its
optimality certificate), then rounds the split to
whole tokens (largest remainders), so every expert's tokens are conserved exactly.
torch is imported here on purpose: the router must run where the tokens are (CUDA, Ascend NPU or CPU).
"""

from dataclasses import dataclass

import numpy as np
import torch

from placement.dynamic_split import MOMENTUM, ROUTER_ROUNDS, ReplicaGraph, first_slot_EG

DEFAULT_ROUNDS = ROUTER_ROUNDS


@dataclass(frozen=True)
class LayerRoutingTable:
    """Precomputed tables of one layer's placement, on one device.

    Attributes:
        fixed_gpu_E: [E] int64, the GPU of an expert living on one GPU only, else G (a sink).
        movable_M: [M] int64, experts spanning two or more GPUs.
        gpus_MX: [M, X] int64, the GPUs each movable expert spans, padded with G.
        slot_of_EG: [E, G + 1] int64, the first slot of expert e on GPU g (-1 if none; column G unused).
        weight_MX: [M, X] float32, the placement's static share of movable expert m on each GPU it spans: the
            split the water-filling starts from.
        num_gpus: G.
        step_M1: [M, 1] float32, damping of each movable expert's Jacobi update.
    """

    fixed_gpu_E: torch.Tensor
    movable_M: torch.Tensor
    gpus_MX: torch.Tensor
    slot_of_EG: torch.Tensor
    weight_MX: torch.Tensor
    num_gpus: int
    step_M1: torch.Tensor

    @classmethod
    def build(
        cls, phy2log_P: np.ndarray, slots_per_gpu: int, num_experts: int, device="cpu", weights_P=None
    ) -> "LayerRoutingTable":
        """From one layer's slot map phy2log_P [P] and, optionally, its static weights_P [P] (default: equal)."""
        phy2log = np.asarray(phy2log_P, dtype=np.int64)
        num_gpus = len(phy2log) // slots_per_gpu
        gpu_of_slot = np.arange(len(phy2log)) // slots_per_gpu
        graph = ReplicaGraph.build(phy2log, gpu_of_slot, num_experts, num_gpus, weights_P)
        fixed_gpu = graph.fixed_gpu_E(none=num_gpus)
        slot_of = np.full((num_experts, num_gpus + 1), -1, dtype=np.int64)
        slot_of[:, :num_gpus] = first_slot_EG(phy2log, gpu_of_slot, num_experts, num_gpus)
        as_tensor = lambda a: torch.as_tensor(a, dtype=torch.int64, device=device)  # noqa: E731
        as_float = lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)  # noqa: E731
        return cls(as_tensor(fixed_gpu), as_tensor(graph.movable_M), as_tensor(graph.gpus_MX), as_tensor(slot_of),
                   as_float(graph.weight_MX), num_gpus, as_float(graph.damping_M1()))


def route_step(
    counts_E: torch.Tensor, table: LayerRoutingTable, rounds: int = DEFAULT_ROUNDS, momentum: float = MOMENTUM
) -> torch.Tensor:
    """Split one step's tokens over the replicas of one layer.

    Args:
        counts_E: [E] integer tensor, tokens routed to each logical expert this step.
        table: the layer's routing table (same device as counts_E).
        rounds: damped water-filling rounds; more is closer to the optimum.
        momentum: Nesterov momentum of each round (0 = plain damped Jacobi).

    Returns:
        tokens_P: [P] int64, tokens each slot processes; per expert the slots' tokens sum to counts_E[e].
    """
    num_gpus = table.num_gpus
    num_slots = table.slot_of_EG.shape[0] and int(table.slot_of_EG.max()) + 1
    counts = counts_E.to(torch.int64)
    device = counts.device
    # Step 1: tokens of experts that live on one GPU cannot move.
    fixed_G1 = torch.zeros(num_gpus + 1, dtype=torch.float32, device=device)
    fixed_G1.index_add_(0, table.fixed_gpu_E, counts.to(torch.float32))
    fixed_G1[num_gpus] = float("inf")
    tokens_P = torch.zeros(num_slots, dtype=torch.int64, device=device)
    fixed_slots = table.slot_of_EG.gather(1, table.fixed_gpu_E[:, None]).squeeze(1)
    is_fixed = table.fixed_gpu_E < num_gpus
    tokens_P.index_add_(0, fixed_slots[is_fixed], counts[is_fixed])
    if table.movable_M.numel() == 0:
        return tokens_P
    # Step 2: damped Jacobi water-filling of the movable experts over the GPUs they span, each round from the
    # Nesterov look-ahead split.
    gpus_MX = table.gpus_MX
    valid_MX = gpus_MX < num_gpus
    tokens_M = counts[table.movable_M].to(torch.float32)
    share_MX = table.weight_MX * tokens_M[:, None]
    previous_MX = share_MX
    flat_gpus = gpus_MX.reshape(-1)
    for _ in range(rounds):
        ahead_MX = _extrapolate(share_MX, previous_MX, tokens_M, valid_MX, momentum)
        loads_G1 = fixed_G1.index_add(0, flat_gpus, ahead_MX.reshape(-1))
        base_MX = loads_G1[gpus_MX] - ahead_MX
        previous_MX = share_MX
        share_MX = ahead_MX + table.step_M1 * (_water_fill(tokens_M, base_MX) - ahead_MX)
    # Step 3: whole tokens by largest remainders, so each expert's tokens are conserved exactly.
    whole_MX = _round_preserving_sums(share_MX, counts[table.movable_M], valid_MX)
    slots_MX = table.slot_of_EG[table.movable_M[:, None], gpus_MX]
    tokens_P.index_add_(0, slots_MX[valid_MX], whole_MX[valid_MX])
    return tokens_P


def _extrapolate(share_MX: torch.Tensor, previous_MX: torch.Tensor, tokens_M: torch.Tensor, valid_MX: torch.Tensor,
                 momentum: float) -> torch.Tensor:
    """share + momentum * (share - previous), projected to a valid split (as `dynamic_split.extrapolate`).

    Each row's extrapolation sums to its tokens, so a row with tokens keeps a positive entry after clamping.
    """
    ahead = (share_MX + momentum * (share_MX - previous_MX)).clamp_min_(0.0).mul_(valid_MX)
    return ahead.mul_(tokens_M[:, None] / ahead.sum(1, keepdim=True).clamp_min_(1e-30))


def _water_fill(tokens_M: torch.Tensor, base_MX: torch.Tensor) -> torch.Tensor:
    """Spread tokens_M over bins at levels base_MX (inf = absent), raising the lowest bins evenly."""
    sorted_base, _ = base_MX.sort(dim=1)
    finite = torch.where(torch.isfinite(sorted_base), sorted_base, torch.zeros_like(sorted_base))
    k = torch.arange(1, base_MX.shape[1] + 1, device=base_MX.device, dtype=base_MX.dtype)
    level_k = (tokens_M[:, None] + finite.cumsum(1)) / k
    active = (sorted_base < level_k) | (k == 1)
    level = level_k.gather(1, active.sum(1, keepdim=True) - 1)
    return torch.where(torch.isfinite(base_MX), (level - base_MX).clamp_min(0.0), torch.zeros_like(base_MX))


def _round_preserving_sums(share_MX: torch.Tensor, tokens_M: torch.Tensor, valid_MX: torch.Tensor) -> torch.Tensor:
    """Whole-token split: floor each share, then hand the leftover tokens to the largest remainders."""
    share = torch.where(valid_MX, share_MX.clamp_min(0.0), torch.zeros_like(share_MX))
    scale = tokens_M.to(share.dtype) / share.sum(1).clamp_min(1e-9)
    share = share * scale[:, None]
    floor = share.floor().to(torch.int64)
    leftover = tokens_M - floor.sum(1)
    remainder = torch.where(valid_MX, share - floor.to(share.dtype), torch.full_like(share, -1.0))
    rank = remainder.argsort(dim=1, descending=True).argsort(dim=1)
    return floor + (rank < leftover[:, None]).to(torch.int64)
