"""Replica choice inside the EP group: per-slot quotas for this step, and each rank's picks given to replicas so
that the quotas are met exactly.

Legend: G ranks (one per GPU), E experts, X most replicas of one expert, P = G x S slots, N tokens of this rank,
K top-k.

Every rank holds only its own tokens, so each step: the per-rank counts [G, E] are all-gathered (the variable
all-to-all needs them anyway); every rank computes the same per-slot quotas from the same global counts (the
router's split, the placement's static weights, or an equal split); then the picks of expert e are laid in rank
order on one line, rank g owning positions [start[g, e], start[g, e] + counts[g, e]), and replica x of e owns the
next quota_EX[e, x] positions. A pick goes to the replica whose positions hold it, so every replica gets exactly
its quota, and every rank knows, without another collective, how many rows each rank sends to each slot (the
overlap of the two ranges). All functions here keep fixed shapes and never read a value to the host, so they
compile with `torch.compile(fullgraph=True)`.
"""

import functools
from dataclasses import dataclass

import torch

from placement.placement_model import Placement
from placement.routing.index_tables import prefix_sums
from placement.routing.live_router import LayerRoutingTable, round_preserving_sums, route_step

ROUTING_MODES = ("static", "dynamic", "oblivious")


@dataclass(frozen=True)
class ReplicaTables:
    """One layer's placement, as the per-step functions use it (tensors on the tokens' device).

    Attributes:
        log2phy_EX: [E, X] int64, the slots holding expert e in ascending order, padded with P.
        weights_EX: [E, X] float32, each replica's static share (0 on padding).
        valid_EX: [E, X] bool, True where log2phy_EX names a slot.
        router: the live router's tables of this layer.
        num_slots: P.
        slots_per_gpu: S.
    """

    log2phy_EX: torch.Tensor
    weights_EX: torch.Tensor
    valid_EX: torch.Tensor
    router: LayerRoutingTable
    num_slots: int
    slots_per_gpu: int

    @classmethod
    def build(cls, placement: Placement, layer: int, device: torch.device | str = "cpu") -> "ReplicaTables":
        """The tables of layer `layer` of `placement`."""
        slots = placement.cluster.num_slots
        log2phy = torch.as_tensor(placement.log2phy_LEX[layer], dtype=torch.int64)
        valid = log2phy >= 0
        log2phy = torch.where(valid, log2phy, torch.full_like(log2phy, slots))
        weights_P = torch.as_tensor(placement.weights_LP[layer], dtype=torch.float32)
        weights = torch.where(valid, torch.cat([weights_P, torch.zeros(1)])[log2phy], torch.zeros(()))
        router = LayerRoutingTable.build(placement.phy2log_LP[layer], placement.cluster.slots_per_gpu,
                                         placement.num_experts, device=device, weights_P=placement.weights_LP[layer])
        return cls(log2phy.to(device), weights.to(device), valid.to(device), router, slots,
                   placement.cluster.slots_per_gpu)


def slot_quotas_EX(counts_E: torch.Tensor, tables: ReplicaTables, mode: str) -> torch.Tensor:
    """[E, X] int64: tokens each replica takes this step; per expert they sum to counts_E[e].

    Modes: "dynamic" the live router's split (minimises this step's busiest GPU); "static" the placement's
    weights in whole tokens (largest remainders); "oblivious" an equal split over the replicas, as round-robin
    by token gives (vLLM's replica choice), whatever the placement's weights say.
    """
    counts = counts_E.to(torch.int64)
    if mode == "dynamic":
        tokens_P = route_step(counts, tables.router, check_values=False)
        padded = torch.cat([tokens_P, tokens_P.new_zeros(1)])
        return torch.where(tables.valid_EX, padded[tables.log2phy_EX], torch.zeros_like(tables.log2phy_EX))
    if mode == "static":
        share = tables.weights_EX * counts[:, None].to(torch.float32)
        return round_preserving_sums(share, counts, tables.valid_EX)
    if mode == "oblivious":
        replicas = tables.valid_EX.sum(1, keepdim=True)
        index = torch.arange(tables.valid_EX.shape[1], device=counts.device)[None]
        base = counts[:, None] // replicas + (index < counts[:, None] % replicas).to(torch.int64)
        return torch.where(tables.valid_EX, base, torch.zeros_like(base))
    raise ValueError(f"mode must be one of {ROUTING_MODES}; got {mode!r}")


def slot_quotas_P(quota_EX: torch.Tensor, tables: ReplicaTables) -> torch.Tensor:
    """[P] int64: tokens the quotas give each slot (quota_EX [E, X] laid out by slot)."""
    quota_P = torch.zeros(tables.num_slots + 1, dtype=torch.int64, device=quota_EX.device)
    quota_P.scatter_add_(0, tables.log2phy_EX.reshape(-1), quota_EX.reshape(-1))
    return quota_P[: tables.num_slots]


def rows_sent_GP(counts_GE: torch.Tensor, quota_EX: torch.Tensor, tables: ReplicaTables) -> torch.Tensor:
    """[G, P] int64: picks rank g sends to slot p this step (the overlap of its range with the slot's range)."""
    rank_end = prefix_sums(counts_GE, 0)
    rank_start = rank_end - counts_GE
    replica_end = prefix_sums(quota_EX, 1)
    replica_start = replica_end - quota_EX
    overlap_GEX = (torch.minimum(rank_end[:, :, None], replica_end[None])
                   - torch.maximum(rank_start[:, :, None], replica_start[None])).clamp_min(0)
    sent = torch.zeros(counts_GE.shape[0], tables.num_slots + 1, dtype=torch.int64, device=counts_GE.device)
    index = tables.log2phy_EX.reshape(1, -1).expand(counts_GE.shape[0], -1)
    sent.scatter_add_(1, index, overlap_GEX.reshape(counts_GE.shape[0], -1))
    return sent[:, : tables.num_slots]


def assign_slots_NK(topk_ids_NK: torch.Tensor, counts_GE: torch.Tensor, rank: int, quota_EX: torch.Tensor,
                    tables: ReplicaTables) -> torch.Tensor:
    """[N, K] int64: the slot each of this rank's picks goes to, meeting `quota_EX` exactly across the group.

    The i-th pick of expert e on this rank (in token order) sits at position start[rank, e] + i of e's line.
    """
    flat = topk_ids_NK.reshape(-1).to(torch.int64)
    num_experts = quota_EX.shape[0]
    # Step 1: rank of each pick among this rank's picks of the same expert, in token order.
    order = torch.sort(flat, stable=True).indices
    sorted_ids = flat[order]
    local_counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).index_add_(
        0, flat, torch.ones_like(flat))
    first_of_expert = local_counts.cumsum(0) - local_counts
    within_sorted = torch.arange(flat.numel(), device=flat.device) - first_of_expert[sorted_ids]
    within = torch.empty_like(within_sorted).scatter_(0, order, within_sorted)
    # Step 2: position on the expert's line, then the replica whose range holds it.
    rank_start_E = counts_GE[:rank].sum(0)
    position = rank_start_E[flat] + within
    replica_end = prefix_sums(quota_EX, 1)
    replica = (position[:, None] >= replica_end[flat]).sum(1)
    replica = replica.clamp_max(quota_EX.shape[1] - 1)
    return tables.log2phy_EX[flat, replica].reshape(topk_ids_NK.shape)


def plan_step(topk_ids_NK: torch.Tensor, counts_GE: torch.Tensor, rank: int, tables: ReplicaTables,
              mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's replica choice on one rank: quota_EX [E, X] (the same on every rank), slot_NK [N, K] (this
    rank's picks' slots) and rows_sent_GP [G, P] (every rank's rows to every slot: the all-to-all split sizes)."""
    quota_EX = slot_quotas_EX(counts_GE.sum(0), tables, mode)
    slot_NK = assign_slots_NK(topk_ids_NK, counts_GE, rank, quota_EX, tables)
    return quota_EX, slot_NK, rows_sent_GP(counts_GE, quota_EX, tables)


@functools.cache
def compiled_plan_step():
    """`plan_step` compiled as one graph (`torch.compile(fullgraph=True)`), built on first use and shared by all
    layers: the eager router runs dozens of small kernels a step, the compiled one a few fused ones."""
    return torch.compile(plan_step, fullgraph=True)
