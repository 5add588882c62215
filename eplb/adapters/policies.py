"""Drop-in policy adapters: DeepSeek's `rebalance_experts` function and vLLM's EPLB policy class interface.

Legend: L layers, E logical experts, P physical slots (num_replicas), G GPUs, S slots per GPU, X most replicas of
one expert.

`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, policy=...)` has the arguments, shapes,
dtypes and -1 padding of DeepSeek's public function. With policy="deepseek" its three outputs are identical to what
DeepSeek's `eplb.py` returns under the same torch, element for element, including the order of each expert's slots
in `log2phy`: which of equally loaded replicas gets which slot follows `torch.sort`'s order of equal loads, so the
policy sums, divides and sorts as `eplb.py` does (float32, torch's CPU sort: `TORCH_ARITHMETIC`). With
policy="cpsat" this project's OR-Tools policy places the experts, and `log2phy` lists each expert's slots in
ascending order. The serving engines these adapters plug into (vLLM, SGLang) split an expert's tokens equally over
its replicas, so the cpsat result is scored against DeepSeek's greedy under equal split on `weight` and the better
of the two is returned: never worse than the greedy there.
`CpsatEplbPolicy.rebalance_experts` has the signature of vLLM's `AbstractEplbPolicy` (duck-typed; vLLM is not
imported) and, given the old physical-to-logical map, relabels the new placement to move the fewest experts.

Every argument is checked before any work, and a bad one raises `ValueError` (`PlacementInfeasibleError`, a
subclass, when the shapes cannot be placed) naming the parameter, the rule and the value found.
"""

import math
import numbers
import operator

import numpy as np
import pydantic
import torch

from placement import ClusterSpec, Placement, PlacementInfeasibleError, fit_placement, plan_migration
from placement.cluster import MAX_SLOTS, MAX_SLOTS_PER_GPU
from placement.policies.deepseek import Arithmetic, deepseek_rebalance
from placement.scoring import static_gpu_loads

POLICY_NAMES = ("deepseek", "cpsat")
# The cpsat policy fits integer token counts: each layer's loads are scaled to this total (rounded), so that
# fractional loads (normalised weights summing to 1) keep their ratios to one part in a million of the layer.
CPSAT_LOAD_TOTAL = 1_000_000


def _torch_heaviest_first(weight_BI: np.ndarray) -> np.ndarray:
    """[B, I] int64: the order `eplb.py` packs items in, `weight.float().sort(-1, descending=True)` on the CPU."""
    return torch.from_numpy(np.ascontiguousarray(weight_BI)).float().sort(-1, descending=True).indices.numpy()


def _torch_sum_last(array_BKM: np.ndarray) -> np.ndarray:
    """[B, K]: torch's float32 sums over the last axis, as `eplb.py` sums the loads of each expert group."""
    return torch.from_numpy(np.ascontiguousarray(array_BKM)).sum(-1).numpy()


TORCH_ARITHMETIC = Arithmetic(dtype=np.float32, heaviest_first=_torch_heaviest_first, sum_last=_torch_sum_last)


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
        weight: [L, E], the load of each logical expert (tokens over a recent window, or any non-negative weights:
            only their ratios within a layer matter).
        num_replicas: P >= E, physical experts in all (a multiple of num_gpus).
        num_groups: expert groups. When num_nodes divides it, DeepSeek's hierarchical policy packs groups onto
            nodes and num_groups must divide E; otherwise the global policy runs and num_groups is not used.
        num_nodes: server nodes (num_gpus a multiple of it).
        num_gpus: G, GPUs in the EP group.
        policy: "deepseek" (DeepSeek's greedy, identical output) or "cpsat".
        time_limit_s, seed: the cpsat policy's wall-clock budget for all layers and its seed.

    Returns:
        phy2log: [L, P] int64, the logical expert of each physical slot.
        log2phy: [L, E, X] int64, the slots of each logical expert, padded with -1: with "deepseek" in
            `eplb.py`'s order, with "cpsat" in ascending slot order.
        logcnt: [L, E] int64, replicas of each logical expert.

    Raises:
        ValueError: an argument breaks a rule above (its message names the argument and the value found).
    """
    load = _checked_load(weight, num_replicas, num_groups, num_nodes, num_gpus, "num_gpus")
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy must be one of {POLICY_NAMES}; got {policy!r}")
    if policy == "cpsat":  # its options and cluster checked before any work too
        _check_solver_options(time_limit_s, seed)
        cluster = _cluster(num_replicas, num_nodes, num_gpus)
    phy2log, log2phy, logcnt = deepseek_rebalance(load, num_replicas, num_groups, num_nodes, num_gpus,
                                                  TORCH_ARITHMETIC)
    if policy == "cpsat":
        placement = _cpsat_or_greedy(load.astype(np.float64), phy2log, cluster, time_limit_s, int(seed))
        phy2log, log2phy, logcnt = placement.phy2log_LP, placement.log2phy_LEX, placement.logcnt_LE
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
        """As `rebalance_experts(..., policy="cpsat")`, with `num_ranks` for num_gpus.

        `old_global_expert_indices` [L, P_old] int is the map now serving (-1 marks an unused slot). When it has
        num_replicas slots, the result is relabelled within the same placement (GPUs inside their node, slots
        inside their GPU) so that the fewest experts move; a map of another width (the group was resized) is
        checked and not otherwise used.
        """
        num_layers, num_experts = _checked_load(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                                "num_ranks").shape
        old_map = None
        if old_global_expert_indices is not None:
            old_map = _checked_old_map(old_global_expert_indices, num_layers, num_experts)
        phy2log, _, _ = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks, "cpsat",
                                          time_limit_s=cls.time_limit_s, seed=cls.seed)
        new = Placement.equal_split(phy2log.numpy(), _cluster(num_replicas, num_nodes, num_ranks), num_experts)
        if old_map is not None and old_map.shape[1] == num_replicas:
            new = _keep_in_place(old_map, new)
        return _tensors(new.phy2log_LP, new.log2phy_LEX, new.logcnt_LE)


def _cpsat_or_greedy(load_LE: np.ndarray, greedy_LP: np.ndarray, cluster: ClusterSpec, time_limit_s: float,
                     seed: int) -> Placement:
    """Per layer, the cpsat fit or the greedy `greedy_LP`, whichever has the lower busiest GPU under equal split.

    The fit sees integer loads: each layer scaled to `CPSAT_LOAD_TOTAL`, so the same weights in any unit give it
    the same problem.
    """
    num_experts = load_LE.shape[1]
    total_L1 = load_LE.sum(axis=1, keepdims=True)
    counts_LE = np.rint(load_LE * (CPSAT_LOAD_TOTAL / np.where(total_L1 > 0, total_L1, 1.0))).astype(np.int64)
    fitted = fit_placement("cpsat", counts_LE[None], cluster, time_limit_s=time_limit_s, seed=seed, routing="static")
    greedy = Placement.equal_split(greedy_LP, cluster, num_experts)
    candidate = Placement.equal_split(fitted.phy2log_LP, cluster, num_experts)
    better_L = _equal_split_peak_L(candidate, load_LE) < _equal_split_peak_L(greedy, load_LE)
    return Placement.equal_split(np.where(better_L[:, None], candidate.phy2log_LP, greedy_LP), cluster, num_experts,
                                 "cpsat")


def _check_solver_options(time_limit_s, seed) -> None:
    """The cpsat policy's budget (seconds > 0, finite) and seed (an int >= 0)."""
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, numbers.Real) or not (
            math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ValueError(f"time_limit_s must be a number of seconds > 0; got {time_limit_s!r}")
    _whole_number(seed, "seed", least=0)


def _keep_in_place(old_LP: np.ndarray, new: Placement) -> Placement:
    """`new` relabelled (GPUs inside their node, slots inside their GPU: the same placement) so that the fewest
    experts move from the old map `old_LP` [L, P] (-1 = an unused slot).

    `plan_migration` compares two placements in which every expert has a slot; an old map may leave slots unused
    and experts out. Both maps are therefore widened by the same k slots at the head of every GPU, holding a
    stand-in id E and, per layer, the experts the old layer lacks; the old map's unused slots hold E too. The head
    adds the same count of shared experts to every pair of GPUs, so the cheapest relabelling is unchanged, and it
    stays in place, so dropping it leaves the relabelled `new`.
    """
    num_layers = old_LP.shape[0]
    cluster, num_experts = new.cluster, new.num_experts
    held_LE = _replica_counts_LE(old_LP, num_experts) > 0
    if (old_LP >= 0).all() and held_LE.all():
        return plan_migration(Placement.equal_split(old_LP, cluster, num_experts), new).realised
    stand_in = num_experts
    width = 1 + int((~held_LE).sum(axis=1).max())
    slots = cluster.slots_per_gpu + width
    if slots > MAX_SLOTS_PER_GPU or cluster.num_gpus * slots > MAX_SLOTS:
        return new  # the old map lacks too many experts for a widened group of bounded size: the fit's labels
    head_LK = np.full((num_layers, width), stand_in, dtype=np.int64)
    for layer in range(num_layers):
        lacking = np.flatnonzero(~held_LE[layer])
        head_LK[layer, 1 : 1 + len(lacking)] = lacking
    wide = ClusterSpec(num_gpus=cluster.num_gpus, slots_per_gpu=slots, gpus_per_node=cluster.gpus_per_node)

    def widened(map_LP: np.ndarray) -> Placement:
        map_LGS = map_LP.reshape(num_layers, cluster.num_gpus, cluster.slots_per_gpu)
        head_LGK = np.broadcast_to(head_LK[:, None, :], (num_layers, cluster.num_gpus, width))
        return Placement.equal_split(np.concatenate([head_LGK, map_LGS], axis=2).reshape(num_layers, -1), wide,
                                     num_experts + 1)

    realised = plan_migration(widened(np.where(old_LP < 0, stand_in, old_LP)), widened(new.phy2log_LP)).realised
    kept_LP = realised.phy2log_LP.reshape(num_layers, cluster.num_gpus, slots)[:, :, width:].reshape(num_layers, -1)
    return Placement.equal_split(kept_LP, cluster, num_experts, new.policy, new.info)


def _replica_counts_LE(map_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """[L, E] int64: slots of each expert in `map_LP` (-1 entries not counted)."""
    counts = np.zeros((map_LP.shape[0], num_experts + 1), dtype=np.int64)
    np.add.at(counts, (np.arange(map_LP.shape[0])[:, None], np.where(map_LP < 0, num_experts, map_LP)), 1)
    return counts[:, :num_experts]


def _checked_load(weight, num_replicas, num_groups, num_nodes, num_gpus, gpus_name: str) -> np.ndarray:
    """The loads as `eplb.py` reads them ([L, E] float32), after checking every argument of the interface."""
    num_replicas = _whole_number(num_replicas, "num_replicas")
    num_groups = _whole_number(num_groups, "num_groups")
    num_nodes = _whole_number(num_nodes, "num_nodes")
    num_gpus = _whole_number(num_gpus, gpus_name)
    load = _load_LE(weight)
    num_experts = load.shape[1]
    if num_gpus % num_nodes:
        raise PlacementInfeasibleError(f"{gpus_name}={num_gpus} must be a multiple of num_nodes={num_nodes} "
                                       f"(every node has the same GPUs)")
    if num_replicas % num_gpus:
        raise PlacementInfeasibleError(f"num_replicas={num_replicas} must be a multiple of {gpus_name}={num_gpus} "
                                       f"(every GPU has the same slots)")
    if num_replicas < num_experts:
        raise PlacementInfeasibleError(f"num_replicas={num_replicas} must be at least the {num_experts} experts of "
                                       f"weight (every expert needs a slot)")
    if num_groups % num_nodes == 0 and num_experts % num_groups:
        raise PlacementInfeasibleError(
            f"num_groups={num_groups} must divide the {num_experts} experts of weight: num_nodes={num_nodes} "
            f"divides it, which selects the hierarchical policy (whole groups on each node); pass a num_groups "
            f"that divides {num_experts}, or one that num_nodes does not divide for the global policy"
        )
    return load


def _whole_number(value, name: str, least: int = 1) -> int:
    """`value` as an int >= `least`; a float (even 32.0) or a bool is refused, as `eplb.py` could not use it."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int; got the bool {value}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int; got {value!r} ({type(value).__name__})") from None
    if number < least:
        raise ValueError(f"{name} must be >= {least}; got {number}")
    return number


def _load_LE(weight) -> np.ndarray:
    """[L, E] float32: `weight` read as `eplb.py` reads it (`weight.float()` on the CPU), checked."""
    try:
        tensor = torch.as_tensor(weight)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"weight must be a tensor [layers, experts] of loads; got {type(weight).__name__}") from None
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise ValueError(f"weight must hold real numbers; got dtype {tensor.dtype}")
    if tensor.dim() != 2 or 0 in tensor.shape:
        raise ValueError(f"weight must be a 2-D tensor [layers, experts] with at least one of each; got shape "
                         f"{tuple(tensor.shape)}")
    load = tensor.detach().float().cpu().numpy()
    if not np.isfinite(load).all():
        raise ValueError(f"weight must be finite in float32; found {int((~np.isfinite(load)).sum())} NaN or "
                         f"infinite loads")
    if (load < 0).any():
        raise ValueError(f"weight must be non-negative; found {int((load < 0).sum())} negative loads (min "
                         f"{load.min():g})")
    return load


def _checked_old_map(old, num_layers: int, num_experts: int) -> np.ndarray:
    """[L, P_old] int64: the old physical-to-logical map, checked (ids in [-1, E))."""
    try:
        tensor = torch.as_tensor(old)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"old_global_expert_indices must be an int tensor [layers, slots]; got "
                         f"{type(old).__name__}") from None
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f"old_global_expert_indices must hold integer expert ids; got dtype {tensor.dtype}")
    if tensor.dim() != 2 or tensor.shape[0] != num_layers or tensor.shape[1] == 0:
        raise ValueError(f"old_global_expert_indices must be [{num_layers}, slots] (a row per layer of weight); got "
                         f"shape {tuple(tensor.shape)}")
    old_map = tensor.cpu().numpy().astype(np.int64)
    if old_map.min() < -1 or old_map.max() >= num_experts:
        raise ValueError(f"old_global_expert_indices must hold expert ids in [-1, {num_experts}) (-1: an unused "
                         f"slot); found ids from {old_map.min()} to {old_map.max()}")
    return old_map


def _cluster(num_replicas: int, num_nodes: int, num_gpus: int) -> ClusterSpec:
    """The cluster of the arguments (checked already), for the cpsat policy, whose size is bounded."""
    try:
        return ClusterSpec(num_gpus=num_gpus, slots_per_gpu=num_replicas // num_gpus,
                           gpus_per_node=num_gpus // num_nodes)
    except pydantic.ValidationError as exc:
        reason = exc.errors()[0]["msg"]
        raise PlacementInfeasibleError(f"the cpsat policy cannot place num_replicas={num_replicas} on {num_gpus} "
                                       f"GPUs: {reason}") from None


def _equal_split_peak_L(placement: Placement, load_LE: np.ndarray) -> np.ndarray:
    """[L] the busiest GPU's load of `placement` under equal split."""
    return static_gpu_loads(load_LE[None], placement)[0].max(axis=-1)


def _tensors(phy2log, log2phy, logcnt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.as_tensor(np.asarray(a), dtype=torch.int64) for a in (phy2log, log2phy, logcnt))
