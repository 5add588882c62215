"""The `cpsat` policy: OR-Tools CP-SAT placement of every layer, fitted to a window of steps.

Legend: T window steps, L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, K sampled steps.

Per layer, in parallel threads within one wall-clock budget:
1. Two starting placements: DeepSeek's greedy (the hint the result is never worse than) and a chain layout
   (`chain_layout`: replicated experts link all GPUs, so dynamic routing can move load anywhere), each with
   weights fitted to the window's mean load.
2. Under dynamic routing on small clusters, a local search (`ring_search`) swaps the replica sets of the best chain
   layout's experts, scored exactly on every step of the window, with up to half of the layer's time.
3. The CP-SAT model (`cpsat_model`) over K sampled steps, with each expert allowed on the GPUs of both
   starting placements plus a few others, hinted with the better start.
4. The fitted objective, the mean over the window's steps of max / mean GPU load under the router that will
   run, is evaluated for every candidate (the dynamic router with `ROUTER_ROUNDS` water-filling rounds, or the
   static weights); the best is kept, so the result is never worse than the greedy on that objective.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from placement.cluster import ClusterSpec
from placement.dynamic_split import ROUTER_ROUNDS, ReplicaGraph, optimal_split
from placement.errors import PlacementFormatError, PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies.chain_layout import chain_layout
from placement.policies.cpsat_config import CpSatConfig
from placement.policies.cpsat_model import SPEED_SCALE, LayerProblem, add_placement_hint, build_layer_model
from placement.policies.deepseek import place_deepseek, replicate_greedy
from placement.policies.ring_search import ring_search, search_pays_off
from placement.static_weights import fitted_weights

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
    budget = _Budget(began + config.time_limit_s, num_layers, config.workers)

    def solve(layer: int) -> LayerResult:
        clock = budget.start_layer()
        result = _solve_layer(layer, counts_TLE[:, layer], mean_LE[layer], replicas_LE[layer], greedy, cluster,
                              config, speed_G, current, clock.left)
        budget.finish_layer(clock, result.solve_seconds + result.search_seconds)
        return result

    with ThreadPoolExecutor(max_workers=config.workers) as pool:
        results = list(pool.map(solve, range(num_layers)))
    info = _summary(results, time.perf_counter() - began, config)
    return Placement(np.stack([r.phy2log_P for r in results]), np.stack([r.weights_P for r in results]), cluster,
                     num_experts, "cpsat", info)


class _Budget:
    """Shares one wall-clock deadline among layers solved `workers` at a time.

    A layer, when it starts, may use its share of what is left (`workers` layers run at once); CP-SAT gets that
    share minus the work around the searches (construction, evaluation, model building), estimated as 1.5 times
    the largest such overhead seen so far; the ring search and CP-SAT share what is left.
    """

    def __init__(self, deadline: float, num_layers: int, workers: int) -> None:
        self._deadline = deadline
        self._layers_left = num_layers
        self._workers = workers
        self.overhead = 0.0
        self._lock = threading.Lock()

    def start_layer(self) -> "_LayerClock":
        with self._lock:
            layers_left = self._layers_left
            self._layers_left -= 1
        began = time.perf_counter()
        share = (self._deadline - began) * min(self._workers, layers_left) / max(1, layers_left)
        return _LayerClock(self, began, share)

    def finish_layer(self, clock: "_LayerClock", solve_seconds: float) -> None:
        with self._lock:
            self.overhead = max(self.overhead, time.perf_counter() - clock.began - solve_seconds)


@dataclass(frozen=True)
class _LayerClock:
    budget: _Budget
    began: float
    share: float

    def left(self) -> float:
        """Seconds CP-SAT may still use for this layer."""
        return self.share - 1.5 * self.budget.overhead - (time.perf_counter() - self.began)


def _speeds(config: CpSatConfig, cluster: ClusterSpec) -> np.ndarray:
    if config.gpu_capacity is None:
        return np.ones(cluster.num_gpus)
    if len(config.gpu_capacity) != cluster.num_gpus:
        raise PlacementInfeasibleError(
            f"gpu_capacity lists {len(config.gpu_capacity)} GPUs but the cluster has {cluster.num_gpus}"
        )
    return np.asarray(config.gpu_capacity, dtype=np.float64)


def _starts(layer, counts_TE, mean_E, replicas_E, greedy: Placement, cluster: ClusterSpec, config: CpSatConfig,
            current: Placement | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The candidate placements of one layer before CP-SAT: the greedy, chain layouts, the current one."""
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    starts = {"deepseek": (greedy.phy2log_LP[layer], greedy.weights_LP[layer])}
    if replicas_E.max() <= num_gpus:
        orders = [("interleave", 0)] + [("random", config.seed * 1000 + i) for i in range(config.layout_seeds)]
        for order, seed in orders:
            chain = chain_layout(mean_E, replicas_E, num_gpus, slots, order, seed, counts_TE)
            starts[f"chain-{order}" if order != "random" else f"chain-random{seed}"] = (
                chain, fitted_weights(chain, mean_E, num_gpus, slots))
    if current is not None:
        phy2log = current.phy2log_LP[layer]
        starts["current"] = (phy2log, fitted_weights(phy2log, mean_E, num_gpus, slots))
    return starts


def _solve_layer(layer, counts_TE, mean_E, replicas_E, greedy: Placement, cluster: ClusterSpec, config: CpSatConfig,
                 speed_G, current: Placement | None, time_left) -> LayerResult:
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    starts = _starts(layer, counts_TE, mean_E, replicas_E, greedy, cluster, config, current)
    began = time.perf_counter()
    fitted = {name: fitted_objective(counts_TE, p, w, cluster, config.routing, speed_G)
              for name, (p, w) in starts.items()}
    # After the solve, the CP-SAT candidate is weighted and evaluated like one start: keep twice that time back.
    after_solve = 2.0 * (time.perf_counter() - began) / len(starts)

    def penalised(name: str) -> float:
        return fitted[name] + _move_penalty(starts[name][0], current, layer, config, slots)

    search_seconds = 0.0
    chains = [name for name in fitted if name.startswith("chain")]
    if (config.routing == "dynamic" and config.ring_search and config.groups is None and chains
            and search_pays_off(len(counts_TE), num_gpus)):
        searched = time.perf_counter()
        start = min(chains, key=fitted.get)
        deadline = searched + 0.5 * max(0.0, time_left() - after_solve)
        phy2log, _ = ring_search(counts_TE, starts[start][0], num_gpus, slots, speed_G, (config.seed, layer), deadline)
        starts["chain-search"] = (phy2log, fitted_weights(phy2log, mean_E, num_gpus, slots))
        fitted["chain-search"] = fitted_objective(counts_TE, *starts["chain-search"], cluster, config.routing, speed_G)
        search_seconds = time.perf_counter() - searched
    best_start = min(fitted, key=penalised)
    status, objective, bound, seconds = "skipped", None, None, 0.0
    if time_left() - after_solve > 0.05:
        near = {name: starts[name] for name in {best_start, "deepseek", "current"} if name in starts}
        problem = _layer_problem(layer, counts_TE, mean_E, near, cluster, config, speed_G, current)
        lm = build_layer_model(problem)
        split = None
        if config.routing == "dynamic":
            split = router_split_KEG(problem.counts_KE, *starts[best_start], num_gpus, slots)
        add_placement_hint(lm, problem, *starts[best_start], split)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, time_left() - after_solve)
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = config.seed
        code = solver.solve(lm.model)
        status, seconds = STATUS_NAMES.get(code, str(code)), solver.wall_time
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
    if config.groups is not None and "cpsat" not in starts:
        raise PlacementInfeasibleError(
            f"layer {layer}: no node-limited placement found within the time limit; raise the time limit"
        )
    chosen = min(fitted, key=penalised) if config.groups is None else "cpsat"
    phy2log, weights = starts[chosen]
    return LayerResult(np.asarray(phy2log), np.asarray(weights), chosen, status, fitted, objective, bound, seconds,
                       search_seconds)


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


def _summary(results: list[LayerResult], seconds: float, config: CpSatConfig) -> dict:
    sources = [r.source for r in results]
    statuses = [r.status for r in results]
    objectives = [r.objective for r in results if r.objective is not None]
    bounds = [r.bound for r in results if r.bound is not None]
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
        "fitted_chosen": float(np.mean([r.fitted[r.source] for r in results])),
        "cpsat_seconds_total": float(sum(r.solve_seconds for r in results)),
        "search_seconds_total": float(sum(r.search_seconds for r in results)),
    }
