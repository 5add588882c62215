"""Drop-in policy adapters: DeepSeek's `rebalance_experts` function and vLLM's EPLB policy class interface.

Legend: L layers, E logical experts, P physical slots (num_replicas), X most replicas of one expert.

`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, policy=...)` has the arguments, shapes,
dtypes and -1 padding of DeepSeek's public function; with policy="deepseek" its outputs are identical. With
policy="cpsat" this project's OR-Tools policy places the experts. The serving engines these adapters plug into
(vLLM, SGLang) split an expert's tokens equally over its replicas, so the cpsat result is scored against DeepSeek's
greedy under equal split on `weight` and the better of the two is returned: never worse than the greedy there.
`CpsatEplbPolicy.rebalance_experts` has the signature of vLLM's `AbstractEplbPolicy` (duck-typed; vLLM is not
imported) and, given the old physical-to-logical map, relabels the new placement to move the fewest experts.
"""

import numpy as np
import torch

from placement import ClusterSpec, Placement, PlacementInfeasibleError, fit_placement, plan_migration
from placement.policies.deepseek import deepseek_rebalance
from placement.scoring import static_gpu_loads

POLICY_NAMES = ("deepseek", "cpsat")


def rebalance_experts(
    weight: torch.Tensor,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    policy: str = "deepseek",
    *,
    time_limit_s: float = 10.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Place `num_replicas` physical experts on `num_gpus` GPUs for the loads `weight`.

    Args:
        weight: [L, E], the load of each logical expert (tokens over a recent window).
        num_replicas: P, physical experts in all (a multiple of num_gpus).
        num_groups: expert groups (DeepSeek's hierarchical policy runs when num_nodes divides it).
        num_nodes: server nodes (num_gpus a multiple of it).
        num_gpus: GPUs in the EP group.
        policy: "deepseek" (DeepSeek's greedy, identical output) or "cpsat".
        time_limit_s, seed: the cpsat policy's wall-clock budget for all layers and its seed.

    Returns:
        phy2log: [L, P] int64, the logical expert of each physical slot.
        log2phy: [L, E, X] int64, the slots of each logical expert, padded with -1.
        logcnt: [L, E] int64, replicas of each logical expert.
    """
    load = _as_load(weight)
    cluster = _cluster(num_replicas, num_nodes, num_gpus)
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy must be one of {POLICY_NAMES}; got {policy!r}")
    phy2log, log2phy, logcnt = deepseek_rebalance(load, num_replicas, num_groups, num_nodes, num_gpus)
    if policy == "cpsat":
        greedy = Placement.equal_split(phy2log, cluster, load.shape[1])
        fitted = fit_placement("cpsat", np.rint(load)[None].astype(np.int64), cluster, time_limit_s=time_limit_s,
                               seed=seed, routing="static")
        candidate = Placement.equal_split(fitted.phy2log_LP, cluster, load.shape[1])
        better = _equal_split_peak_L(candidate, load) < _equal_split_peak_L(greedy, load)
        phy2log = np.where(better[:, None], candidate.phy2log_LP, greedy.phy2log_LP)
        placement = Placement.equal_split(phy2log, cluster, load.shape[1])
        log2phy, logcnt = placement.log2phy_LEX, placement.logcnt_LE
    return _tensors(phy2log, log2phy, logcnt)


class CpsatEplbPolicy:
    """The `cpsat` policy behind vLLM's EPLB policy interface (`AbstractEplbPolicy.rebalance_experts`).

    Class attributes `time_limit_s` and `seed` tune the solver; subclass to change them.
    """

    time_limit_s: float = 10.0
    seed: int = 0

    @classmethod
    def rebalance_experts(
        cls,
        weight: torch.Tensor,
        num_replicas: int,
        num_groups: int,
        num_nodes: int,
        num_ranks: int,
        old_global_expert_indices: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `rebalance_experts(..., policy="cpsat")`; with `old_global_expert_indices` [L, P] (the map now
        serving), the result is relabelled within the same placement so that the fewest experts move."""
        phy2log, _, _ = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks, "cpsat",
                                          time_limit_s=cls.time_limit_s, seed=cls.seed)
        cluster = _cluster(num_replicas, num_nodes, num_ranks)
        num_experts = weight.shape[1]
        new = Placement.equal_split(phy2log.numpy(), cluster, num_experts)
        if old_global_expert_indices is not None:
            old_map = np.asarray(torch.as_tensor(old_global_expert_indices).cpu(), dtype=np.int64)
            if old_map.shape != new.phy2log_LP.shape:
                raise ValueError(f"old_global_expert_indices must be [{new.num_layers}, {num_replicas}]; got "
                                 f"{tuple(old_map.shape)}")
            new = plan_migration(Placement.equal_split(old_map, cluster, num_experts), new, 1).realised
        return _tensors(new.phy2log_LP, new.log2phy_LEX, new.logcnt_LE)


def _as_load(weight) -> np.ndarray:
    load = np.asarray(torch.as_tensor(weight).detach().float().cpu(), dtype=np.float64)
    if load.ndim != 2 or not np.isfinite(load).all() or (load < 0).any():
        raise ValueError(f"weight must be a finite, non-negative [layers, experts] load; got shape {load.shape}")
    return load


def _cluster(num_replicas: int, num_nodes: int, num_gpus: int) -> ClusterSpec:
    if num_gpus < 1 or num_nodes < 1 or num_gpus % num_nodes or num_replicas % num_gpus:
        raise PlacementInfeasibleError(
            f"num_replicas={num_replicas} must be a multiple of num_gpus={num_gpus}, itself a multiple of "
            f"num_nodes={num_nodes}"
        )
    return ClusterSpec(num_gpus=num_gpus, slots_per_gpu=num_replicas // num_gpus, gpus_per_node=num_gpus // num_nodes)


def _equal_split_peak_L(placement: Placement, load_LE: np.ndarray) -> np.ndarray:
    """[L] the busiest GPU's load of `placement` under equal split."""
    return static_gpu_loads(load_LE[None], placement)[0].max(axis=-1)


def _tensors(phy2log, log2phy, logcnt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.as_tensor(np.asarray(a), dtype=torch.int64) for a in (phy2log, log2phy, logcnt))
