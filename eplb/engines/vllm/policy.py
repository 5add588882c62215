"""This project's policies behind vLLM's EPLB policy interface.

Legend (docs/shapes.md): L layers, E logical experts, P slots (`num_replicas`), G ranks (`num_ranks`), S slots per
rank, X the most replicas of one expert.

vLLM asks its policy class, never an instance, for a new placement:
`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices=None)`.
- `CpsatEplbPolicy` (vLLM 0.23 and later; checked against 0.33.0) returns `physical_to_logical_map` [L, P], a CPU
  int64 tensor, as vLLM's `AbstractEplbPolicy` asks.
- `LegacyCpsatEplbPolicy` (vLLM 0.14 to 0.18) returns the older 3-tuple (`phy2log` [L, P], `log2phy` [L, E, X]
  padded with -1, `logcnt` [L, E]).

The class attribute `policy` chooses the placement: "cpsat" (this project's policy, fitted for vLLM's equal split
and, layer by layer, never worse there than vLLM's own `DefaultEplbPolicy` placement, which it keeps on a tie;
every group's replicas on one node where vLLM's default is hierarchical) or "deepseek" (exactly what vLLM's
`DefaultEplbPolicy` returns, see `eplb.engines.vllm.default_policy`).
vLLM calls the policy on every rank and broadcasts nothing, so the cpsat budget is deterministic work by default
(`work_limit`): every rank computes the same map, whatever its load. Given the old map, the new placement keeps
experts where they are (see `eplb.engines.vllm.slot_keeping`): the old map may hold -1 (unused slots) and may have
another number of slots than num_replicas (ranks left or joined; the surviving ranks come first and keep their
slots), and an expert that stays on a rank keeps its slot. `configured(...)` makes a subclass with other options,
checked when it is made.

Both classes subclass vLLM's `AbstractEplbPolicy` when it can be imported, else `object`; only this module tries
(importing `eplb` never imports vLLM).
"""

import logging

import numpy as np
import torch

from eplb.engines.arguments import check_solver_options, checked_load, checked_old_map, cluster_of
from eplb.engines.deepseek.policy import (ADAPTER_WORK_LIMIT, POLICY_NAMES, cpsat_options, cpsat_or_baseline,
                                           tensors)
from eplb.engines.vllm.slot_keeping import keep_in_place, old_map_on_new_ranks, preserve_intragpu_slots
from eplb.engines.vllm.default_policy import vllm_default_phy2log
from placement import Placement

logger = logging.getLogger(__name__)

try:
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy as _PolicyBase
except Exception as exc:  # vLLM absent, or present without the packages its import needs
    logger.debug("vLLM's AbstractEplbPolicy cannot be imported (%s: %s); the policies subclass object",
                 type(exc).__name__, exc)
    _PolicyBase = object


class CpsatEplbPolicy(_PolicyBase):
    """This project's placement behind vLLM's `AbstractEplbPolicy` (vLLM 0.23 and later).

    Attributes:
        policy: "cpsat" (this project's policy, per layer the better of its fit and vLLM's `DefaultEplbPolicy`
            placement under equal split, vLLM's on a tie) or "deepseek" (vLLM's `DefaultEplbPolicy`, result for
            result).
        work_limit: the cpsat policy's deterministic budget for all layers of one call, work units (about a second
            of one core each); the same map on every rank.
        time_limit_s: a wall-clock budget instead, seconds, only for a caller that solves once and broadcasts
            (None: work_limit).
        seed: the cpsat policy's seed.
    """

    policy: str = "cpsat"
    work_limit: float = ADAPTER_WORK_LIMIT
    time_limit_s: float | None = None
    seed: int = 0

    @classmethod
    def configured(cls, *, policy: str | None = None, work_limit: float | None = None,
                   time_limit_s: float | None = None, seed: int | None = None) -> type:
        """A subclass with the options given (the others inherited), checked now: a ValueError names a bad one."""
        if work_limit is not None and time_limit_s is not None:
            raise ValueError("give work_limit (a deterministic budget) or time_limit_s (a wall-clock one), not both")
        options = {"policy": cls.policy if policy is None else policy,
                   "work_limit": cls.work_limit if work_limit is None else work_limit,
                   "time_limit_s": cls.time_limit_s if time_limit_s is None else time_limit_s,
                   "seed": cls.seed if seed is None else seed}
        _check_options(options["policy"], options["work_limit"], options["time_limit_s"], options["seed"])
        return type(f"{cls.__name__}_{options['policy']}", (cls,), options)

    @classmethod
    def rebalance_experts(
        cls,
        weight: torch.Tensor,
        num_replicas: int,
        num_groups: int,
        num_nodes: int,
        num_ranks: int,
        old_global_expert_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A new placement for the loads `weight`, as vLLM's `AbstractEplbPolicy` asks.

        Args:
            weight: [L, E], the load of each logical expert (any real dtype and device; read as float32).
            num_replicas: P >= E, slots in all, a multiple of num_ranks.
            num_groups: expert groups; hierarchical placement when num_nodes divides it (then it divides E).
            num_nodes: server nodes; num_ranks is a multiple of it.
            num_ranks: G, EP ranks.
            old_global_expert_indices: [L, P_old] int, the map now serving (-1 = an unused slot), or None. P_old is a
                multiple of S = P / G; P_old != P when ranks left (their slots are past P) or joined.

        Returns:
            physical_to_logical_map: [L, P] int64 on the CPU, the logical expert of each slot.

        Raises:
            ValueError: an argument or a class option breaks a rule above (the message names it).
        """
        phy2log_LP, _ = _phy2log_LP(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                                    old_global_expert_indices)
        return tensors(phy2log_LP)[0]


class LegacyCpsatEplbPolicy(CpsatEplbPolicy):
    """`CpsatEplbPolicy` with the return value of vLLM 0.14 to 0.18, whose policies returned three maps."""

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
        """As `CpsatEplbPolicy.rebalance_experts` (same arguments, same placement).

        Returns:
            phy2log: [L, P] int64, the logical expert of each slot.
            log2phy: [L, E, X] int64, the slots of each expert in ascending order, padded with -1.
            logcnt: [L, E] int64, replicas of each expert.
        """
        phy2log_LP, num_experts = _phy2log_LP(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                                              old_global_expert_indices)
        placement = Placement.equal_split(phy2log_LP, cluster_of(num_replicas, num_nodes, num_ranks), num_experts)
        return tensors(placement.phy2log_LP, placement.log2phy_LEX, placement.logcnt_LE)


def register_in_vllm() -> None:
    """Make `CpsatEplbPolicy` vLLM's "default" EPLB policy in this process (a `vllm.general_plugins` entry point
    runs it in every vLLM process; see eplb/engines/vllm/README.md)."""
    from vllm.distributed.eplb.policy import EPLB_POLICIES

    EPLB_POLICIES["default"] = CpsatEplbPolicy


def _check_options(policy, work_limit, time_limit_s, seed) -> None:
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy must be one of {POLICY_NAMES}; got {policy!r}")
    check_solver_options(work_limit, time_limit_s, seed)


def _phy2log_LP(cls, weight, num_replicas, num_groups, num_nodes, num_ranks, old) -> tuple[np.ndarray, int]:
    """[L, P] int64, the placement of `cls.policy` kept in place against the old map when one is given; and E."""
    load = checked_load(weight, num_replicas, num_groups, num_nodes, num_ranks, "num_ranks")
    _check_options(cls.policy, cls.work_limit, cls.time_limit_s, cls.seed)
    num_layers, num_experts = load.shape
    old_LP = None
    if old is not None:
        old_LP = old_map_on_new_ranks(checked_old_map(old, num_layers, num_experts, num_replicas // num_ranks),
                                      num_replicas)
    # vLLM's own default placement: the answer of policy "deepseek", and what the cpsat fit must beat per layer.
    phy2log = vllm_default_phy2log(load, num_replicas, num_groups, num_nodes, num_ranks)
    if cls.policy == "cpsat":
        cluster = cluster_of(num_replicas, num_nodes, num_ranks)
        options = cpsat_options(cls.work_limit, cls.time_limit_s, cls.seed, num_groups, num_nodes)
        new = cpsat_or_baseline(load.astype(np.float64), phy2log, cluster, options)
        phy2log = new.phy2log_LP if old_LP is None else keep_in_place(old_LP, new).phy2log_LP
    if old_LP is not None:
        phy2log = preserve_intragpu_slots(phy2log, old_LP, num_ranks)
    return phy2log, num_experts
