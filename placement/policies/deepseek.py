"""The baseline policy: DeepSeek's public EPLB algorithm, written for this project and vectorised over layers.

Legend: L layers, E logical experts, P slots (physical experts), G GPUs, H nodes, Q expert groups, X the most
replicas one expert has, B a batch of independent rows (layers, or layers x nodes), I items to pack.

The algorithm (public EPLB README): (1) pack expert groups onto nodes so node loads are even; (2) inside each node,
give every redundant slot to the expert with the largest load per replica; (3) pack the replicas, heaviest first,
onto the lightest GPU of the node that still has a free slot. The global policy is the same with one group and one
node. The only loops run over slots, never over layers.

Ties. Among equal loads per replica, step 2 takes the lowest index, and each packing puts an item on the lightest
pack with room that has the lowest index, as the public implementation does. The order in which a packing visits
equally heavy items (in step 3 often the replicas of one expert) decides which slot each gets, hence which GPU holds
which replica and the order of an expert's slots in `log2phy`. `Arithmetic` says how loads are summed, divided and
sorted. The default, float64 with a stable sort (equal items in index order), gives the same result on every
platform and reproduces the published example; offline fits use it. DeepSeek's `eplb.py` sums and divides in
float32 and orders items with `torch.sort(descending=True)`, whose order of equal items is not the stable one on
long rows; the drop-in `eplb.rebalance_experts` passes that arithmetic (`TORCH_ARITHMETIC`) and so returns
`eplb.py`'s output exactly.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import PlacementInfeasibleError
from placement.placement_model import Placement


def stable_heaviest_first(weight_BI: np.ndarray) -> np.ndarray:
    """[B, I] int64: each row's item indices by descending weight, equal weights in index order."""
    return np.argsort(-weight_BI, axis=1, kind="stable")


def sum_last_axis(array: np.ndarray) -> np.ndarray:
    """[B, Q] from array [B, Q, E / Q] (the loads of each group's experts): numpy's sums over the last axis."""
    return array.sum(axis=-1)


@dataclass(frozen=True)
class Arithmetic:
    """How the policy sums, divides and sorts loads.

    Attributes:
        dtype: the float type of every load, sum, quotient and pack total.
        heaviest_first: [B, I] -> [B, I] int64, each row's item indices by descending weight (ties in any order the
            function chooses; the packing follows it).
        sum_last: [B, Q, E / Q] -> [B, Q], sums over the last axis (the group loads of step 1).
    """

    dtype: type = np.float64
    heaviest_first: Callable[[np.ndarray], np.ndarray] = stable_heaviest_first
    sum_last: Callable[[np.ndarray], np.ndarray] = sum_last_axis


FLOAT64_STABLE = Arithmetic()


def replicate_greedy(load_BE: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give each of the `num_slots - E` redundant slots to the expert with the largest load per replica.

    Args:
        load_BE: [B, E] float, load of each expert in each row; the loads per replica are computed in its dtype.
        num_slots: P >= E, slots per row.

    Returns:
        phy2log_BP: [B, P] int64, the expert each slot holds (slot e < E holds expert e).
        rank_BP: [B, P] int64, the replica index of each slot among its expert's replicas.
        logcnt_BE: [B, E] int64, replicas per expert.
    """
    load_BE = _as_float(load_BE)
    rows, num_experts = load_BE.shape
    phy2log = np.empty((rows, num_slots), dtype=np.int64)
    phy2log[:, :num_experts] = np.arange(num_experts)
    rank = np.zeros((rows, num_slots), dtype=np.int64)
    logcnt = np.ones((rows, num_experts), dtype=np.int64)
    row = np.arange(rows)
    for slot in range(num_experts, num_slots):
        best = np.argmax(load_BE / logcnt.astype(load_BE.dtype), axis=1)
        phy2log[:, slot] = best
        rank[:, slot] = logcnt[row, best]
        logcnt[row, best] += 1
    return phy2log, rank, logcnt


def pack_balanced(
    weight_BI: np.ndarray, num_packs: int, heaviest_first: Callable[[np.ndarray], np.ndarray] = stable_heaviest_first
) -> tuple[np.ndarray, np.ndarray]:
    """Pack I items into `num_packs` packs of I / num_packs items each, heaviest item first onto the lightest pack.

    Args:
        weight_BI: [B, I] float, the weight of each item; pack totals are summed in its dtype.
        num_packs: packs per row; must divide I.
        heaviest_first: the order in which items are packed (see `Arithmetic.heaviest_first`).

    Returns:
        pack_BI: [B, I] int64, the pack of each item.
        rank_BI: [B, I] int64, the item's position inside its pack (order of arrival).
    """
    weight_BI = _as_float(weight_BI)
    rows, num_items = weight_BI.shape
    capacity = num_items // num_packs
    if capacity == 1:
        return np.broadcast_to(np.arange(num_items), (rows, num_items)).copy(), np.zeros((rows, num_items), np.int64)
    order_BI = heaviest_first(weight_BI)
    row = np.arange(rows)
    pack_weight = np.zeros((rows, num_packs), dtype=weight_BI.dtype)
    pack_items = np.zeros((rows, num_packs), dtype=np.int64)
    pack = np.empty((rows, num_items), dtype=np.int64)
    rank = np.empty((rows, num_items), dtype=np.int64)
    for position in range(num_items):
        item = order_BI[:, position]
        chosen = np.argmin(np.where(pack_items < capacity, pack_weight, np.inf), axis=1)
        pack[row, item] = chosen
        rank[row, item] = pack_items[row, chosen]
        pack_weight[row, chosen] += weight_BI[row, item]
        pack_items[row, chosen] += 1
    return pack, rank


def _as_float(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    return array if np.issubdtype(array.dtype, np.floating) else array.astype(np.float64)


def _inverse(perm_BI: np.ndarray) -> np.ndarray:
    inverse = np.empty_like(perm_BI)
    np.put_along_axis(inverse, perm_BI, np.broadcast_to(np.arange(perm_BI.shape[1]), perm_BI.shape), axis=1)
    return inverse


def rebalance_hierarchical(
    load_LE: np.ndarray,
    num_slots: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    arithmetic: Arithmetic = FLOAT64_STABLE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepSeek's hierarchical policy (global when num_groups = num_nodes = 1).

    Args:
        load_LE: [L, E] float, load per logical expert.
        num_slots: P, slots in the whole group; divisible by num_gpus.
        num_groups: expert groups; divisible by num_nodes, dividing E.
        num_nodes: H, nodes; dividing num_gpus.
        num_gpus: G.
        arithmetic: how loads are summed, divided and sorted (the tie order; see the module docstring).

    Returns:
        phy2log_LP: [L, P] int64; rank_LP: [L, P] int64 replica index; logcnt_LE: [L, E] int64.
    """
    load_LE = np.asarray(load_LE).astype(arithmetic.dtype)
    num_layers, num_experts = load_LE.shape
    group_size = num_experts // num_groups
    groups_per_node = num_groups // num_nodes
    slots_per_gpu = num_slots // num_gpus
    experts_per_node = num_experts // num_nodes

    # Step 1: pack expert groups onto nodes; mlog numbers experts node by node ("meta-logical" order).
    load_per_group = arithmetic.sum_last(load_LE.reshape(num_layers, num_groups, group_size))
    group_pack, group_rank = pack_balanced(load_per_group, num_nodes, arithmetic.heaviest_first)
    first_mlog = (group_pack * groups_per_node + group_rank) * group_size
    log2mlog = (first_mlog[:, :, None] + np.arange(group_size)).reshape(num_layers, num_experts)
    mlog2log = _inverse(log2mlog)

    # Step 2: replicate experts inside each node: rows are (layer, node).
    load_per_mlog = np.take_along_axis(load_LE, mlog2log, axis=1).reshape(-1, experts_per_node)
    phy2mlog, phy_rank, mlogcnt = replicate_greedy(load_per_mlog, num_slots // num_nodes)

    # Step 3: pack replicas onto the GPUs of their node.
    load_per_phy = np.take_along_axis(load_per_mlog / mlogcnt.astype(load_LE.dtype), phy2mlog, axis=1)
    gpu_pack, gpu_rank = pack_balanced(load_per_phy, num_gpus // num_nodes, arithmetic.heaviest_first)
    pphy2phy = _inverse(gpu_pack * slots_per_gpu + gpu_rank)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1).reshape(num_layers, num_nodes, -1)
    pphy2mlog = (pphy2mlog + (np.arange(num_nodes) * experts_per_node)[None, :, None]).reshape(num_layers, -1)
    phy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=1)
    rank = np.take_along_axis(phy_rank, pphy2phy, axis=1).reshape(num_layers, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, axis=1)
    return phy2log, rank, logcnt


def deepseek_rebalance(
    load_LE: np.ndarray,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    arithmetic: Arithmetic = FLOAT64_STABLE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The public `rebalance_experts` interface: hierarchical when num_groups % num_nodes == 0, else global.

    The arguments are not checked here (`eplb.rebalance_experts` checks them); `arithmetic` sets the tie order.

    Returns:
        phy2log_LP: [L, P] int64; log2phy_LEX: [L, E, X] int64, replicas in replica-rank order padded with -1
        (X = the largest replica count); logcnt_LE: [L, E] int64.
    """
    load = np.asarray(load_LE)
    if num_groups % num_nodes == 0:
        phy2log, rank, logcnt = rebalance_hierarchical(load, num_replicas, num_groups, num_nodes, num_gpus, arithmetic)
    else:
        phy2log, rank, logcnt = rebalance_hierarchical(load, num_replicas, 1, 1, num_gpus, arithmetic)
    num_layers, num_experts = load.shape
    max_replicas = int(logcnt.max())
    log2phy = np.full((num_layers, num_experts * max_replicas), -1, dtype=np.int64)
    np.put_along_axis(log2phy, phy2log * max_replicas + rank, np.arange(num_replicas)[None, :], axis=1)
    return phy2log, log2phy.reshape(num_layers, num_experts, max_replicas), logcnt


def place_deepseek(load_LE: np.ndarray, cluster: ClusterSpec, num_groups: int | None = None) -> Placement:
    """The baseline placement with equal split: hierarchical when `num_groups` is given and divisible by nodes."""
    num_layers, num_experts = load_LE.shape
    cluster.check_fits(num_experts)
    nodes = cluster.num_nodes
    if num_groups is not None and not 1 <= num_groups <= num_experts:
        raise PlacementInfeasibleError(f"num_groups must be between 1 and {num_experts}; got {num_groups}")
    hierarchical = num_groups is not None and num_groups % nodes == 0
    if hierarchical:
        if num_experts % num_groups:
            raise PlacementInfeasibleError(f"num_groups={num_groups} does not divide the {num_experts} experts")
        if (cluster.num_slots // nodes) < num_experts // nodes:
            raise PlacementInfeasibleError("each node needs at least as many slots as experts of its groups")
        phy2log, _, _ = rebalance_hierarchical(load_LE.astype(np.float64), cluster.num_slots, num_groups, nodes,
                                               cluster.num_gpus)
    else:
        phy2log, _, _ = rebalance_hierarchical(load_LE.astype(np.float64), cluster.num_slots, 1, 1, cluster.num_gpus)
    info = {"hierarchical": hierarchical, "num_groups": num_groups}
    return Placement.equal_split(phy2log, cluster, num_experts, "deepseek", info)
