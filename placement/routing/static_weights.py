"""Static replica weights fitted to a load: each expert's share on each GPU from the best split of that load.

Legend: E logical experts, G GPUs, S slots per GPU, P slots.
"""

import numpy as np

from placement.routing.dynamic_split import ReplicaGraph, first_slot_EG, optimal_split


def fitted_weights(
    phy2log_P: np.ndarray, load_E: np.ndarray, num_gpus: int, slots_per_gpu: int, max_rounds: int = 48
) -> np.ndarray:
    """[P] weights that minimise the busiest GPU for the expected load `load_E` [E].

    The split of `load_E` that minimises the busiest GPU (water-filling, `max_rounds` rounds at most) gives each
    (expert, GPU) pair a share; the first slot of the pair takes it, further slots of the same expert on the same
    GPU take 0. Experts without load keep an equal split.
    """
    phy2log = np.asarray(phy2log_P, dtype=np.int64)
    num_experts = len(load_E)
    gpu_of_slot = np.arange(len(phy2log)) // slots_per_gpu
    graph = ReplicaGraph.build(phy2log, gpu_of_slot, num_experts, num_gpus)
    share_1MY, _, _ = optimal_split(np.asarray(load_E, dtype=np.float64)[None], graph, 1e-3, max_rounds)
    pair_share = np.zeros((num_experts, num_gpus + 1))
    pair_share[np.arange(num_experts), graph.fixed_gpu_E(none=num_gpus)] = 1.0  # column G: movable, overwritten
    if len(graph.movable_M):
        load_M = np.maximum(load_E[graph.movable_M], 1e-12)
        pair_share[graph.movable_M[:, None], graph.gpus_MY] = share_1MY[0] / load_M[:, None]
    first_EG = first_slot_EG(phy2log, gpu_of_slot, num_experts, num_gpus)
    is_first = first_EG[phy2log, gpu_of_slot] == np.arange(len(phy2log))
    weights = np.where(is_first, pair_share[phy2log, gpu_of_slot], 0.0)
    sums = np.bincount(phy2log, weights, minlength=num_experts)
    replicas = np.bincount(phy2log, minlength=num_experts)
    # An expert with no load (or a lost share) falls back to an equal split.
    equal = sums[phy2log] <= 1e-9
    weights = np.where(equal, 1.0 / replicas[phy2log], weights / np.maximum(sums[phy2log], 1e-12))
    return weights
