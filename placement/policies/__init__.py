"""Placement policies, by name. A policy fits a placement to a window of steps of a routing trace.

Each entry maps a name to `fit(counts_TLE [T, L, E], cluster, **options) -> Placement`.
"""

from collections.abc import Callable

import numpy as np
from pydantic import ValidationError

from placement.cluster import ClusterSpec
from placement.errors import PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies.cpsat_config import CpSatConfig
from placement.policies.deepseek import deepseek_rebalance, place_deepseek
from traces.routing_trace import validate_counts

PolicyFit = Callable[..., Placement]


def _fit_deepseek(counts_TLE: np.ndarray, cluster: ClusterSpec, num_groups: int | None = None) -> Placement:
    return place_deepseek(counts_TLE.sum(axis=0), cluster, num_groups=num_groups)


def fit_cpsat(counts_TLE: np.ndarray, cluster: ClusterSpec, **options) -> Placement:
    """This project's OR-Tools policy (`placement.policies.cpsat_policy.fit_cpsat`, the same arguments), imported on
    first use so that what never solves (the command line's other subcommands, a decode worker) does not import
    OR-Tools."""
    from placement.policies.cpsat_policy import fit_cpsat as fit

    return fit(counts_TLE, cluster, **options)


def _fit_trivial(counts_TLE: np.ndarray, cluster: ClusterSpec) -> Placement:
    """No balancing: slot p holds expert p % E (the engines' `trivial` layout), equal split over the copies."""
    _, num_layers, num_experts = counts_TLE.shape
    cluster.check_fits(num_experts)
    phy2log = np.tile(np.arange(cluster.num_slots) % num_experts, (num_layers, 1))
    return Placement.equal_split(phy2log, cluster, num_experts, "trivial")


POLICIES: dict[str, PolicyFit] = {"deepseek": _fit_deepseek, "trivial": _fit_trivial, "cpsat": fit_cpsat}


def fit_placement(policy: str, counts_TLE: np.ndarray, cluster: ClusterSpec, **options) -> Placement:
    """Fit a placement with the named policy to the steps of `counts_TLE` [T, L, E].

    `counts_TLE` must be whole, non-negative token counts (any integer or integral float dtype) and `cluster` a
    `ClusterSpec`, `options` the policy's own (an unknown one, or one out of range, is refused); anything else raises
    `TraceFormatError` or `PlacementInfeasibleError` (both `ValueError`s) naming the parameter.
    """
    if policy not in POLICIES:
        raise PlacementInfeasibleError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    if not isinstance(cluster, ClusterSpec):
        raise PlacementInfeasibleError(f"cluster must be a ClusterSpec; got {type(cluster).__name__}")
    unknown = sorted(set(options) - _OPTIONS[policy]())
    if unknown:
        known = ", ".join(sorted(_OPTIONS[policy]())) or "none"
        raise PlacementInfeasibleError(f"policy {policy!r} takes no option {', '.join(map(repr, unknown))}; its "
                                       f"options: {known}")
    counts = validate_counts(counts_TLE, "counts_TLE")
    if policy == "cpsat":
        try:
            CpSatConfig.model_validate({k: v for k, v in options.items() if k in CpSatConfig.model_fields})
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(map(str, first["loc"]))
            if not name:  # a check of several options together: its own message names them
                reason = first.get("ctx", {}).get("error", first["msg"])
                raise PlacementInfeasibleError(" ".join(str(reason).split())) from None
            raise PlacementInfeasibleError(f"{name}={first.get('input')!r}: {first['msg'].lower()}") from None
    return POLICIES[policy](counts, cluster, **options)


_OPTIONS = {"deepseek": lambda: {"num_groups"}, "trivial": set,
            "cpsat": lambda: set(CpSatConfig.model_fields) | {"config", "current"}}


__all__ = ["POLICIES", "CpSatConfig", "PolicyFit", "deepseek_rebalance", "fit_cpsat", "fit_placement", "place_deepseek"]
