"""Keep experts where they are: a new placement relabelled against the map now serving, so vLLM copies the fewest
expert weights.

Legend (docs/shapes.md): L layers, E logical experts, P slots (num_replicas), G GPUs (ranks), S slots per GPU,
B rows handled as one batch ((layer, GPU) pairs).

Three steps, each keeping the per-GPU loads of the new placement exactly:
- `old_map_on_new_ranks`: the old map [L, P_old] read on the new group. vLLM keeps S when ranks come or go and
  numbers the surviving ranks first, so old slot p is new slot p for p < min(P_old, P); slots past the old map
  (ranks that joined) count as unused (-1), slots past the new map (ranks that left) are dropped.
- `keep_in_place` (the cpsat policy): GPUs relabelled inside their node, whole nodes swapped, slots reordered
  inside their GPU, so that the fewest experts move (`placement.migration.realise_in_place`).
- `preserve_intragpu_slots` (both policies; vLLM's rule of the same name in `DefaultEplbPolicy`): on each GPU an
  expert that the new placement keeps there stays in its old slot; the experts coming in take the remaining slots
  in slot order.
"""

import numpy as np

from placement import ClusterSpec, Placement
from placement.migration import realise_in_place
from placement.cluster import MAX_SLOTS, MAX_SLOTS_PER_GPU


def old_map_on_new_ranks(old_LP: np.ndarray, num_slots: int) -> np.ndarray:
    """[L, num_slots] int64: `old_LP` [L, P_old] cut to the surviving ranks' slots or padded with -1 (unused) for
    the ranks that joined; slot p keeps its index (the surviving ranks come first, S unchanged)."""
    num_layers, old_slots = old_LP.shape
    if old_slots >= num_slots:
        return old_LP[:, :num_slots]
    return np.concatenate([old_LP, np.full((num_layers, num_slots - old_slots), -1, dtype=np.int64)], axis=1)


def preserve_intragpu_slots(new_LP: np.ndarray, old_LP: np.ndarray, num_gpus: int) -> np.ndarray:
    """[L, P] int64: `new_LP` with the slots of each GPU reordered so that its experts the old map `old_LP` [L, P]
    held on that GPU stay in their old slots.

    Per (layer, GPU), old slots in ascending order each claim the first unclaimed new slot holding the same expert
    (-1 claims nothing); the unclaimed new experts, in their new order, fill the unclaimed old slots in ascending
    order. This is vLLM's `DefaultEplbPolicy.preserve_intragpu_slots`, result for result.
    """
    num_layers, num_slots = new_LP.shape
    slots = num_slots // num_gpus
    new_BS = new_LP.reshape(-1, slots)
    old_BS = old_LP.reshape(-1, slots)
    rows = np.arange(new_BS.shape[0])
    claimed_BS = np.zeros(new_BS.shape, dtype=bool)  # claimed[b, t]: new slot t was matched to an old slot
    kept_BS = np.zeros(new_BS.shape, dtype=bool)  # kept[b, s]: old slot s keeps its expert
    result_BS = np.empty_like(new_BS)
    for slot in range(slots):
        match_BS = (new_BS == old_BS[:, slot : slot + 1]) & ~claimed_BS
        found_B = match_BS.any(axis=1)
        first_B = match_BS.argmax(axis=1)
        claimed_BS[rows[found_B], first_B[found_B]] = True
        kept_BS[found_B, slot] = True
    result_BS[kept_BS] = old_BS[kept_BS]
    # The r-th unkept old slot receives the r-th unclaimed new slot's expert; both counts are S - kept per row.
    unkept_first = np.argsort(kept_BS, axis=1, kind="stable")
    unclaimed_first = np.argsort(claimed_BS, axis=1, kind="stable")
    moving_BS = np.arange(slots) < (~kept_BS).sum(axis=1, keepdims=True)  # [b, r]: r < the row's unkept slots
    row_BS = np.broadcast_to(rows[:, None], moving_BS.shape)
    incoming_BS = np.take_along_axis(new_BS, unclaimed_first, axis=1)
    result_BS[row_BS[moving_BS], unkept_first[moving_BS]] = incoming_BS[moving_BS]
    return result_BS.reshape(num_layers, num_slots)


def keep_in_place(old_LP: np.ndarray, new: Placement) -> Placement:
    """`new` relabelled (GPUs inside their node, nodes, slots inside their GPU: the same per-GPU loads) so that the
    fewest experts move from the old map `old_LP` [L, P] (-1 = an unused slot).

    `realise_in_place` compares two placements in which every expert has a slot; an old map may leave slots unused
    and experts out. Both maps are therefore widened by the same k slots at the head of every GPU, holding a
    stand-in id E and, per layer, the experts the old layer lacks; the old map's unused slots hold E too. The head
    adds the same count of shared experts to every pair of GPUs, so the cheapest relabelling is unchanged, and it
    stays in place, so dropping it leaves the relabelled `new`. When the widened group would pass the cluster's size
    bounds, `new` is returned as it is (`preserve_intragpu_slots` still keeps what stays on each GPU).
    """
    num_layers = old_LP.shape[0]
    cluster, num_experts = new.cluster, new.num_experts
    held_LE = _replica_counts_LE(old_LP, num_experts) > 0
    if (old_LP >= 0).all() and held_LE.all():
        return realise_in_place(Placement.equal_split(old_LP, cluster, num_experts), new)[0]
    stand_in = num_experts
    width = 1 + int((~held_LE).sum(axis=1).max())
    slots = cluster.slots_per_gpu + width
    if slots > MAX_SLOTS_PER_GPU or cluster.num_gpus * slots > MAX_SLOTS:
        return new
    head = np.full((num_layers, width), stand_in, dtype=np.int64)  # [L, width]: the head of every GPU, per layer
    for layer in range(num_layers):
        lacking = np.flatnonzero(~held_LE[layer])
        head[layer, 1 : 1 + len(lacking)] = lacking
    wide = ClusterSpec(num_gpus=cluster.num_gpus, slots_per_gpu=slots, gpus_per_node=cluster.gpus_per_node)

    def widened(map_LP: np.ndarray) -> Placement:
        map_LGS = map_LP.reshape(num_layers, cluster.num_gpus, cluster.slots_per_gpu)
        head_by_gpu = np.broadcast_to(head[:, None, :], (num_layers, cluster.num_gpus, width))  # [L, G, width]
        return Placement.equal_split(np.concatenate([head_by_gpu, map_LGS], axis=2).reshape(num_layers, -1), wide,
                                     num_experts + 1)

    realised = realise_in_place(widened(np.where(old_LP < 0, stand_in, old_LP)), widened(new.phy2log_LP))[0]
    kept_LP = realised.phy2log_LP.reshape(num_layers, cluster.num_gpus, slots)[:, :, width:].reshape(num_layers, -1)
    return Placement.equal_split(kept_LP, cluster, num_experts, new.policy, new.info)


def _replica_counts_LE(map_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """[L, E] int64: slots of each expert in `map_LP` (-1 entries not counted)."""
    counts = np.zeros((map_LP.shape[0], num_experts + 1), dtype=np.int64)
    np.add.at(counts, (np.arange(map_LP.shape[0])[:, None], np.where(map_LP < 0, num_experts, map_LP)), 1)
    return counts[:, :num_experts]
