"""The placement a group serves at once after losing GPUs: the survivors keep their slots, the experts whose every
replica was on a lost GPU take slots of redundant replicas (or new slots, when there are too few), and the next
rebalance fits a placement for the smaller group properly.

Legend: L layers, E experts, G GPUs before, G' after, S slots per GPU before, S' after (S' = max(S, ceil(E / G'))).
"""

import math

import numpy as np

from eplb.rebalance.move_plan import Fill, backup_wanted, holders_of, plan_fills
from placement import ClusterSpec, Placement, PlacementInfeasibleError


def placement_without(placement: Placement, lost_gpus: list[int], load_LE: np.ndarray) -> Placement:
    """The placement for the surviving GPUs (in their old order) that serves every expert, fitted cheaply.

    Per layer: survivors keep their experts; each lost expert (heaviest first) goes to an empty slot on the least
    loaded survivor, else replaces a replica of the expert with the most replicas (the lightest per replica among
    those); slots still empty get extra replicas of the experts heaviest per replica. Replicas share their
    expert's tokens equally (the static weights are refitted by the next rebalance).

    Args:
        placement: the placement serving now, on G GPUs.
        lost_gpus: GPU indices (0 <= g < G) that are gone.
        load_LE: [L, E] recent tokens per expert (any non-negative numbers), to choose what to replicate.

    Raises:
        PlacementInfeasibleError: no GPU is left.
    """
    cluster, num_experts = placement.cluster, placement.num_experts
    survivors = [gpu for gpu in range(cluster.num_gpus) if gpu not in set(lost_gpus)]
    if not survivors:
        raise PlacementInfeasibleError(f"every GPU of the group is lost ({sorted(lost_gpus)}); nothing can serve")
    num_gpus, slots = len(survivors), cluster.slots_per_gpu
    new_slots = max(slots, math.ceil(num_experts / num_gpus))
    load = np.maximum(np.asarray(load_LE, dtype=np.float64), 0.0) + 1e-9  # ties broken by expert id below
    experts_LGS = placement.phy2log_LP.reshape(placement.num_layers, cluster.num_gpus, slots)[:, survivors]
    phy2log = np.full((placement.num_layers, num_gpus, new_slots), -1, dtype=np.int64)
    phy2log[:, :, :slots] = experts_LGS
    for layer in range(placement.num_layers):
        _fill_layer(phy2log[layer], load[layer], num_experts)
    gpus_per_node = cluster.gpus_per_node if num_gpus % cluster.gpus_per_node == 0 else num_gpus
    survivor_cluster = ClusterSpec(num_gpus=num_gpus, slots_per_gpu=new_slots, gpus_per_node=gpus_per_node)
    info = {"survived": {"lost_gpus": sorted(int(g) for g in lost_gpus), "from_gpus": cluster.num_gpus}}
    return Placement.equal_split(phy2log.reshape(placement.num_layers, -1), survivor_cluster, num_experts,
                                 policy=placement.policy, info=info)


def _fill_layer(experts_GS: np.ndarray, load_E: np.ndarray, num_experts: int) -> None:
    """Give every expert a slot of experts_GS [G', S'] (-1 = empty), in place."""
    count_E = np.bincount(experts_GS[experts_GS >= 0], minlength=num_experts)

    def gpu_loads() -> np.ndarray:
        share = np.where(experts_GS >= 0, load_E[experts_GS] / np.maximum(count_E[experts_GS], 1), 0.0)
        return share.sum(1)

    lost = np.flatnonzero(count_E == 0)
    for expert in lost[np.argsort(-load_E[lost], kind="stable")]:
        empty = np.argwhere(experts_GS < 0)
        if len(empty):
            loads = gpu_loads()
            gpu, slot = min(empty.tolist(), key=lambda gs: (loads[gs[0]], gs[0], gs[1]))
        else:
            redundant = np.flatnonzero(count_E >= 2)
            victim = min(redundant.tolist(), key=lambda e: (-count_E[e], load_E[e] / count_E[e], e))
            loads = gpu_loads()
            holders = np.argwhere(experts_GS == victim).tolist()
            gpu, slot = max(holders, key=lambda gs: (loads[gs[0]], -gs[0], -gs[1]))
            count_E[victim] -= 1
        experts_GS[gpu, slot] = expert
        count_E[expert] += 1
    for gpu, slot in np.argwhere(experts_GS < 0).tolist():
        on_gpu = set(experts_GS[gpu][experts_GS[gpu] >= 0].tolist())
        per_replica = load_E / np.maximum(count_E, 1)
        order = np.lexsort((np.arange(num_experts), -per_replica))
        expert = next((e for e in order.tolist() if e not in on_gpu), int(order[0]))
        experts_GS[gpu, slot] = expert
        count_E[expert] += 1


def survivor_fills(old: Placement, target: Placement, lost: list[int], kept: list[int],
                   failures_tolerated: int, host_copies_built: bool = True) -> tuple[list[Fill], int]:
    """The fills that take the survivors from `old` to `target` (`placement_without`'s), ranks numbered in the new
    group (`kept[rank]`: its GPU in `old`): slots that change or are new, from a survivor's slot or host copy, and
    the host copies `target` needs (`backup_wanted`, for `failures_tolerated`) that a survivor does not keep
    already; and how many experts had every replica on the `lost` GPUs (restored from host copies).
    `host_copies_built=False` (a rank died while the group started, before every host copy was built): the
    survivors' slots are the only sources, and every host copy `target` needs is filled.

    Raises:
        LookupError: an expert has no copy left on any survivor (more GPUs were lost at once than
            `failures_tolerated`).
    """
    old_shape = (old.cluster.num_gpus, old.cluster.slots_per_gpu)
    new_shape = (target.cluster.num_gpus, target.cluster.slots_per_gpu)
    fills, sends, restored = [], {}, 0
    for layer in range(old.num_layers):
        old_GS, new_GS = old.phy2log_LP[layer].reshape(old_shape), target.phy2log_LP[layer].reshape(new_shape)
        all_holders = holders_of(old_GS, failures_tolerated if host_copies_built else None)
        holders = {rank: all_holders[gpu] for rank, gpu in enumerate(kept)}
        restored += len(set(old_GS[lost].reshape(-1).tolist()) - set(old_GS[kept].reshape(-1).tolist()))
        # Slots that change (or are new) and the host copies the target needs; the rest stays where it is.
        wanted = [(rank, "slot", slot, int(new_GS[rank, slot])) for rank in range(new_shape[0])
                  for slot in range(new_shape[1])
                  if slot >= old_shape[1] or new_GS[rank, slot] != old_GS[kept[rank], slot]]
        wanted += [(rank, "backup", expert, expert) for rank, expert in backup_wanted(new_GS, failures_tolerated)
                   if all_holders[kept[rank]].get(expert, ("slot",))[0] != "backup"]
        fills += plan_fills(layer, wanted, holders, sends)
    return fills, restored
