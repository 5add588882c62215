"""The live router: split one step's tokens of each expert over its replicas, in whole tokens.

Legend: E logical experts, G GPUs, S slots per GPU, P = G * S slots, M experts spanning two or more GPUs
(movable), Y the most GPUs one expert spans, W the width of a grouped table (`index_tables.grouped`: the most
one-GPU experts on a GPU in `fixed_GW`, the most movable entries on a GPU in `entries_GW`).

This is the function a decode worker runs every step (and the simulator replays): torch in, torch out, on the
device the counts live on. With `check_values=False` the per-step path has no host synchronisation, no Python loop
over experts and no data-dependent shape: `torch.compile(route_step, fullgraph=True)` takes it whole, and CUDA
graphs can capture it. Every sum is a gather and a fixed-order reduction, never a scatter-add, so a step's split is
the same on every run. The method is chosen once per layer, when its table is built:

- Chain layouts, exact (`placement.routing.chain_split`): experts spanning the same GPUs are split as one class;
  when every class's GPUs are consecutive on a ring through all GPUs and no two classes share a pair of
  neighbouring GPUs, as in the `cpsat` policy's chain layouts (ring 0, 1, ..., G-1, 0), the same layouts after a
  migration relabelled their GPUs, and every 2-GPU layout, the split whose busiest GPU carries the least possible
  in whole tokens, in a fixed number of vector operations, with no rounds.
- Any other layout, damped water-filling: `fractional_split` runs a fixed number of Jacobi water-filling rounds
  with Nesterov momentum from the placement's static split (see `placement.routing.dynamic_split` for the method,
  the same in numpy, which the `cpsat` fits run with the same rounds, and its optimality certificate); `route_step`
  rounds that split to whole tokens by largest remainders.

torch is imported here on purpose: the router must run where the tokens are (CUDA, Ascend NPU or CPU).
"""

from dataclasses import dataclass

import numpy as np
import torch

from placement.errors import PlacementFormatError
from placement.placement_model import WEIGHT_TOLERANCE
from placement.routing.chain_split import ChainTables, chain_split, chain_tables
from placement.routing.dynamic_split import MOMENTUM, ROUTER_ROUNDS, ReplicaGraph, first_slot_EG
from placement.routing.index_tables import UNROLL_MAX, grouped, prefix_sums, take

DEFAULT_ROUNDS = ROUTER_ROUNDS  # water-filling rounds on layouts that are not chains


@dataclass(frozen=True)
class LayerRoutingTable:
    """Precomputed tables of one layer's placement, on one device.

    Attributes:
        fixed_GW: [G, W] int64, the experts living on GPU g only, padded with E (a sink with no tokens).
        movable_M: [M] int64, experts spanning two or more GPUs.
        gpus_MY: [M, Y] int64, the GPUs each movable expert spans, padded with G.
        weight_MY: [M, Y] float32, the placement's static share of movable expert m on each GPU it spans: the
            split the water-filling starts from.
        step_M1: [M, 1] float32, damping of each movable expert's Jacobi update.
        entries_GW: [G, W] int64, the flat indices m * Y + y of the movable entries on GPU g, padded with M * Y.
        source_P: [P] int64, where slot p's tokens come from in cat(counts_E [E], share_MY.flatten() [M * Y], [0]):
            the count of its one-GPU expert, its movable expert's share on its GPU (the first slot of an expert on a
            GPU takes the GPU's share), or the final zero (any further slot of that expert on that GPU).
        chain: the chain tables when the layout is a chain (the exact split runs), else None (water-filling runs).
        num_experts: E.
        num_gpus: G.
        num_slots: P.
    """

    fixed_GW: torch.Tensor
    movable_M: torch.Tensor
    gpus_MY: torch.Tensor
    weight_MY: torch.Tensor
    step_M1: torch.Tensor
    entries_GW: torch.Tensor
    source_P: torch.Tensor
    chain: ChainTables | None
    num_experts: int
    num_gpus: int
    num_slots: int

    @property
    def method(self) -> str:
        """"chain" (exact) or "water-filling": how `route_step` splits this layer."""
        return "water-filling" if self.chain is None else "chain"

    @classmethod
    def build(
        cls, phy2log_P, slots_per_gpu: int, num_experts: int, device="cpu", weights_P=None, exact_chains: bool = True,
    ) -> "LayerRoutingTable":
        """The tables of one layer's placement.

        Args:
            phy2log_P: [P] integer array, the logical expert each slot holds; slot p lives on GPU p // S.
            slots_per_gpu: S >= 1; P is a positive multiple of it.
            num_experts: E; every expert in [0, E) holds at least one slot, and no slot holds another id.
            device: where the tables live (the device of the counts they route).
            weights_P: [P] float, the share of its expert's tokens each slot takes under static routing: finite,
                >= 0 and summing to 1 per expert. Default: equal over the GPUs an expert spans.
            exact_chains: split chain layouts exactly (False: water-filling on every layout, for comparisons).

        Raises:
            PlacementFormatError: if an argument breaks the rules above.
        """
        phy2log, weights = _checked_layer(phy2log_P, slots_per_gpu, num_experts, weights_P)
        num_slots = len(phy2log)
        num_gpus = num_slots // slots_per_gpu
        gpu_of_slot = np.arange(num_slots) // slots_per_gpu
        graph = ReplicaGraph.build(phy2log, gpu_of_slot, num_experts, num_gpus, weights)
        movable, gpus_MY = graph.movable_M, graph.gpus_MY
        valid_MY = gpus_MY < num_gpus
        flat_MY = np.arange(gpus_MY.size).reshape(gpus_MY.shape)
        fixed_gpu = graph.fixed_gpu_E(none=-1)
        fixed = np.flatnonzero(fixed_gpu >= 0)
        # Each expert's first slot on a GPU takes the GPU's share of it; every other slot takes the final zero.
        first_EG = first_slot_EG(phy2log, gpu_of_slot, num_experts, num_gpus)
        source = np.full(num_slots, num_experts + gpus_MY.size, dtype=np.int64)
        source[first_EG[fixed, fixed_gpu[fixed]]] = fixed
        rows, columns = np.nonzero(valid_MY)
        source[first_EG[movable[rows], gpus_MY[rows, columns]]] = num_experts + flat_MY[rows, columns]
        as_int = lambda a: torch.as_tensor(a, dtype=torch.int64, device=device)  # noqa: E731
        as_float = lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)  # noqa: E731
        return cls(
            fixed_GW=as_int(grouped(fixed_gpu[fixed], fixed, num_gpus, pad=num_experts)),
            movable_M=as_int(movable),
            gpus_MY=as_int(gpus_MY),
            weight_MY=as_float(graph.weight_MY),
            step_M1=as_float(graph.damping_M1()),
            entries_GW=as_int(grouped(gpus_MY[valid_MY], flat_MY[valid_MY], num_gpus, pad=gpus_MY.size)),
            source_P=as_int(source),
            chain=chain_tables(graph, num_experts, device) if exact_chains else None,
            num_experts=num_experts,
            num_gpus=num_gpus,
            num_slots=num_slots,
        )


def route_step(
    counts_E: torch.Tensor, table: LayerRoutingTable, rounds: int = DEFAULT_ROUNDS, momentum: float = MOMENTUM,
    check_values: bool = True,
) -> torch.Tensor:
    """Split one step's tokens over the replicas of one layer, in whole tokens.

    Args:
        counts_E: [E] integer tensor (any integer dtype, not bool), tokens routed to each logical expert this step,
            on the table's device.
        table: the layer's routing table.
        rounds: water-filling rounds, on layouts that are not chains; more is closer to the optimum.
        momentum: Nesterov momentum of each water-filling round (0 = plain damped Jacobi).
        check_values: refuse negative counts, which costs one host synchronisation (and a graph break under
            `torch.compile`). Shape and dtype are always checked (no synchronisation). Pass False only for counts
            that are non-negative by construction, such as a bincount or one-hot sum of this step's top-k expert ids
            computed on the device, as the decode worker's per-step path does; counts read from a trace, a file or
            a peer keep the check. Negative counts passed with False give a wrong split, not an error.

    Returns:
        tokens_P: [P] int64, tokens each slot processes; per expert the slots' tokens sum to counts_E[e], and only
            slots holding the expert get any. On a chain layout the busiest GPU carries the least possible in whole
            tokens (the ceiling of the fractional optimum); elsewhere a movable expert's slot is within one token of
            its share in `fractional_split`.

    Raises:
        ValueError: counts_E is not an integer tensor of shape [E], or (with check_values) holds a negative count.
    """
    _check_counts(counts_E, table, check_values)
    counts = counts_E.to(torch.int64)
    if table.chain is not None:
        whole_MY = chain_split(counts, table.movable_M, table.num_gpus, table.chain)
    else:
        share_MY = _water_filling(counts_E, table, rounds, momentum)
        whole_MY = round_preserving_sums(share_MY, counts[table.movable_M], table.gpus_MY < table.num_gpus)
    source_P = table.source_P
    return torch.where(source_P < table.num_experts, take(counts, source_P),
                       take(whole_MY.reshape(-1), (source_P - table.num_experts).clamp_min(0)))


def fractional_split(
    counts_E: torch.Tensor, table: LayerRoutingTable, rounds: int = DEFAULT_ROUNDS, momentum: float = MOMENTUM,
    check_values: bool = True,
) -> torch.Tensor:
    """The water-filling split of one step before rounding (tokens as reals), on any layout, chains included.

    Args: as `route_step`.

    Returns:
        share_MY: [M, Y] float32, tokens of movable expert table.movable_M[m] on GPU table.gpus_MY[m, y] (0 on
            padding); each row sums to its expert's count up to float rounding. Experts on one GPU keep theirs.

    Raises:
        ValueError: as `route_step`.
    """
    _check_counts(counts_E, table, check_values)
    return _water_filling(counts_E, table, rounds, momentum)


def _water_filling(counts_E: torch.Tensor, table: LayerRoutingTable, rounds: int, momentum: float) -> torch.Tensor:
    """`fractional_split` without the checks."""
    counts = counts_E.to(torch.float32)
    zero = counts.new_zeros(1)
    # Step 1: tokens of experts that live on one GPU cannot move; they are the base the others fill around.
    fixed_G = take(counts, table.fixed_GW).sum(1)
    absent = torch.full_like(zero, float("inf"))  # the level of the padding column G: never filled
    # Step 2: damped Jacobi water-filling of the movable experts over the GPUs they span, each round from the
    # Nesterov look-ahead split.
    gpus_MY = table.gpus_MY
    valid_MY = gpus_MY < table.num_gpus
    tokens_M = counts[table.movable_M]
    share_MY = table.weight_MY * tokens_M[:, None]
    previous_MY = share_MY
    if share_MY.numel() == 0:
        return share_MY  # no expert spans two GPUs: nothing moves
    # The movable entries on each GPU: their index into share_MY.flatten(), and whether they are one (not padding).
    entry_GW = table.entries_GW.clamp_max(gpus_MY.numel() - 1)
    is_entry_GW = table.entries_GW < gpus_MY.numel()
    for _ in range(rounds):
        ahead_MY = _extrapolate(share_MY, previous_MY, tokens_M, valid_MY, momentum)
        loads_G = fixed_G + torch.where(is_entry_GW, ahead_MY.reshape(-1)[entry_GW], 0.0).sum(1)
        base_MY = torch.cat([loads_G, absent])[gpus_MY] - ahead_MY
        previous_MY = share_MY
        share_MY = ahead_MY + table.step_M1 * (_water_fill(tokens_M, base_MY) - ahead_MY)
    return share_MY


def _checked_layer(phy2log_P, slots_per_gpu: int, num_experts: int, weights_P) -> tuple[np.ndarray, np.ndarray | None]:
    """phy2log_P as int64 and weights_P as float64 (or None), or `PlacementFormatError` naming what is wrong."""
    phy2log = np.asarray(phy2log_P)
    if phy2log.ndim != 1 or phy2log.dtype.kind not in "iu":
        raise PlacementFormatError(
            f"phy2log_P must be a 1-D integer array of slots; got shape {phy2log.shape}, dtype {phy2log.dtype}"
        )
    if not isinstance(slots_per_gpu, (int, np.integer)) or slots_per_gpu < 1:
        raise PlacementFormatError(f"slots_per_gpu must be a positive integer; got {slots_per_gpu!r}")
    if len(phy2log) == 0 or len(phy2log) % slots_per_gpu:
        raise PlacementFormatError(
            f"phy2log_P has {len(phy2log)} slots, not a positive multiple of slots_per_gpu={slots_per_gpu}"
        )
    phy2log = phy2log.astype(np.int64)
    if phy2log.min() < 0 or phy2log.max() >= num_experts:
        raise PlacementFormatError(
            f"phy2log_P holds expert ids in [{phy2log.min()}, {phy2log.max()}]; expected [0, {num_experts}) for "
            f"num_experts={num_experts}"
        )
    missing = np.flatnonzero(np.bincount(phy2log, minlength=num_experts) == 0)
    if len(missing):
        raise PlacementFormatError(
            f"expert {missing[0]} has no slot in phy2log_P ({len(missing)} of num_experts={num_experts} lack one); "
            f"its tokens could not be routed"
        )
    if weights_P is None:
        return phy2log, None
    weights = np.asarray(weights_P, dtype=np.float64)
    if weights.shape != phy2log.shape:
        raise PlacementFormatError(f"weights_P must have shape {phy2log.shape} like phy2log_P; got {weights.shape}")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise PlacementFormatError("weights_P must be finite and >= 0")
    worst = np.abs(np.bincount(phy2log, weights, minlength=num_experts) - 1.0).max()
    if worst > WEIGHT_TOLERANCE:
        raise PlacementFormatError(f"weights_P must sum to 1 over each expert's slots; worst sum is off by {worst:.3g}")
    return phy2log, weights


def _check_counts(counts_E: torch.Tensor, table: LayerRoutingTable, check_values: bool) -> None:
    """ValueError unless counts_E is an integer tensor of shape [E] (and, with check_values, >= 0)."""
    dtype = counts_E.dtype if isinstance(counts_E, torch.Tensor) else None
    if dtype is None or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        found = f"dtype {dtype}" if dtype is not None else type(counts_E).__name__
        raise ValueError(f"counts_E must be an integer torch tensor of tokens per expert; got {found}")
    if counts_E.shape != (table.num_experts,):
        raise ValueError(
            f"counts_E must have shape [{table.num_experts}] (the table's experts); got {list(counts_E.shape)}"
        )
    if check_values and bool((counts_E < 0).any()):
        raise ValueError(f"counts_E must be >= 0; found {int(counts_E.min())}")


def _extrapolate(share_MY: torch.Tensor, previous_MY: torch.Tensor, tokens_M: torch.Tensor, valid_MY: torch.Tensor,
                 momentum: float) -> torch.Tensor:
    """share + momentum * (share - previous), projected to a valid split (as `dynamic_split.extrapolate`).

    Each row's extrapolation sums to its tokens, so a row with tokens keeps a positive entry after clamping.
    """
    ahead = (share_MY + momentum * (share_MY - previous_MY)).clamp_min_(0.0).mul_(valid_MY)
    return ahead.mul_(tokens_M[:, None] / ahead.sum(1, keepdim=True).clamp_min_(1e-30))


def _water_fill(tokens_M: torch.Tensor, base_MY: torch.Tensor) -> torch.Tensor:
    """Spread tokens_M over bins at levels base_MY (inf = absent), raising the lowest bins evenly."""
    sorted_base = _sorted_rows(base_MY)
    finite = torch.where(torch.isfinite(sorted_base), sorted_base, torch.zeros_like(sorted_base))
    k = torch.arange(1, base_MY.shape[1] + 1, device=base_MY.device, dtype=base_MY.dtype)
    level_k = (tokens_M[:, None] + prefix_sums(finite, 1)) / k
    active = (sorted_base < level_k) | (k == 1)
    level = level_k.gather(1, active.sum(1, keepdim=True) - 1)
    return torch.where(torch.isfinite(base_MY), (level - base_MY).clamp_min(0.0), torch.zeros_like(base_MY))


def _sorted_rows(values_MY: torch.Tensor) -> torch.Tensor:
    """values_MY sorted along each row. Compiled, for a few columns: an odd-even transposition network of
    elementwise minima and maxima, which the compiler fuses with the rest of a water-filling round (a sort is a
    separate kernel, one per round); the same values as `sort`, which runs eagerly (fewer, larger operations)."""
    width = values_MY.shape[1]
    if width > UNROLL_MAX or not torch.compiler.is_compiling():
        return values_MY.sort(dim=1).values
    columns = list(values_MY.unbind(1))
    for phase in range(width):
        for left in range(phase % 2, width - 1, 2):
            low, high = columns[left], columns[left + 1]
            columns[left], columns[left + 1] = torch.minimum(low, high), torch.maximum(low, high)
    return torch.stack(columns, 1)


def round_preserving_sums(share_MY: torch.Tensor, tokens_M: torch.Tensor, valid_MY: torch.Tensor) -> torch.Tensor:
    """[M, Y] int64, a whole-token split of share_MY [M, Y] (float) that gives row m exactly tokens_M[m] (int64),
    only where valid_MY [M, Y] is True: floor each share, then hand the leftover tokens to the largest remainders
    (ties to the lower column, so the result is deterministic)."""
    share = torch.where(valid_MY, share_MY.clamp_min(0.0), torch.zeros_like(share_MY))
    scale = tokens_M.to(share.dtype) / share.sum(1).clamp_min(1e-9)
    share = share * scale[:, None]
    floor = share.floor().to(torch.int64)
    leftover = tokens_M - floor.sum(1)
    remainder = torch.where(valid_MY, share - floor.to(share.dtype), torch.full_like(share, -1.0))
    # rank_MY: how many entries of the row come first, by larger remainder, then lower column.
    column = torch.arange(share.shape[1], device=share.device)
    ahead_MYY = (remainder[:, None, :] > remainder[:, :, None]) | (
        (remainder[:, None, :] == remainder[:, :, None]) & (column[None, :] < column[:, None])
    )
    rank_MY = ahead_MYY.sum(2)
    return floor + (rank_MY < leftover[:, None]).to(torch.int64)
