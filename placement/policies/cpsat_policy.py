"""The `cpsat` policy: OR-Tools CP-SAT placement of every layer, fitted to a window of steps.

Legend: T window steps, L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, K sampled steps.

Per layer, in parallel threads within one wall-clock budget:
1. Starting placements: DeepSeek's greedy (the hint the result is never worse than) and chain layouts
   (`chain_layout`: replicated experts link all GPUs, so dynamic routing can move load anywhere), each with
   weights fitted to the window's mean load.
2. Under dynamic routing on small clusters, a local search (`ring_search`) swaps the replica sets of the best chain
   layout's experts, scored exactly on every step of the window, in part of the layer's spare time.
3. The CP-SAT model (`cpsat_model`) over K sampled steps, with each expert allowed on the GPUs of both
   starting placements plus a few others, hinted with the better start.
4. The fitted objective, the mean over the window's steps of max / mean GPU load under the router that will
   run, is evaluated for every candidate (the dynamic router with `ROUTER_ROUNDS` water-filling rounds, or the
   static weights); the best is kept, so the result is never worse than the greedy on that objective.
With `good_enough` set, a layer stops after any step whose best candidate's fitted objective is already that low.

The budget holds when other processes share the cores: the fixed work of steps 1, 3 and 4 (everything but the two
searches) is measured as layers run; a layer takes the best of `LEVELS` at which it and the layers not yet started
fit the time left (`plan_level`), checks again before its other chain starts and before CP-SAT, and the searches
get the time left over (`cpsat_budget`). OpenBLAS runs one thread meanwhile (`placement.blas_threads`).
"""

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from placement.blas_threads import one_blas_thread
from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError, PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies.chain_layout import chain_layout
from placement.policies.cpsat_budget import LEVELS, MIN_SOLVE_S, FitBudget
from placement.policies.cpsat_config import CpSatConfig
from placement.policies.cpsat_model import SPEED_SCALE, LayerProblem, add_placement_hint, build_layer_model
from placement.policies.deepseek import place_deepseek, replicate_greedy
from placement.policies.ring_search import ring_search, search_pays_off
from placement.routing.dynamic_split import ROUTER_ROUNDS, ReplicaGraph, optimal_split
from placement.routing.static_weights import fitted_weights

STATUS_NAMES = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
                cp_model.MODEL_INVALID: "invalid", cp_model.UNKNOWN: "unknown"}

@dataclass(frozen=True)
class LayerResult:
    """The placement chosen for one layer and how it was found."""

    phy2log_P: np.ndarray
    weights_P: np.ndarray
    source: str  # "deepseek", "chain-...", "chain-search", "current" or "cpsat"
    status: str
    fitted: dict  # fitted objective (mean max/mean over the window) of each candidate
    objective: float | None  # CP-SAT objective as mean imbalance over the sampled steps
    bound: float | None  # CP-SAT lower bound, same units
    solve_seconds: float = 0.0  # wall time inside CP-SAT
    search_seconds: float = 0.0  # wall time inside the ring search
    level: str = "full"  # one of LEVELS: how much of the work the budget let this layer do
    good_enough: bool = False  # a candidate met `CpSatConfig.good_enough`: the rest of the search was skipped


def fitted_objective(counts_TE: np.ndarray, phy2log_P, weights_P, cluster: ClusterSpec, routing: str,
                     speed_G: np.ndarray) -> float:
    """Mean over steps of max / mean GPU load (loads divided by speed) under the router that will run."""
    gpu_of_slot = np.arange(cluster.num_slots) // cluster.slots_per_gpu
    counts = counts_TE.astype(np.float64)
    if routing == "static":
        loads = np.zeros((len(counts), cluster.num_gpus))
        np.add.at(loads.T, gpu_of_slot, (counts[:, phy2log_P] * weights_P).T)
    else:
        graph = ReplicaGraph.build(phy2log_P, gpu_of_slot, counts.shape[1], cluster.num_gpus, weights_P)
        _, loads, _ = optimal_split(counts, graph, tolerance=1e-3, max_rounds=ROUTER_ROUNDS)
    mean = np.maximum(loads.mean(axis=1), 1e-12)
    return float(((loads / speed_G).max(axis=1) / mean).mean())


def router_split_KEG(counts_KE: np.ndarray, phy2log_P, weights_P, num_gpus: int, slots: int) -> np.ndarray:
    """[K, E, G] tokens of each expert on each GPU under the dynamic router (fractional)."""
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    num_experts = counts_KE.shape[1]
    graph = ReplicaGraph.build(phy2log_P, gpu_of_slot, num_experts, num_gpus, weights_P)
    share_KMX, _, _ = optimal_split(counts_KE, graph, tolerance=1e-3, max_rounds=ROUTER_ROUNDS)
    split = counts_KE[:, :, None] * graph.fixed_EG[None].astype(np.float64)
    padded = np.zeros((len(counts_KE), num_experts, num_gpus + 1))
    padded[:, :, :num_gpus] = split
    if len(graph.movable_M):
        padded[:, graph.movable_M[:, None], graph.gpus_MX] = share_KMX
    return padded[:, :, :num_gpus]


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
            return _solve_layer(layer, counts_TLE[:, layer], mean_LE[layer], replicas_LE[layer], greedy, cluster,
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


def _chain_orders(replicas_E: np.ndarray, num_gpus: int, config: CpSatConfig) -> list[tuple[str, int]]:
    """Ring orders of the chain starts, the one that level `one-chain` keeps first: a random order (fitted 1.0255 at
    128 x 3 on the synthetic full shape, against 1.0301 interleaved). None where an expert has more replicas than
    there are GPUs."""
    if replicas_E.max() > num_gpus:
        return []
    randoms = [("random", config.seed * 1000 + i) for i in range(config.layout_seeds)]
    return randoms[:1] + [("interleave", 0)] + randoms[1:]


def _add_starts(counts_TE, mean_E, replicas_E, cluster: ClusterSpec, config: CpSatConfig, speed_G,
                orders: list[tuple[str, int]], starts: dict, fitted: dict, budget: FitBudget) -> None:
    """Step 1 for the ring `orders`: adds their chain layouts to `starts`, then scores every start not yet in
    `fitted` (the greedy under static routing only: see `_solve_layer`), measuring both for the budget."""
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    began = budget.clock()
    for order, seed in orders:
        chain = chain_layout(mean_E, replicas_E, num_gpus, slots, order, seed, counts_TE)
        starts[f"chain-{order}" if order != "random" else f"chain-random{seed}"] = (
            chain, fitted_weights(chain, mean_E, num_gpus, slots))
    if orders:
        budget.observe("chain", (budget.clock() - began) / len(orders))
    began = budget.clock()
    new = [name for name in starts if name not in fitted and (name != "deepseek" or config.routing == "static")]
    for name in new:
        fitted[name] = fitted_objective(counts_TE, *starts[name], cluster, config.routing, speed_G)
    if new:
        budget.observe("score", (budget.clock() - began) / len(new))


def _solve_layer(layer, counts_TE, mean_E, replicas_E, greedy: Placement, cluster: ClusterSpec, config: CpSatConfig,
                 speed_G, current: Placement | None, budget: FitBudget, best: str = "full") -> LayerResult:
    """One layer, at the best of LEVELS from `best` on that the budget allows."""
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    orders = _chain_orders(replicas_E, num_gpus, config)
    # Chain starts, other candidates to score: the current placement, and the greedy under static routing.
    work = (len(orders), (current is not None) + (config.routing == "static"))
    # Only CP-SAT keeps expert groups within their nodes: node-limited layers are always full.
    level = "full" if config.groups is not None else budget.start_layer(layer, *work, best)
    if level == "greedy":
        return LayerResult(greedy.phy2log_LP[layer], greedy.weights_LP[layer], "deepseek", "skipped", {}, None, None,
                           level=level)
    starts = {"deepseek": (greedy.phy2log_LP[layer], greedy.weights_LP[layer])}
    if current is not None:
        starts["current"] = (current.phy2log_LP[layer],
                             fitted_weights(current.phy2log_LP[layer], mean_E, num_gpus, slots))
    fitted: dict[str, float] = {}

    def penalised(name: str) -> float:
        return fitted[name] + _move_penalty(starts[name][0], current, layer, config, slots)

    def good_enough() -> bool:
        return config.good_enough is not None and min(map(penalised, fitted)) <= config.good_enough

    # The first chain start with the other candidates; the other chain starts if the time left still allows.
    _add_starts(counts_TE, mean_E, replicas_E, cluster, config, speed_G, orders[:1], starts, fitted, budget)
    # Under dynamic routing the greedy is scored only if no start provably beats it: its experts with one replica
    # cannot move, which bounds its fitted objective from below (a chain start beat the bound in 57-59 of 61 layers
    # of the synthetic full shape; scoring is most of a layer's fixed work).
    if "deepseek" not in fitted:
        greedy_floor = (_fixed_load_bound(counts_TE, starts["deepseek"][0], cluster, speed_G)
                        + _move_penalty(starts["deepseek"][0], current, layer, config, slots))
        if not fitted or min(map(penalised, fitted)) > greedy_floor:
            fitted["deepseek"] = fitted_objective(counts_TE, *starts["deepseek"], cluster, config.routing, speed_G)
    enough = good_enough()
    if level != "one-chain" and len(orders) > 1 and not enough:
        if config.groups is None:
            rest = (len(orders) - 1) * (budget.estimate("chain") + budget.estimate("score"))
            level = budget.resume(layer, level, "one-chain",
                                  [rest + budget.estimate("model") + MIN_SOLVE_S, rest, 0.0, 0.0], *work)
        if level != "one-chain":
            _add_starts(counts_TE, mean_E, replicas_E, cluster, config, speed_G, orders[1:], starts, fitted, budget)
            enough = good_enough()

    search_seconds = 0.0
    chains = [name for name in fitted if name.startswith("chain")]
    if (level == "full" and not enough and config.routing == "dynamic" and config.ring_search and config.groups is None
            and chains and search_pays_off(len(counts_TE), num_gpus)):
        searched = budget.clock()
        start = min(chains, key=fitted.get)
        # Half the spare time: the searched layout is then weighted and scored like a chain start, and the model built.
        after = budget.estimate("chain") + budget.estimate("score") + budget.estimate("model")
        deadline = time.perf_counter() + 0.5 * budget.spare(layer, after, *work)
        phy2log, _ = ring_search(counts_TE, starts[start][0], num_gpus, slots, speed_G, (config.seed, layer), deadline)
        starts["chain-search"] = (phy2log, fitted_weights(phy2log, mean_E, num_gpus, slots))
        fitted["chain-search"] = fitted_objective(counts_TE, *starts["chain-search"], cluster, config.routing, speed_G)
        search_seconds = budget.clock() - searched
        enough = good_enough()
    if level == "full" and not enough and config.groups is None:
        level = budget.resume(layer, level, "starts", [budget.estimate("model") + MIN_SOLVE_S, 0.0, 0.0, 0.0], *work)
    status, objective, bound, seconds = "skipped", None, None, 0.0
    if level == "full" and not enough:
        status, objective, bound, seconds = _add_cpsat_candidate(
            layer, counts_TE, mean_E, starts, fitted, min(fitted, key=penalised), cluster, config, speed_G, current,
            budget, work)
    if config.groups is not None and "cpsat" not in starts:
        raise PlacementInfeasibleError(
            f"layer {layer}: no node-limited placement found within the time limit; raise the time limit"
        )
    chosen = min(fitted, key=penalised) if config.groups is None else "cpsat"
    phy2log, weights = starts[chosen]
    return LayerResult(np.asarray(phy2log), np.asarray(weights), chosen, status, fitted, objective, bound, seconds,
                       search_seconds, level, enough)


def _add_cpsat_candidate(layer, counts_TE, mean_E, starts: dict, fitted: dict, best_start: str, cluster: ClusterSpec,
                         config: CpSatConfig, speed_G, current: Placement | None, budget: FitBudget,
                         work: tuple[int, int]) -> tuple[str, float | None, float | None, float]:
    """Steps 3-4 of a full layer: solve its CP-SAT model in the spare time, hinted with `best_start`, and add the
    solution to `starts` and `fitted`. Returns the status, objective, bound and seconds of the solve."""
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    began = budget.clock()
    near = {name: starts[name] for name in {best_start, "deepseek", "current"} if name in starts}
    problem = _layer_problem(layer, counts_TE, mean_E, near, cluster, config, speed_G, current)
    lm = build_layer_model(problem)
    split = None
    if config.routing == "dynamic":
        split = router_split_KEG(problem.counts_KE, *starts[best_start], num_gpus, slots)
    add_placement_hint(lm, problem, *starts[best_start], split)
    solver = cp_model.CpSolver()
    # After the solve, the solution is weighted and scored like a chain start.
    after = budget.estimate("chain") + budget.estimate("score")
    solver.parameters.max_time_in_seconds = max(MIN_SOLVE_S, budget.spare(layer, after, *work))
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = config.seed
    solving = budget.clock()
    code = solver.solve(lm.model)
    solved = budget.clock() - solving
    status, objective, bound = STATUS_NAMES.get(code, str(code)), None, None
    scale = problem.counts_KE.sum(axis=1).mean() / num_gpus * len(problem.counts_KE)
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        phy2log = _placement_from_solution(solver, lm, num_gpus, slots)
        if config.routing == "static":
            weights = _weights_from_shares(solver, lm, phy2log, slots, config.weight_scale)
            scale *= config.weight_scale
        else:
            weights = fitted_weights(phy2log, mean_E, num_gpus, slots)
        starts["cpsat"] = (phy2log, weights)
        fitted["cpsat"] = fitted_objective(counts_TE, phy2log, weights, cluster, config.routing, speed_G)
        objective, bound = solver.objective_value / scale, solver.best_objective_bound / scale
    elif code == cp_model.INFEASIBLE and (config.groups is not None):
        raise PlacementInfeasibleError(
            f"layer {layer}: no placement keeps every group of {len(mean_E) // config.groups} experts within "
            f"{config.nodes_per_group} node(s); raise nodes_per_group"
        )
    budget.observe("model", budget.clock() - began - solved)
    return status, objective, bound, solver.wall_time


def _fixed_load_bound(counts_TE: np.ndarray, phy2log_P: np.ndarray, cluster: ClusterSpec, speed_G) -> float:
    """A lower bound on `fitted_objective` under dynamic routing: each step's busiest GPU carries at least the tokens
    of the experts with one replica on it, which no split can move."""
    gpu_of_slot = np.arange(cluster.num_slots) // cluster.slots_per_gpu
    counts = counts_TE.astype(np.float64)
    single = np.bincount(phy2log_P, minlength=counts.shape[1])[phy2log_P] == 1
    fixed_TG = np.zeros((len(counts), cluster.num_gpus))
    np.add.at(fixed_TG.T, gpu_of_slot[single], counts[:, phy2log_P[single]].T)
    mean = np.maximum(counts.sum(axis=1) / cluster.num_gpus, 1e-12)
    return float(((fixed_TG / speed_G).max(axis=1) / mean).mean())


def _move_penalty(phy2log_P, current: Placement | None, layer: int, config: CpSatConfig, slots: int) -> float:
    """migration_cost times the replicas that `phy2log_P` places where the current placement has none."""
    if current is None or config.migration_cost == 0:
        return 0.0
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    now = set(zip(current.phy2log_LP[layer].tolist(), gpu_of_slot.tolist()))
    return config.migration_cost * sum(pair not in now for pair in zip(phy2log_P.tolist(), gpu_of_slot.tolist()))


def _layer_problem(layer, counts_TE, mean_E, starts, cluster, config, speed_G, current) -> LayerProblem:
    num_steps, num_experts = counts_TE.shape
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    rng = np.random.default_rng([config.seed, layer])
    # Sampled steps: evenly spread over the window.
    chosen_steps = np.unique(np.linspace(0, num_steps - 1, min(config.sampled_steps, num_steps)).round().astype(int))
    allowed = np.zeros((num_experts, num_gpus), dtype=bool)
    gpu_of_slot = np.arange(cluster.num_slots) // slots
    for phy2log, _ in starts.values():
        allowed[phy2log, gpu_of_slot] = True
    if config.extra_candidates:
        extra = rng.integers(0, num_gpus, size=(num_experts, config.extra_candidates))
        allowed[np.arange(num_experts)[:, None], extra] = True
    current_EG = None
    move_cost = 0
    if current is not None:
        current_EG = np.zeros((num_experts, num_gpus), dtype=bool)
        current_EG[current.phy2log_LP[layer], gpu_of_slot] = True
        move_cost = int(round(config.migration_cost * mean_E.sum() / num_gpus * len(chosen_steps)))
    group_of_E = node_of_G = None
    if config.groups is not None:
        if num_experts % config.groups:
            raise PlacementInfeasibleError(f"groups={config.groups} does not divide the {num_experts} experts")
        if config.nodes_per_group > cluster.num_nodes:
            raise PlacementInfeasibleError(
                f"nodes_per_group={config.nodes_per_group} exceeds the cluster's {cluster.num_nodes} node(s)"
            )
        group_of_E = np.arange(num_experts) // (num_experts // config.groups)
        node_of_G = np.arange(num_gpus) // cluster.node_size
        # Every group may use all GPUs of `nodes_per_group` nodes: heaviest groups first, on consecutive nodes
        # round the cluster, so each node serves about the same number of groups.
        group_load = np.bincount(group_of_E, mean_E, minlength=config.groups)
        for rank, group in enumerate(np.argsort(-group_load, kind="stable")):
            nodes = [(rank * config.nodes_per_group + i) % cluster.num_nodes for i in range(config.nodes_per_group)]
            allowed[np.ix_(group_of_E == group, np.isin(node_of_G, nodes))] = True
    return LayerProblem(
        counts_KE=counts_TE[chosen_steps].astype(np.int64),
        candidates=[np.flatnonzero(row) for row in allowed],
        num_gpus=num_gpus,
        slots_per_gpu=slots,
        routing=config.routing,
        speed_G=np.round(speed_G * SPEED_SCALE).astype(np.int64),
        weight_scale=config.weight_scale,
        current_EG=current_EG,
        move_cost=move_cost,
        group_of_E=group_of_E,
        node_of_G=node_of_G,
        nodes_per_group=config.nodes_per_group,
    )


def _placement_from_solution(solver: cp_model.CpSolver, lm, num_gpus: int, slots: int) -> np.ndarray:
    per_gpu: list[list[int]] = [[] for _ in range(num_gpus)]
    for (expert, gpu), var in sorted(lm.holds.items()):
        if solver.boolean_value(var):
            per_gpu[gpu].append(expert)
    return np.array([e for experts in per_gpu for e in experts], dtype=np.int64)


def _weights_from_shares(solver, lm, phy2log_P: np.ndarray, slots: int, scale: int) -> np.ndarray:
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    return np.array([solver.value(lm.shares[int(e), int(g)]) / scale for e, g in zip(phy2log_P, gpu_of_slot)])


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
