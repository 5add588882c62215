"""The `cpsat` policy: OR-Tools CP-SAT placement of every layer, fitted to a window of steps.

Legend: T window steps, L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, B sampled steps.

Per layer, in parallel threads within one wall-clock budget:
1. Starting placements: DeepSeek's greedy (the hint the result is never worse than) and chain layouts
   (`chain_layout`: replicated experts link all GPUs, so dynamic routing can move load anywhere), each with
   weights fitted to the window's mean load.
2. Under dynamic routing on small clusters, a local search (`ring_search`) swaps the replica sets of the best chain
   layout's experts, scored exactly on every step of the window, in part of the layer's spare time.
3. The CP-SAT model (`cpsat_model`) over B sampled steps, with each expert allowed on the GPUs of both
   starting placements plus a few others, hinted with the better start.
4. The fitted objective, the mean over the window's steps of max / mean GPU load under the router that will
   run, is evaluated for every candidate (the dynamic router with `ROUTER_ROUNDS` water-filling rounds, or the
   static weights); the best is kept, so the result is never worse than the greedy on that objective.
With `good_enough` set, a layer stops after any step whose best candidate's fitted objective is already that low.

The budget holds when other processes share the cores: the fixed work of steps 1, 3 and 4 (everything but the two
searches) is measured as layers run; a layer takes the best of `LEVELS` at which it and the layers not yet started
fit the time left (`plan_level`), checks again before its other chain starts and before CP-SAT, and the searches
get the time left over (`cpsat_budget`). OpenBLAS runs one thread meanwhile (`placement.blas_threads`).
One layer's steps are `placement.policies.cpsat_layer`; this module runs the layers on threads and sums them up.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from placement.blas_threads import one_blas_thread
from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError, PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies.cpsat_budget import LEVELS, FitBudget
from placement.policies.cpsat_config import CpSatConfig
from placement.policies.cpsat_layer import LayerResult, fitted_objective, solve_layer
from placement.policies.deepseek import place_deepseek, replicate_greedy

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
    config = CpSatConfig.model_validate(config.model_dump())
    began = time.perf_counter()
    num_steps, num_layers, num_experts = counts_TLE.shape
    cluster.check_fits(num_experts)
    speed_G = _speeds(config, cluster)
    mean_LE = counts_TLE.mean(axis=0)
    greedy = place_deepseek(counts_TLE.sum(axis=0), cluster)
    _, _, replicas_LE = replicate_greedy(mean_LE, cluster.num_slots)
    if current is not None and (current.phy2log_LP.shape != (num_layers, cluster.num_slots)
                                or current.num_experts != num_experts):
        raise PlacementFormatError("the current placement is for another model or cluster than this fit")
    budget = FitBudget(began + config.time_limit_s, num_layers, config.workers)

    def solve(layer: int, best: str = "full") -> LayerResult:
        try:
            return solve_layer(layer, counts_TLE[:, layer], mean_LE[layer], replicas_LE[layer], greedy, cluster,
                               config, speed_G, current, budget, best)
        finally:
            budget.finish_layer(layer)

    with one_blas_thread(), ThreadPoolExecutor(max_workers=config.workers) as pool:
        results = list(pool.map(solve, range(num_layers)))
        # Time left over (the cores freed up after the plan fell to the greedy): those layers get one chain start.
        again = [layer for layer, result in enumerate(results) if result.level == "greedy"]
        budget.reopen(len(again))
        for layer, result in zip(again, pool.map(solve, again, ["one-chain"] * len(again))):
            results[layer] = result
    info = _summary(results, time.perf_counter() - began, config, budget)
    info["revisited_layers"] = len(again)
    return Placement(np.stack([r.phy2log_P for r in results]), np.stack([r.weights_P for r in results]), cluster,
                     num_experts, "cpsat", info)


def _speeds(config: CpSatConfig, cluster: ClusterSpec) -> np.ndarray:
    if config.gpu_capacity is None:
        return np.ones(cluster.num_gpus)
    if len(config.gpu_capacity) != cluster.num_gpus:
        raise PlacementInfeasibleError(
            f"gpu_capacity lists {len(config.gpu_capacity)} GPUs but the cluster has {cluster.num_gpus}"
        )
    return np.asarray(config.gpu_capacity, dtype=np.float64)


def _summary(results: list[LayerResult], seconds: float, config: CpSatConfig, budget: FitBudget) -> dict:
    sources = [r.source for r in results]
    statuses = [r.status for r in results]
    levels = [r.level for r in results]
    objectives = [r.objective for r in results if r.objective is not None]
    bounds = [r.bound for r in results if r.bound is not None]
    scored = [r.fitted[r.source] for r in results if r.fitted]
    costs = {phase: round(budget.estimate(phase), 4) for phase in ("chain", "score", "model")}
    degraded = len(levels) - levels.count("full")
    return {
        "solver": "cp-sat",
        "routing": config.routing,
        "solve_seconds": seconds,
        "time_limit_s": config.time_limit_s,
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
        "cpsat_seconds_total": float(sum(r.solve_seconds for r in results)),
        "search_seconds_total": float(sum(r.search_seconds for r in results)),
        "levels": {name: levels.count(name) for name in LEVELS},
        # Layers whose search stopped at a candidate within `good_enough`.
        "good_enough_layers": sum(r.good_enough for r in results),
        "layer_levels": levels,
        "degraded_layers": degraded,
        "degraded_reason": None if not degraded else (
            f"the time left could not absorb every remaining layer's measured work at a better level (last estimates, "
            f"s: chain start {costs['chain']}, scoring a candidate {costs['score']}, CP-SAT model {costs['model']}; "
            f"{config.workers} workers); layers step down in the order {' > '.join(LEVELS)}"),
        "layer_costs_s": costs,
    }
