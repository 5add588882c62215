"""Migration plans: the fewest expert copies that turn the placement now serving into a new one.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, H nodes, V moves, X = most replicas.

Two freedoms make a switch from `current` to `target` cheaper without changing the target's balance:

1. the S slots of a GPU are interchangeable, so an expert a GPU already holds stays in the slot it occupies;
2. the target's GPUs may be relabelled: target GPU j may be realised on physical GPU `gpu_map_G[j]`. The map
   is the same for all layers (a GPU holds every layer's slots) and keeps node structure: GPUs move only inside
   a node, and with `permute_nodes` whole nodes may also trade places (all of a target node's GPUs then land on
   one physical node), so GPUs that share a node in the target still share one.

Example (one layer, 3 experts, 2 GPUs x 2 slots): current `phy2log` [0, 1 | 2, 0], target [2, 1 | 0, 1].
Slot by slot, 3 slots change (`oblivious_moves`). Realising target GPU 0 ({2, 1}) on GPU 1 and target GPU 1
({0, 1}) on GPU 0 needs one copy: expert 1 from GPU 0 into slot 3, where GPU 1 holds 0 now; expert 2 stays in
slot 2. The realised `phy2log` is [0, 1 | 2, 1] and `gpu_map_G` is [1, 0].

The relabelling is a minimum-cost assignment. Multisets are compared through keys `e * S + k`, where k ranks the
replicas of expert e on one GPU and layer (two replicas of e on one GPU are keys (e, 0) and (e, 1)), so the
multiset intersection of two GPUs is the number of keys they share.

Executing a plan (the executor's invariants, not checked here): every move reads the expert from its source
GPU's `current` weights, and a source GPU may itself receive other experts in the same layer, so all reads of a
layer finish (or are staged into a buffer) before any of that layer's destination slots is overwritten; the
router serves a layer from `current` until that layer's moves are done and from `realised` after.
"""

from dataclasses import dataclass

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError
from placement.placement_model import Placement


@dataclass(frozen=True)
class MigrationPlan:
    """How to go from the placement now serving to a new one.

    Attributes:
        realised: the placement that will serve after the moves: the target with GPU j's slots on physical GPU
            `gpu_map_G[j]`, in an order that keeps experts already present in place. Per GPU it holds the same
            expert multiset, with the same weights, as the target GPU mapped there.
        gpu_map_G: [G] int64, target GPU j is realised on physical GPU gpu_map_G[j] (a permutation).
        moves: [V, 4] int64, one row per slot whose expert must be copied in: (layer, destination slot, expert,
            source GPU), sorted by layer then slot. The source GPU holds the expert in `current` for that layer;
            it equals the destination's GPU only when that GPU needs one more replica of an expert it holds.
        bytes_moved: V * bytes_per_expert.
    """

    realised: Placement
    gpu_map_G: np.ndarray
    moves: np.ndarray
    bytes_moved: int

    @property
    def num_moves(self) -> int:
        """V: slots whose expert is copied in."""
        return int(self.moves.shape[0])

    def moves_per_layer(self) -> np.ndarray:
        """[L] int64: moves of each layer."""
        return np.bincount(self.moves[:, 0], minlength=self.realised.num_layers).astype(np.int64)

    def summary(self) -> dict:
        """Counts for logs and JSON output; sends and receives count copies between different GPUs only."""
        cluster = self.realised.cluster
        dest_gpu = self.moves[:, 1] // cluster.slots_per_gpu
        source_gpu = self.moves[:, 3]
        remote = source_gpu != dest_gpu
        sends_G = np.bincount(source_gpu[remote], minlength=cluster.num_gpus)
        receives_G = np.bincount(dest_gpu[remote], minlength=cluster.num_gpus)
        per_layer = self.moves_per_layer()
        return {
            "num_moves": self.num_moves,
            "bytes_moved": int(self.bytes_moved),
            "layers_touched": int((per_layer > 0).sum()),
            "max_sends_per_gpu": int(sends_G.max()),
            "max_receives_per_gpu": int(receives_G.max()),
            "local_copies": int((~remote).sum()),
            "cross_node_moves": int((source_gpu // cluster.node_size != dest_gpu // cluster.node_size).sum()),
            "gpus_relabelled": int((self.gpu_map_G != np.arange(cluster.num_gpus)).sum()),
        }


def plan_migration(
    current: Placement, target: Placement, bytes_per_expert: int = 1, *, permute_nodes: bool = True,
    relabel_gpus: bool = True,
) -> MigrationPlan:
    """The cheapest way (fewest expert copies) to make `target` serve where `current` serves now.

    Args:
        current: the placement now serving.
        target: the placement to switch to; its per-GPU load balance is kept exactly.
        bytes_per_expert: size of one expert's weights in one layer, for `bytes_moved`.
        permute_nodes: also let whole nodes trade places (GPUs always may move inside their node).
        relabel_gpus: False: target GPU j is realised on GPU j (`gpu_map_G` the identity; only the slots inside a GPU
            are matched), for a target already in the serving GPUs' labels, as a burst patch of them is.

    Returns:
        A plan whose moves number min over allowed GPU relabellings of sum over (layer, GPU) of
        S - |target GPU's experts ∩ current GPU's experts| (multisets); never more than `oblivious_moves`.

    Raises:
        PlacementFormatError: the two placements are for different model shapes or clusters.
        ValueError: `bytes_per_expert` is negative.
    """
    if bytes_per_expert < 0:
        raise ValueError(f"bytes_per_expert must be >= 0; found {bytes_per_expert}")
    realised, gpu_map_G, kept_LP = realise_in_place(current, target, permute_nodes=permute_nodes,
                                                    relabel_gpus=relabel_gpus)
    # Step 3: one move per slot not kept, each from a GPU that holds the expert in `current`.
    layer_V, slot_V = np.nonzero(~kept_LP)
    expert_V = realised.phy2log_LP[layer_V, slot_V]
    source_V = _choose_sources(current, layer_V, slot_V, expert_V)
    moves = np.stack([layer_V, slot_V, expert_V, source_V], axis=1).astype(np.int64)
    return MigrationPlan(realised, gpu_map_G, moves, int(moves.shape[0]) * int(bytes_per_expert))


def realise_in_place(
    current: Placement, target: Placement, *, permute_nodes: bool = True, relabel_gpus: bool = True,
) -> tuple[Placement, np.ndarray, np.ndarray]:
    """Steps 1 and 2 of `plan_migration` (same arguments): `target` relabelled and reordered to keep the most of
    `current` in place, without choosing where each copy comes from (a caller that needs only the new map).

    Returns:
        (realised, gpu_map_G [G] int64, kept_LP [L, P] bool: slot p keeps the expert it holds now), as in
        `MigrationPlan`.
    """
    _check_same_shape(current, target)
    cluster = current.cluster
    num_layers, num_gpus, slots = current.num_layers, cluster.num_gpus, cluster.slots_per_gpu
    shape_LGS = (num_layers, num_gpus, slots)
    target_LGS, target_weights_LGS = target.phy2log_LP.reshape(shape_LGS), target.weights_LP.reshape(shape_LGS)
    current_keys = _multiset_keys(current.phy2log_LP.reshape(shape_LGS), current.weights_LP.reshape(shape_LGS), slots)
    target_keys = _multiset_keys(target_LGS, target_weights_LGS, slots)

    # Step 1: relabel the target's GPUs so that they share the most experts with the physical GPUs.
    gpu_map_G = np.arange(num_gpus, dtype=np.int64)
    if relabel_gpus:
        shared_GG = _shared_experts(target_keys, current_keys, current.num_experts * slots)
        cost_GG = num_layers * slots - shared_GG  # cost[j, i]: copies if target GPU j is realised on GPU i
        gpu_map_G = _relabel_gpus(cost_GG, cluster, permute_nodes)
    target_of_gpu_G = np.argsort(gpu_map_G)  # physical GPU i realises target GPU target_of_gpu_G[i]

    # Step 2: inside each GPU keep what is already there; new experts go to the freed slots in slot order.
    moved_keys = target_keys[:, target_of_gpu_G]
    source_slot_LGS, kept_LGS = _assign_slots(current_keys, moved_keys)
    experts_LGS = np.take_along_axis(target_LGS[:, target_of_gpu_G], source_slot_LGS, axis=-1)
    weights_LGS = np.take_along_axis(target_weights_LGS[:, target_of_gpu_G], source_slot_LGS, axis=-1)
    info = dict(target.info)
    info["migration"] = {"gpu_map": gpu_map_G.tolist(), "num_moves": int((~kept_LGS).sum())}
    realised = Placement(
        experts_LGS.reshape(num_layers, -1), weights_LGS.reshape(num_layers, -1), cluster, target.num_experts,
        target.policy, info,
    )
    return realised, gpu_map_G, kept_LGS.reshape(num_layers, -1)


def oblivious_moves(current: Placement, target: Placement) -> int:
    """Slots whose expert differs between `current` and `target`, slot by slot (the remap that ignores both
    freedoms); the baseline a plan is compared with."""
    _check_same_shape(current, target)
    return int((current.phy2log_LP != target.phy2log_LP).sum())


def _check_same_shape(current: Placement, target: Placement) -> None:
    if (current.num_layers, current.num_experts) != (target.num_layers, target.num_experts):
        raise PlacementFormatError(
            f"cannot migrate between model shapes: current is {current.num_layers} layers x {current.num_experts} "
            f"experts, target is {target.num_layers} layers x {target.num_experts}; fit the target on the same model"
        )
    if current.cluster != target.cluster:
        raise PlacementFormatError(
            f"cannot migrate between clusters: current is for {_describe(current.cluster)}, target for "
            f"{_describe(target.cluster)}; fit the target on the cluster now serving"
        )


def _describe(cluster: ClusterSpec) -> str:
    return f"{cluster.num_gpus} GPUs x {cluster.slots_per_gpu} slots ({cluster.gpus_per_node} per node)"


def _multiset_keys(experts_LGS: np.ndarray, weights_LGS: np.ndarray, slots: int) -> np.ndarray:
    """[L, G, S] int64: expert * S + k, unique per GPU and layer.

    k ranks the replicas of one expert on one GPU by (weight, slot), so that duplicates are matched lightest to
    lightest and a target that only shuffles the current one is realised with every weight in place. One sort per
    (layer, GPU) by (expert, weight, slot); k is the position within the expert's run.
    """
    rows_RS = experts_LGS.reshape(-1, slots)
    slot_RS = np.broadcast_to(np.arange(slots), rows_RS.shape)
    order_RS = np.lexsort((slot_RS, weights_LGS.reshape(-1, slots), rows_RS), axis=-1)
    sorted_RS = np.take_along_axis(rows_RS, order_RS, axis=-1)
    starts_RS = np.ones(sorted_RS.shape, dtype=bool)
    starts_RS[:, 1:] = sorted_RS[:, 1:] != sorted_RS[:, :-1]
    run_start_RS = np.maximum.accumulate(np.where(starts_RS, slot_RS, 0), axis=-1)
    rank_RS = np.empty_like(order_RS)
    np.put_along_axis(rank_RS, order_RS, slot_RS - run_start_RS, axis=-1)
    return (rows_RS * slots + rank_RS).reshape(experts_LGS.shape)


def _shared_experts(keys_a_LGS: np.ndarray, keys_b_LGS: np.ndarray, keys_per_layer: int) -> np.ndarray:
    """[G, G] int64: shared[j, i] = sum over layers of |multiset of GPU j in a ∩ multiset of GPU i in b|."""
    from scipy.sparse import csr_matrix  # scipy is imported where it is used: the command line starts without it

    num_layers, num_gpus, slots = keys_a_LGS.shape
    row = np.broadcast_to(np.arange(num_gpus)[None, :, None], keys_a_LGS.shape).ravel()
    layer_offset = (np.arange(num_layers) * keys_per_layer)[:, None, None]
    shape = (num_gpus, num_layers * keys_per_layer)
    ones = np.ones(row.size, dtype=np.int64)
    # has_a[j, (l, key)] == 1 iff GPU j holds that key in layer l of a (keys are unique per GPU and layer)
    has_a = csr_matrix((ones, (row, (keys_a_LGS + layer_offset).ravel())), shape=shape)
    has_b = csr_matrix((ones, (row, (keys_b_LGS + layer_offset).ravel())), shape=shape)
    return np.asarray((has_a @ has_b.T).toarray(), dtype=np.int64)


def _relabel_gpus(cost_GG: np.ndarray, cluster: ClusterSpec, permute_nodes: bool) -> np.ndarray:
    """[G] int64: the physical GPU of each target GPU, minimising the summed cost over maps that keep nodes whole."""
    from scipy.optimize import linear_sum_assignment

    num_gpus, node_size, num_nodes = cluster.num_gpus, cluster.node_size, cluster.num_nodes
    # Tie-break: among optimal maps take one that moves the fewest GPUs; the added terms total < G + 1, the
    # smallest real cost difference scaled.
    price_GG = cost_GG * (num_gpus + 1) + (1 - np.eye(num_gpus, dtype=np.int64))
    # [H, G / H, H, G / H]: the price of (target node, its GPU, physical node, its GPU).
    price_by_node = price_GG.reshape(num_nodes, node_size, num_nodes, node_size)
    inner = {}  # (target node, physical node) -> (cost, physical GPU within the node of each target GPU)
    may_swap = permute_nodes and num_nodes > 1
    nodes = range(num_nodes)
    pairs = [(m, n) for m in nodes for n in nodes] if may_swap else [(m, m) for m in nodes]
    for m, n in pairs:
        block = price_by_node[m, :, n, :]
        rows, cols = linear_sum_assignment(block)
        inner[m, n] = (int(block[rows, cols].sum()), cols[np.argsort(rows)])
    node_map = np.arange(num_nodes)
    if may_swap:
        node_cost = np.array([[inner[m, n][0] for n in range(num_nodes)] for m in range(num_nodes)])
        rows, cols = linear_sum_assignment(node_cost)
        node_map = cols[np.argsort(rows)]
    gpu_map_G = np.empty(num_gpus, dtype=np.int64)
    for m, n in enumerate(node_map.tolist()):
        gpu_map_G[m * node_size : (m + 1) * node_size] = n * node_size + inner[m, n][1]
    return gpu_map_G


def _assign_slots(current_keys_LGS: np.ndarray, target_keys_LGS: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which target slot of the same GPU each slot takes, keeping shared experts in place.

    Returns:
        source_slot_LGS: [L, G, S] int64, the slot of the target GPU (mapped here) whose expert slot s receives.
        kept_LGS: [L, G, S] bool, slot s keeps the expert it holds now (no move).
    """
    # Keys are unique per (layer, GPU): offset each row's keys past the previous row's and look every current key
    # up among the target's sorted keys; match_LGS[l, g, s] is the target slot holding current slot s's key.
    shape, slots = current_keys_LGS.shape, current_keys_LGS.shape[-1]
    span = int(max(current_keys_LGS.max(), target_keys_LGS.max())) + 1
    offset_R1 = (np.arange(current_keys_LGS.size // slots, dtype=np.int64) * span)[:, None]
    target_flat = (target_keys_LGS.reshape(-1, slots) + offset_R1).ravel()
    current_flat = (current_keys_LGS.reshape(-1, slots) + offset_R1).ravel()
    order = np.argsort(target_flat, kind="stable")
    found = np.minimum(np.searchsorted(target_flat[order], current_flat), len(order) - 1)
    kept_LGS = (target_flat[order][found] == current_flat).reshape(shape)
    match_LGS = (order[found] % slots).reshape(shape)
    kept_RS = kept_LGS.reshape(-1, slots)
    placed_RS = np.zeros(kept_RS.shape, dtype=bool)  # placed[r, t]: target slot t's key is held now
    placed_RS[np.nonzero(kept_RS)[0], match_LGS.reshape(-1, slots)[kept_RS]] = True
    placed_LGS = placed_RS.reshape(shape)
    # The r-th freed slot (ascending) gets the r-th unplaced target slot (ascending); ranks past the freed
    # slots land on kept slots and are overwritten by the match below.
    freed_first = np.argsort(kept_LGS, axis=-1, kind="stable")
    unplaced_first = np.argsort(placed_LGS, axis=-1, kind="stable")
    source_slot_LGS = np.empty_like(freed_first)
    np.put_along_axis(source_slot_LGS, freed_first, unplaced_first, axis=-1)
    source_slot_LGS = np.where(kept_LGS, match_LGS, source_slot_LGS)
    return source_slot_LGS, kept_LGS


def _choose_sources(current: Placement, layer_V: np.ndarray, slot_V: np.ndarray, expert_V: np.ndarray) -> np.ndarray:
    """[V] int64: the GPU each move copies from.

    Preference: the destination GPU itself (a local copy), then a GPU on its node, then the fewest sends so far
    in that layer, then the fewest sends so far in all layers, then the lowest GPU id. Moves with a single
    possible source are counted first, so that the choices spread around the sends they force.
    """
    cluster = current.cluster
    slots, node_size = cluster.slots_per_gpu, cluster.node_size
    holders_LEX = current.log2phy_LEX
    candidates_VX = np.where(holders_LEX >= 0, holders_LEX // slots, -1)[layer_V, expert_V]
    first_V = candidates_VX[:, 0]
    forced_V = ((candidates_VX == first_V[:, None]) | (candidates_VX < 0)).all(axis=1)
    order = np.lexsort((np.arange(len(layer_V)), ~forced_V))  # forced moves first, then in (layer, slot) order
    sends_LG = [[0] * cluster.num_gpus for _ in range(current.num_layers)]
    sends_G = [0] * cluster.num_gpus
    source_V = np.empty(len(layer_V), dtype=np.int64)
    layers, dests, candidates = layer_V.tolist(), (slot_V // slots).tolist(), candidates_VX.tolist()
    for move in order.tolist():
        layer, dest = layers[move], dests[move]
        dest_node, layer_sends = dest // node_size, sends_LG[layer]
        ranked = [
            (gpu != dest, gpu // node_size != dest_node, layer_sends[gpu], sends_G[gpu], gpu)
            for gpu in candidates[move]
            if gpu >= 0
        ]
        best = min(ranked)[-1]
        source_V[move] = best
        if best != dest:
            layer_sends[best] += 1
            sends_G[best] += 1
    return source_V
