"""A plain-loop rendering of DeepSeek's EPLB algorithm, one layer at a time.

It mirrors the structure and speed of the public Python implementation (a Python loop over layers, items and
packs) and serves two purposes: the oracle that tests compare the vectorised `deepseek` policy against, and the
in-process baseline that `scripts/bench_placement.py` times it against. Not for production use. It computes in
float64 and visits equal items in index order, as the vectorised policy does by default (`FLOAT64_STABLE`); the
drop-in's float32, `torch.sort` order is checked against a torch rendering in `tests/eplb/live`.
"""

import numpy as np


def _replicate(load: list[float], num_slots: int) -> tuple[list[int], list[int], list[int]]:
    phy2log = list(range(len(load)))
    rank = [0] * len(load)
    count = [1] * len(load)
    for _ in range(len(load), num_slots):
        best = max(range(len(load)), key=lambda e: (load[e] / count[e], -e))
        phy2log.append(best)
        rank.append(count[best])
        count[best] += 1
    return phy2log, rank, count


def _pack(weights: list[float], num_packs: int) -> tuple[list[int], list[int]]:
    capacity = len(weights) // num_packs
    if capacity == 1:
        return list(range(len(weights))), [0] * len(weights)
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    pack_weight = [0.0] * num_packs
    pack_items = [0] * num_packs
    pack, rank = [0] * len(weights), [0] * len(weights)
    for item in order:
        chosen = min((p for p in range(num_packs) if pack_items[p] < capacity), key=lambda p: pack_weight[p])
        pack[item], rank[item] = chosen, pack_items[chosen]
        pack_weight[chosen] += weights[item]
        pack_items[chosen] += 1
    return pack, rank


def reference_rebalance(
    load_LE: np.ndarray, num_slots: int, num_groups: int, num_nodes: int, num_gpus: int
) -> np.ndarray:
    """Hierarchical policy (global with num_groups = num_nodes = 1), layer by layer. Returns phy2log_LP [L, P]."""
    num_layers, num_experts = load_LE.shape
    group_size = num_experts // num_groups
    experts_per_node = num_experts // num_nodes
    slots_per_node = num_slots // num_nodes
    gpus_per_node = num_gpus // num_nodes
    slots_per_gpu = num_slots // num_gpus
    result = np.empty((num_layers, num_slots), dtype=np.int64)
    for layer in range(num_layers):
        load = [float(x) for x in load_LE[layer]]
        group_load = [sum(load[g * group_size : (g + 1) * group_size]) for g in range(num_groups)]
        group_node, group_rank = _pack(group_load, num_nodes)
        # Experts of each node, in node-local order.
        node_experts: list[list[int]] = [[0] * experts_per_node for _ in range(num_nodes)]
        for g in range(num_groups):
            for i in range(group_size):
                node_experts[group_node[g]][group_rank[g] * group_size + i] = g * group_size + i
        for node in range(num_nodes):
            experts = node_experts[node]
            phy2local, _, count = _replicate([load[e] for e in experts], slots_per_node)
            replica_load = [load[experts[x]] / count[x] for x in phy2local]
            gpu, rank = _pack(replica_load, gpus_per_node)
            for phy, local in enumerate(phy2local):
                slot = node * slots_per_node + gpu[phy] * slots_per_gpu + rank[phy]
                result[layer, slot] = experts[local]
    return result
