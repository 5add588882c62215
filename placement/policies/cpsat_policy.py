"""The `cpsat` policy: OR-Tools CP-SAT placement of every layer, fitted to a window of steps.

Legend: T window steps, L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, B sampled steps.

Per layer, in parallel threads, each within its share of the budget (at two slots per GPU or fewer, and under equal
routing, only the greedy and step 2 with the whole budget: `cpsat_layer.swaps_only`):
1. Starting placements: DeepSeek's greedy (the placement the result is never worse than; under node limits its
   hierarchical policy) and chain layouts (`chain_layout`: replicated experts link all GPUs, so dynamic routing can
   move load anywhere; under node limits one chain per node), each with weights fitted to the window's mean load.
2. The swap search (`swap_search`) from the greedy: experts traded between GPUs on the window's steps under equal
   split (under equal routing also replicas moved between experts), what pays at two to four slots per GPU.
3. Under dynamic routing on small clusters, a local search (`ring_search`) swaps the replica sets of the best chain
   layout's experts, scored exactly on every step of the window.
4. The CP-SAT model (`cpsat_model`, `cpsat_solve`) over B sampled steps, with each expert allowed on the GPUs of
   the best starts plus a few others, hinted with the best candidate (not under equal routing, where the swap
   search takes the whole budget).
5. The fitted objective, the mean over the window's steps of max / mean GPU load under the router that will run
   (the dynamic router with `ROUTER_ROUNDS` water-filling rounds, the static weights, or an equal split), is
   evaluated for every candidate; the best is kept, so the result is never worse than the greedy on that objective.
With `good_enough` set, a layer stops after any step whose best candidate's fitted objective is already that low.

The budget is deterministic work by default (`work_budget.WorkBudget`: each layer an equal share of `work_limit`,
spent on counted work, never on the clock), so the same window gives the same placement in every process: what
engines need that compute the placement on every rank and broadcast nothing. `time_limit_s` asks for a
wall-clock budget instead (`cpsat_budget.FitBudget`), for a caller that solves once and broadcasts: layers then
step down as the clock runs short and get back what earlier layers left over. OpenBLAS runs one thread meanwhile
(`placement.blas_threads`). One layer's steps are `placement.policies.cpsat_layer`; this module runs the layers on
threads and sums them up, with each fit's lower bound (`placement.bounds`) beside its objective. An exception in the
thread that waits for them (Ctrl-C, SIGTERM) stops the layers (`fit_stop`): the fit ends within moments at any budget.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from placement.blas_threads import one_blas_thread
from placement.bounds import imbalance_lower_bound
from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError, PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies.cpsat_budget import LEVELS, FitBudget
from placement.policies.cpsat_config import CpSatConfig
from placement.policies.cpsat_layer import LayerResult, fitted_objective, solve_layer
from placement.policies.deepseek import place_deepseek, replicate_greedy
from placement.policies.fit_stop import FitStop
from placement.policies.node_limits import node_limits
from placement.policies.work_budget import LayerShape, WorkBudget

# `LEVELS` and `fitted_objective` are also imported from here by the benchmarks.
__all__ = ["LEVELS", "LayerResult", "fit_cpsat", "fitted_objective"]


def fit_cpsat(
    counts_TLE: np.ndarray,
    cluster: ClusterSpec,
    config: CpSatConfig | None = None,
    current: Placement | None = None,
    **overrides,
) -> Placement:
    """Fit a placement with CP-SAT to the window `counts_TLE` [T, L, E]; `overrides` update `config` fields."""
    config = (config or CpSatConfig()).model_copy(update=overrides)
    config = CpSatConfig.model_validate(config.model_dump(exclude_unset=True))  # what was set, checked together
    began = time.perf_counter()
    num_steps, num_layers, num_experts = counts_TLE.shape
    cluster.check_fits(num_experts)
    speed_G = _speeds(config, cluster)
    limits = None
    if config.groups is not None and cluster.num_nodes > 1:  # one node: every placement keeps the rule
        limits = node_limits(num_experts, cluster, config.groups, config.nodes_per_group)
    mean_LE = counts_TLE.mean(axis=0)
    greedy = place_deepseek(counts_TLE.sum(axis=0), cluster, num_groups=config.groups)
    _, _, replicas_LE = replicate_greedy(mean_LE, cluster.num_slots)
    if current is not None and (current.phy2log_LP.shape != (num_layers, cluster.num_slots)
                                or current.num_experts != num_experts):
        raise PlacementFormatError("the current placement is for another model or cluster than this fit")
    budget = _budget(config, num_steps, num_layers, num_experts, cluster, began)
    stop = FitStop()

    def solve(layer: int, best: str = "full") -> LayerResult:
        stop.check()  # a layer the pool takes after the fit stopped does not start
        try:
            return solve_layer(layer, counts_TLE[:, layer], mean_LE[layer], replicas_LE[layer], greedy, cluster,
                               config, speed_G, current, budget, limits, best, stop)
        finally:
            budget.finish_layer(layer)

    with one_blas_thread(), ThreadPoolExecutor(max_workers=config.workers) as pool:
        try:
            results = list(pool.map(solve, range(num_layers)))
            again = []
            if config.time_limit_s is not None:
                # Time left over (the cores freed up after the plan fell to the greedy): those layers get a chain
                # start.
                again = [layer for layer, result in enumerate(results) if result.level == "greedy"]
                budget.reopen(len(again))
                for layer, result in zip(again, pool.map(solve, again, ["one-chain"] * len(again))):
                    results[layer] = result
        except BaseException:
            # Interrupted (Ctrl-C, a signal turned into an exception) or broken: the layers stop now, rather than
            # the pool's exit waiting for every one submitted.
            stop.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    info = _summary(results, time.perf_counter() - began, config, budget)
    info["revisited_layers"] = len(again)
    info.update(_bound_summary(counts_TLE, cluster, results))
    return Placement(np.stack([r.phy2log_P for r in results]), np.stack([r.weights_P for r in results]), cluster,
                     num_experts, "cpsat", info)


def _budget(config: CpSatConfig, num_steps: int, num_layers: int, num_experts: int, cluster: ClusterSpec,
            began: float):
    """The fit's budget: the wall clock if `config.time_limit_s` asks for it, else deterministic work."""
    if config.time_limit_s is not None:
        return FitBudget(began + config.time_limit_s, num_layers, config.workers)
    shape = LayerShape(steps=num_steps, slots=cluster.num_slots, gpus=cluster.num_gpus, experts=num_experts,
                       routing=config.routing, sampled_steps=min(config.sampled_steps, num_steps),
                       candidates_per_expert=max(3 + config.extra_candidates, cluster.node_size
                                                 * (config.nodes_per_group or 0) * (cluster.num_nodes > 1)))
    return WorkBudget(config.work_limit, num_layers, shape)


def _bound_summary(counts_TLE: np.ndarray, cluster: ClusterSpec, results: list[LayerResult]) -> dict:
    """The fit's lower bound on the window (`placement.bounds`: no placement under any routing fits lower; mean
    over layers and steps) and the chosen layers' proven gap to it (scored layers only)."""
    num_steps, num_layers, num_experts = counts_TLE.shape
    rows_BE = counts_TLE.transpose(1, 0, 2).reshape(-1, num_experts)
    bound_L = imbalance_lower_bound(rows_BE, cluster.num_slots, cluster.num_gpus).reshape(num_layers, num_steps)
    bound_L = bound_L.mean(axis=1)
    scored = [(r.fitted[r.source], bound_L[layer]) for layer, r in enumerate(results) if r.fitted]
    return {"fitted_bound_mean": float(bound_L.mean()),
            "fitted_gap_mean": float(np.mean([fit - bound for fit, bound in scored])) if scored else None}


def _speeds(config: CpSatConfig, cluster: ClusterSpec) -> np.ndarray:
    if config.gpu_capacity is None:
        return np.ones(cluster.num_gpus)
    if len(config.gpu_capacity) != cluster.num_gpus:
        raise PlacementInfeasibleError(
            f"gpu_capacity lists {len(config.gpu_capacity)} GPUs but the cluster has {cluster.num_gpus}"
        )
    return np.asarray(config.gpu_capacity, dtype=np.float64)


def _summary(results: list[LayerResult], seconds: float, config: CpSatConfig, budget) -> dict:
    sources = [r.source for r in results]
    statuses = [r.status for r in results]
    levels = [r.level for r in results]
    objectives = [r.objective for r in results if r.objective is not None]
    bounds = [r.bound for r in results if r.bound is not None]
    scored = [r.fitted[r.source] for r in results if r.fitted]
    costs = {phase: round(budget.estimate(phase), 4) for phase in ("chain", "score", "model")}
    unit = "s" if config.time_limit_s is not None else "units"
    degraded = len(levels) - levels.count("full")
    return {
        "solver": "cp-sat",
        "routing": config.routing,
        "time_limit_s": config.time_limit_s,
        "work_limit": None if config.time_limit_s is not None else config.work_limit,
        **budget.summary(),
        "workers": config.workers,
        "layers_from": {name: sources.count(name) for name in sorted(set(sources))},
        "status": {name: statuses.count(name) for name in sorted(set(statuses))},
        "objective_mean": float(np.mean(objectives)) if objectives else None,
        "bound_mean": float(np.mean(bounds)) if bounds else None,
        "fitted_mean": {name: float(np.mean([r.fitted[name] for r in results if name in r.fitted]))
                        for name in sorted({n for r in results for n in r.fitted})},
        # Over the scored layers: those at level `greedy` keep the greedy unscored.
        "fitted_chosen": float(np.mean(scored)) if scored else None,
        "scored_layers": len(scored),
        # Scored layers whose greedy went unscored: a start beat its lower bound (`_fixed_load_bound`).
        "greedy_bounded_layers": sum(1 for r in results if r.fitted and "deepseek" not in r.fitted),
        "levels": {name: levels.count(name) for name in LEVELS},
        # Layers whose search stopped at a candidate within `good_enough`.
        "good_enough_layers": sum(r.good_enough for r in results),
        "layer_levels": levels,
        "degraded_layers": degraded,
        "degraded_reason": None if not degraded else (
            f"the budget could not pay for every layer's work at a better level (estimates, {unit}: chain start "
            f"{costs['chain']}, scoring a candidate {costs['score']}, CP-SAT model {costs['model']}); layers step "
            f"down in the order {' > '.join(LEVELS)}"),
        "layer_costs": costs,
        # Measured on the clock: how long this fit took here, not what it decided (placement files leave it out).
        "timing": {"solve_seconds": seconds,
                   "cpsat_seconds_total": float(sum(r.solve_seconds for r in results)),
                   "search_seconds_total": float(sum(r.search_seconds for r in results))},
    }
