"""DeepSeek's `rebalance_experts` drop-in: the function of DeepSeek's public `eplb.py`, with a cpsat option.

Legend (docs/shapes.md): L layers, E logical experts, P physical slots (num_replicas), G GPUs, S slots per GPU, X the
most replicas of one expert.

`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, policy=...)` has the arguments, shapes,
dtypes and -1 padding of DeepSeek's public function. With policy="deepseek" its three outputs are identical to what
DeepSeek's `eplb.py` returns under the same torch, element for element, including the order of each expert's slots
in `log2phy`: which of equally loaded replicas gets which slot follows `torch.sort`'s order of equal loads, so the
policy sums, divides and sorts as `eplb.py` does (float32, torch's CPU sort: `TORCH_ARITHMETIC`). With
policy="cpsat" this project's policy places the experts, and `log2phy` lists each expert's slots in ascending
order. The serving engines these adapters plug into (vLLM, SGLang) split an expert's tokens equally over its
replicas, so the cpsat policy fits an equal split (`CpSatConfig.routing="equal"`) and its result is scored against
DeepSeek's greedy under equal split on `weight`, per layer, the better of the two returned: never worse than the
greedy there. Where DeepSeek's policy is hierarchical (num_nodes divides num_groups), the cpsat policy keeps every
group's replicas on one node, as the hierarchical greedy does (`CpSatConfig.groups`, `nodes_per_group=1`).

Its budget is deterministic work by default (`work_limit`, `ADAPTER_WORK_LIMIT` units): the same weight gives the
same placement on every rank, whatever each rank's load, as engines that compute the placement on every rank and
broadcast nothing need. `time_limit_s` asks for a wall-clock budget instead, for a caller that solves once and
broadcasts.

Every argument is checked before any work, and a bad one raises `ValueError` (`PlacementInfeasibleError`, a
subclass, when the shapes cannot be placed) naming the parameter, the rule and the value found.
"""

import numpy as np
import torch

from eplb.engines.arguments import check_solver_options, checked_load, cluster_of
from placement import ClusterSpec, Placement, fit_placement
from placement.policies.deepseek import Arithmetic, deepseek_rebalance
from placement.scoring import static_gpu_loads

POLICY_NAMES = ("deepseek", "cpsat")
# The cpsat policy's default work budget for all layers of one call: DeepSeek-V3's full shape (58-61 layers x 256
# experts, up to 384 slots) in well under 2 s on one core (figures: eplb/engines/vllm/README.md, 'The same map on
# every rank').
ADAPTER_WORK_LIMIT = 1.0
# The cpsat policy fits integer token counts: each layer's loads are scaled to this total (rounded), so that
# fractional loads (normalised weights summing to 1) keep their ratios to one part in a million of the layer.
CPSAT_LOAD_TOTAL = 1_000_000


def _torch_heaviest_first(weight: np.ndarray) -> np.ndarray:
    """[B, items] int64 for `weight` [B, items]: the order `eplb.py` packs items in,
    `weight.float().sort(-1, descending=True)` on the CPU."""
    return torch.from_numpy(np.ascontiguousarray(weight)).float().sort(-1, descending=True).indices.numpy()


def _torch_sum_last(array: np.ndarray) -> np.ndarray:
    """`array` [..., n] summed over its last axis, [...]: torch's float32 sums, as `eplb.py` sums the loads of each
    expert group."""
    return torch.from_numpy(np.ascontiguousarray(array)).sum(-1).numpy()


TORCH_ARITHMETIC = Arithmetic(dtype=np.float32, heaviest_first=_torch_heaviest_first, sum_last=_torch_sum_last)


def rebalance_experts(
    weight: torch.Tensor,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    policy: str = "deepseek",
    *,
    work_limit: float | None = None,
    time_limit_s: float | None = None,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Place `num_replicas` physical experts on `num_gpus` GPUs for the loads `weight`.

    Args:
        weight: [L, E], the load of each logical expert (tokens over a recent window, or any non-negative weights:
            only their ratios within a layer matter).
        num_replicas: P >= E, physical experts in all (a multiple of num_gpus).
        num_groups: expert groups. When num_nodes divides it, DeepSeek's hierarchical policy packs groups onto
            nodes and num_groups must divide E; otherwise the global policy runs and num_groups is not used.
        num_nodes: server nodes (num_gpus a multiple of it).
        num_gpus: G, GPUs in the EP group.
        policy: "deepseek" (DeepSeek's greedy, identical output) or "cpsat".
        work_limit: the cpsat policy's deterministic budget for all layers, in work units (about a second of one
            core each; None: ADAPTER_WORK_LIMIT).
        time_limit_s: a wall-clock budget instead of work_limit (give one of the two), seconds; the placement then
            depends on the machine's speed and load.
        seed: the cpsat policy's seed (None: 0). The three are the cpsat policy's: "deepseek" takes none of them.

    Returns:
        phy2log: [L, P] int64, the logical expert of each physical slot.
        log2phy: [L, E, X] int64, the slots of each logical expert, padded with -1: with "deepseek" in
            `eplb.py`'s order, with "cpsat" in ascending slot order.
        logcnt: [L, E] int64, replicas of each logical expert.

    Raises:
        ValueError: an argument breaks a rule above (its message names the argument and the value found).
    """
    load = checked_load(weight, num_replicas, num_groups, num_nodes, num_gpus, "num_gpus")
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy must be one of {POLICY_NAMES}; got {policy!r}")
    given = [name for name, value in (("work_limit", work_limit), ("time_limit_s", time_limit_s), ("seed", seed))
             if value is not None]
    if policy != "cpsat" and given:
        raise ValueError(f"{', '.join(given)}: the cpsat policy's options; policy={policy!r} takes none of them")
    if work_limit is not None and time_limit_s is not None:
        raise ValueError("give work_limit (a deterministic budget) or time_limit_s (a wall-clock one), not both")
    work_limit = ADAPTER_WORK_LIMIT if work_limit is None else work_limit
    seed = 0 if seed is None else seed
    if policy == "cpsat":  # its options and cluster checked before any work too
        check_solver_options(work_limit, time_limit_s, seed)
        cluster = cluster_of(num_replicas, num_nodes, num_gpus)
    phy2log, log2phy, logcnt = deepseek_rebalance(load, num_replicas, num_groups, num_nodes, num_gpus,
                                                  TORCH_ARITHMETIC)
    if policy == "cpsat":
        options = cpsat_options(work_limit, time_limit_s, seed, num_groups, num_nodes)
        placement = cpsat_or_baseline(load.astype(np.float64), phy2log, cluster, options)
        phy2log, log2phy, logcnt = placement.phy2log_LP, placement.log2phy_LEX, placement.logcnt_LE
    return tensors(phy2log, log2phy, logcnt)


def cpsat_options(work_limit: float, time_limit_s: float | None, seed: int, num_groups: int, num_nodes: int) -> dict:
    """The cpsat fit's options for an adapter call: its budget and seed, and where the engine's default policy is
    hierarchical (num_nodes divides num_groups) every group's replicas on one node, as that policy keeps them."""
    budget = {"work_limit": float(work_limit)} if time_limit_s is None else {"time_limit_s": float(time_limit_s)}
    options = {**budget, "seed": int(seed)}
    if num_groups % num_nodes == 0:
        options.update({"groups": int(num_groups), "nodes_per_group": 1})
    return options


def cpsat_or_baseline(load_LE: np.ndarray, baseline_LP: np.ndarray, cluster: ClusterSpec, options: dict) -> Placement:
    """Per layer, the cpsat fit (equal routing, `options` its budget, seed and node limits) or `baseline_LP` [L, P]
    (the calling engine's default placement: DeepSeek's `eplb.py` here, vLLM's `DefaultEplbPolicy` in the vLLM
    adapter), whichever has the lower busiest GPU under equal split on `load_LE` [L, E]; on a tie the baseline, so
    the result is never worse than the engine's default on its own ties.

    The fit sees integer loads: each layer scaled to `CPSAT_LOAD_TOTAL`, so the same weights in any unit give it
    the same problem.
    """
    num_experts = load_LE.shape[1]
    total_L1 = load_LE.sum(axis=1, keepdims=True)
    counts_LE = np.rint(load_LE * (CPSAT_LOAD_TOTAL / np.where(total_L1 > 0, total_L1, 1.0))).astype(np.int64)
    fitted = fit_placement("cpsat", counts_LE[None], cluster, routing="equal", **options)
    baseline = Placement.equal_split(baseline_LP, cluster, num_experts)
    candidate = Placement.equal_split(fitted.phy2log_LP, cluster, num_experts)
    better_L = _equal_split_peak_L(candidate, load_LE) < _equal_split_peak_L(baseline, load_LE)
    return Placement.equal_split(np.where(better_L[:, None], candidate.phy2log_LP, baseline_LP), cluster,
                                 num_experts, "cpsat")


def _equal_split_peak_L(placement: Placement, load_LE: np.ndarray) -> np.ndarray:
    """[L] the busiest GPU's load of `placement` under equal split."""
    return static_gpu_loads(load_LE[None], placement)[0].max(axis=-1)


def tensors(*arrays) -> tuple[torch.Tensor, ...]:
    """Each array as a CPU int64 tensor (the dtype both engines' maps have)."""
    return tuple(torch.as_tensor(np.asarray(a), dtype=torch.int64) for a in arrays)
