"""vLLM's default EPLB placement (`DefaultEplbPolicy`, vLLM 0.33), reproduced result for result.

Legend (docs/shapes.md): L layers, E logical experts, P slots (num_replicas), G GPUs, H nodes, Q expert groups,
B rows handled as one batch, I items to pack.

vLLM runs DeepSeek's algorithm (`placement.policies.deepseek`: groups onto nodes, replicas inside each node,
replicas onto the GPUs of their node) in numpy, which changes which of equal loads goes where:
- loads are read as float32 (`weight.float()`), each group's load is a numpy float32 sum;
- every packing visits its items in `np.argsort(-weight)` order (numpy's default sort, not stable on long rows) on
  the items as they are: float32 group loads in step 1, float64 loads per replica in step 3;
- pack totals are float64;
- loads per replica are float32 loads divided by int64 counts, hence float64.
DeepSeek's `eplb.py` sums, divides and accumulates in float32 and sorts with `torch.sort`, so on ties the two may
place differently; `eplb.engines.deepseek.policy.rebalance_experts` follows `eplb.py`, this module follows vLLM.
"""

import numpy as np

from placement.policies.deepseek import pack_balanced, replicate_greedy


def _numpy_heaviest_first(weight_BI: np.ndarray) -> np.ndarray:
    """[B, I] int64: vLLM's packing order, `np.argsort(-weight)` in the items' own dtype."""
    return np.argsort(-weight_BI, axis=-1)


def _pack_float64_totals(weight_BI: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """`pack_balanced` with vLLM's arithmetic: items ordered in their own dtype, pack totals summed in float64."""
    def in_own_dtype(_float64_copy: np.ndarray) -> np.ndarray:
        return _numpy_heaviest_first(weight_BI)

    return pack_balanced(weight_BI.astype(np.float64), num_packs, in_own_dtype)


def vllm_default_phy2log(load_LE: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
                         num_gpus: int) -> np.ndarray:
    """[L, P] int64: the logical expert of each slot, as vLLM's `DefaultEplbPolicy` places `load_LE` [L, E] float32
    before it keeps experts in their old slots (arguments checked by the caller). Hierarchical when num_nodes
    divides num_groups, else global (one group, one node), as in vLLM."""
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1
    load_LE = np.asarray(load_LE, dtype=np.float32)
    num_layers, num_experts = load_LE.shape
    group_size = num_experts // num_groups
    experts_per_node = num_experts // num_nodes
    slots_per_gpu = num_replicas // num_gpus

    # Step 1: pack groups onto nodes; mlog numbers the experts node by node.
    group_load_LQ = load_LE.reshape(num_layers, num_groups, group_size).sum(axis=-1)
    group_pack, group_rank = _pack_float64_totals(group_load_LQ, num_nodes)
    first_mlog_LQ = (group_pack * (num_groups // num_nodes) + group_rank) * group_size
    log2mlog = (first_mlog_LQ[:, :, None] + np.arange(group_size)).reshape(num_layers, num_experts)
    mlog2log = np.argsort(log2mlog, axis=1)

    # Step 2: replicas inside each node, rows (layer, node); float64 loads per replica.
    load_per_mlog = np.take_along_axis(load_LE, mlog2log, axis=1).astype(np.float64).reshape(-1, experts_per_node)
    phy2mlog, _, mlogcnt = replicate_greedy(load_per_mlog, num_replicas // num_nodes)

    # Step 3: pack the replicas onto the GPUs of their node.
    load_per_phy = np.take_along_axis(load_per_mlog / mlogcnt, phy2mlog, axis=1)
    gpu_pack, gpu_rank = _pack_float64_totals(load_per_phy, num_gpus // num_nodes)
    pphy2phy = np.argsort(gpu_pack * slots_per_gpu + gpu_rank, axis=1)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1).reshape(num_layers, num_nodes, -1)
    pphy2mlog = (pphy2mlog + (np.arange(num_nodes) * experts_per_node)[None, :, None]).reshape(num_layers, -1)
    return np.take_along_axis(mlog2log, pphy2mlog, axis=1)
