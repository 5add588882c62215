"""The checks every drop-in policy runs on its arguments before any work.

Legend (docs/shapes.md): L layers, E logical experts, P slots (`num_replicas`), G GPUs (ranks), S slots per GPU.

Each check raises `ValueError` (`PlacementInfeasibleError`, a subclass, when the shapes cannot be placed) whose
message names the parameter, the rule and the value found.
"""

import math
import numbers
import operator

import numpy as np
import pydantic
import torch

from placement import ClusterSpec, PlacementInfeasibleError
from placement.cluster import MAX_GPUS, MAX_SLOTS

# Bounds of the cpsat policy's budget: past them a call would run for days; below MIN_WORK_LIMIT (a millisecond of a
# core's work) every layer keeps the greedy, so a smaller value is a typo, not a budget.
MIN_WORK_LIMIT = 1e-3
MAX_WORK_LIMIT = 1e6
MAX_TIME_LIMIT_S = 86400.0


def checked_load(weight, num_replicas, num_groups, num_nodes, num_gpus, gpus_name: str) -> np.ndarray:
    """[L, E] float32: the loads as DeepSeek's `eplb.py` and vLLM read them (`weight.float()` on the CPU), after
    checking every argument of the interface; `gpus_name` is how the caller spells the GPU count."""
    num_replicas = whole_number(num_replicas, "num_replicas")
    num_groups = whole_number(num_groups, "num_groups")
    num_nodes = whole_number(num_nodes, "num_nodes")
    num_gpus = whole_number(num_gpus, gpus_name)
    load = load_LE(weight)
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
    if num_replicas > MAX_SLOTS or num_gpus > MAX_GPUS:
        raise PlacementInfeasibleError(f"num_replicas={num_replicas} and {gpus_name}={num_gpus} must be at most "
                                       f"{MAX_SLOTS} slots on {MAX_GPUS} GPUs (the placement's limits)")
    if num_groups % num_nodes == 0 and num_experts % num_groups:
        raise PlacementInfeasibleError(
            f"num_groups={num_groups} must divide the {num_experts} experts of weight: num_nodes={num_nodes} "
            f"divides it, which selects the hierarchical policy (whole groups on each node); pass a num_groups "
            f"that divides {num_experts}, or one that num_nodes does not divide for the global policy"
        )
    return load


def whole_number(value, name: str, least: int = 1) -> int:
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


def load_LE(weight) -> np.ndarray:
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


def checked_old_map(old, num_layers: int, num_experts: int, slots_per_gpu: int) -> np.ndarray:
    """[L, P_old] int64: the physical-to-logical map now serving, checked: ids in [-1, E) (-1 = an unused slot) and
    a whole number of GPUs of `slots_per_gpu` slots (vLLM keeps the slots per rank when the group is resized)."""
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
    if tensor.shape[1] % slots_per_gpu:
        raise ValueError(f"old_global_expert_indices must have a multiple of the {slots_per_gpu} slots per rank "
                         f"(num_replicas / num_ranks; vLLM keeps them when ranks come or go); got "
                         f"{tensor.shape[1]} slots")
    old_map = tensor.cpu().numpy().astype(np.int64)
    if old_map.min() < -1 or old_map.max() >= num_experts:
        raise ValueError(f"old_global_expert_indices must hold expert ids in [-1, {num_experts}) (-1: an unused "
                         f"slot); found ids from {old_map.min()} to {old_map.max()}")
    return old_map


def check_solver_options(work_limit, time_limit_s, seed) -> None:
    """The cpsat policy's budget (work_limit units in [MIN_WORK_LIMIT, MAX_WORK_LIMIT]; time_limit_s None or seconds
    > 0, at most MAX_TIME_LIMIT_S) and seed (an int in [0, 2^31))."""
    if isinstance(work_limit, bool) or not isinstance(work_limit, numbers.Real) or not (
            math.isfinite(work_limit) and MIN_WORK_LIMIT <= work_limit <= MAX_WORK_LIMIT):
        raise ValueError(f"work_limit must be a number of work units in [{MIN_WORK_LIMIT:g}, {MAX_WORK_LIMIT:g}]; got "
                         f"{work_limit!r}")
    if time_limit_s is not None and (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, numbers.Real)
                                     or not (math.isfinite(time_limit_s) and 0 < time_limit_s <= MAX_TIME_LIMIT_S)):
        raise ValueError(f"time_limit_s must be None (the deterministic work_limit) or seconds in (0, "
                         f"{MAX_TIME_LIMIT_S:g}]; got {time_limit_s!r}")
    seed = whole_number(seed, "seed", least=0)
    if seed >= 2**31:
        raise ValueError(f"seed must be below 2^31 (CP-SAT's seed is a 32-bit int); got {seed}")


def cluster_of(num_replicas: int, num_nodes: int, num_gpus: int) -> ClusterSpec:
    """The cluster of the arguments (checked already), for the cpsat policy, whose size is bounded."""
    try:
        return ClusterSpec(num_gpus=num_gpus, slots_per_gpu=num_replicas // num_gpus,
                           gpus_per_node=num_gpus // num_nodes)
    except pydantic.ValidationError as exc:
        reason = exc.errors()[0]["msg"]
        raise PlacementInfeasibleError(f"the cpsat policy cannot place num_replicas={num_replicas} on {num_gpus} "
                                       f"GPUs: {reason}") from None
