"""One layer of a `cpsat` fit: its candidates, scored on the window, at the level of work the budget allows.

Legend: T window steps, E logical experts, G GPUs, S slots per GPU, P = G * S slots, B sampled steps,
M experts with replicas on two or more GPUs, Y the most GPUs one such expert spans.

`solve_layer` runs the phases of `placement.policies.cpsat_policy`'s steps 1-4 for one layer, each a function
here: the starting placements (`_score_starts`), the ring search (`_ring_search_phase`), the CP-SAT candidate
(`_cpsat_phase`) and the choice (`_choose`). A `_LayerSearch` carries the candidates and the level between them;
the budget may lower the level before the other chain starts and before CP-SAT (`FitBudget.resume`).
"""

import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from placement.cluster import ClusterSpec
from placement.errors import PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies.chain_layout import chain_layout
from placement.policies.cpsat_budget import MIN_SOLVE_S, FitBudget
from placement.policies.cpsat_config import CpSatConfig
from placement.policies.cpsat_model import (
    SPEED_SCALE,
    LayerProblem,
    add_placement_hint,
    build_layer_model,
    solved_placement,
    solved_weights,
)
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


def router_split_BEG(counts_BE: np.ndarray, phy2log_P, weights_P, num_gpus: int, slots: int) -> np.ndarray:
    """[B, E, G] tokens of each expert on each GPU under the dynamic router (fractional)."""
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    num_experts = counts_BE.shape[1]
    graph = ReplicaGraph.build(phy2log_P, gpu_of_slot, num_experts, num_gpus, weights_P)
    share_BMY, _, _ = optimal_split(counts_BE, graph, tolerance=1e-3, max_rounds=ROUTER_ROUNDS)
    split = counts_BE[:, :, None] * graph.fixed_EG[None].astype(np.float64)
    padded = np.zeros((len(counts_BE), num_experts, num_gpus + 1))
    padded[:, :, :num_gpus] = split
    if len(graph.movable_M):
        padded[:, graph.movable_M[:, None], graph.gpus_MY] = share_BMY
    return padded[:, :, :num_gpus]


@dataclass
class _LayerSearch:
    """One layer's search as it goes: what crosses the phases of `solve_layer`.

    Attributes:
        layer: the layer's index.
        counts_TE: [T, E] the layer's tokens per expert on each step of the window.
        mean_E: [E] their mean over the window.
        replicas_E: [E] int, replicas of each expert in the chain starts.
        cluster, config, current, budget: as `fit_cpsat`'s (current: the placement now serving, or None).
        speed_G: [G] relative GPU speeds.
        orders: ring orders of the chain starts (`_chain_orders`).
        level: one of LEVELS, the work the budget lets the layer do; it may step down between phases.
        starts: candidate name -> (phy2log_P [P] int64, weights_P [P] float).
        fitted: candidate name -> fitted objective (`fitted_objective`) of the candidates scored so far.
        enough: a scored candidate is within `config.good_enough`: the phases still to come are skipped.
        search_seconds: wall time inside the ring search.
    """

    layer: int
    counts_TE: np.ndarray
    mean_E: np.ndarray
    replicas_E: np.ndarray
    cluster: ClusterSpec
    config: CpSatConfig
    speed_G: np.ndarray
    current: Placement | None
    budget: FitBudget
    orders: list[tuple[str, int]]
    level: str
    starts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    fitted: dict[str, float] = field(default_factory=dict)
    enough: bool = False
    search_seconds: float = 0.0

    @property
    def work(self) -> tuple[int, int]:
        """Chain starts, and other candidates to score: the current placement, and the greedy under static
        routing."""
        return len(self.orders), (self.current is not None) + (self.config.routing == "static")

    def weighted(self, phy2log_P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(phy2log_P, its static weights fitted to the window's mean load)."""
        return phy2log_P, fitted_weights(phy2log_P, self.mean_E, self.cluster.num_gpus, self.cluster.slots_per_gpu)

    def score(self, name: str) -> None:
        """Scores candidate `name` on the window under the router that will run."""
        self.fitted[name] = fitted_objective(self.counts_TE, *self.starts[name], self.cluster, self.config.routing,
                                             self.speed_G)

    def penalised(self, name: str) -> float:
        """The fitted objective of candidate `name` plus its move penalty against the current placement."""
        return self.fitted[name] + _move_penalty(self.starts[name][0], self.current, self.layer, self.config,
                                                 self.cluster.slots_per_gpu)

    def best(self) -> str:
        """The scored candidate with the least penalised objective."""
        return min(self.fitted, key=self.penalised)

    def check_enough(self) -> None:
        """Sets `enough` once the best scored candidate is within `config.good_enough`."""
        self.enough = self.config.good_enough is not None and self.penalised(self.best()) <= self.config.good_enough


def solve_layer(layer, counts_TE, mean_E, replicas_E, greedy: Placement, cluster: ClusterSpec, config: CpSatConfig,
                speed_G, current: Placement | None, budget: FitBudget, best: str = "full") -> LayerResult:
    """One layer, at the best of LEVELS from `best` on that the budget allows."""
    search = _LayerSearch(layer, counts_TE, mean_E, replicas_E, cluster, config, speed_G, current, budget,
                          _chain_orders(replicas_E, cluster.num_gpus, config), level="greedy")
    # Only CP-SAT keeps expert groups within their nodes: node-limited layers are always full.
    search.level = "full" if config.groups is not None else budget.start_layer(layer, *search.work, best)
    if search.level == "greedy":
        return LayerResult(greedy.phy2log_LP[layer], greedy.weights_LP[layer], "deepseek", "skipped", {}, None, None,
                           level=search.level)
    search.starts["deepseek"] = (greedy.phy2log_LP[layer], greedy.weights_LP[layer])
    if current is not None:
        search.starts["current"] = search.weighted(current.phy2log_LP[layer])
    _score_starts(search)
    _ring_search_phase(search)
    if search.level == "full" and not search.enough and config.groups is None:
        search.level = budget.resume(layer, search.level, "starts",
                                     [budget.estimate("model") + MIN_SOLVE_S, 0.0, 0.0, 0.0], *search.work)
    solve = ("skipped", None, None, 0.0)
    if search.level == "full" and not search.enough:
        solve = _cpsat_phase(search)
    return _choose(search, *solve)


def _score_starts(search: _LayerSearch) -> None:
    """Step 1: the first chain start with the other candidates, the greedy unless a start provably beats it, then
    the other chain starts if the level and the time left still allow them."""
    _add_starts(search, search.orders[:1])
    # Under dynamic routing the greedy is scored only if no start provably beats it: its experts with one replica
    # cannot move, which bounds its fitted objective from below (a chain start usually beats that bound, and
    # scoring is most of a layer's fixed work: figures in docs/placement.md, 'CP-SAT time budget').
    if "deepseek" not in search.fitted:
        greedy_P = search.starts["deepseek"][0]
        greedy_floor = (_fixed_load_bound(search.counts_TE, greedy_P, search.cluster, search.speed_G)
                        + _move_penalty(greedy_P, search.current, search.layer, search.config,
                                        search.cluster.slots_per_gpu))
        if not search.fitted or search.penalised(search.best()) > greedy_floor:
            search.score("deepseek")
    search.check_enough()
    if search.level == "one-chain" or len(search.orders) <= 1 or search.enough:
        return
    budget = search.budget
    if search.config.groups is None:
        rest = (len(search.orders) - 1) * (budget.estimate("chain") + budget.estimate("score"))
        search.level = budget.resume(search.layer, search.level, "one-chain",
                                     [rest + budget.estimate("model") + MIN_SOLVE_S, rest, 0.0, 0.0], *search.work)
    if search.level != "one-chain":
        _add_starts(search, search.orders[1:])
        search.check_enough()


def _ring_search_phase(search: _LayerSearch) -> None:
    """Step 2: under dynamic routing, where it pays off, the ring search from the best chain start, in half the
    layer's spare time; its layout becomes the candidate "chain-search"."""
    config, budget, cluster = search.config, search.budget, search.cluster
    chains = [name for name in search.fitted if name.startswith("chain")]
    if not (search.level == "full" and not search.enough and config.routing == "dynamic" and config.ring_search
            and config.groups is None and chains and search_pays_off(len(search.counts_TE), cluster.num_gpus)):
        return
    searched = budget.clock()
    start = min(chains, key=search.fitted.get)
    # Half the spare time: the searched layout is then weighted and scored like a chain start, and the model built.
    after = budget.estimate("chain") + budget.estimate("score") + budget.estimate("model")
    deadline = time.perf_counter() + 0.5 * budget.spare(search.layer, after, *search.work)
    phy2log, _ = ring_search(search.counts_TE, search.starts[start][0], cluster.num_gpus, cluster.slots_per_gpu,
                             search.speed_G, (config.seed, search.layer), deadline)
    search.starts["chain-search"] = search.weighted(phy2log)
    search.score("chain-search")
    search.search_seconds = budget.clock() - searched
    search.check_enough()


def _choose(search: _LayerSearch, status: str, objective: float | None, bound: float | None,
            seconds: float) -> LayerResult:
    """Step 4: the best scored candidate (the CP-SAT one under node awareness, the only one that keeps groups
    within their nodes)."""
    if search.config.groups is not None and "cpsat" not in search.starts:
        raise PlacementInfeasibleError(
            f"layer {search.layer}: no node-limited placement found within the time limit; raise the time limit"
        )
    chosen = search.best() if search.config.groups is None else "cpsat"
    phy2log, weights = search.starts[chosen]
    return LayerResult(np.asarray(phy2log), np.asarray(weights), chosen, status, search.fitted, objective, bound,
                       seconds, search.search_seconds, search.level, search.enough)


def _chain_orders(replicas_E: np.ndarray, num_gpus: int, config: CpSatConfig) -> list[tuple[str, int]]:
    """Ring orders of the chain starts, the one that level `one-chain` keeps first: a random order, which fits
    better than the interleaved one (figures: docs/placement.md, 'Chain layout'). None where an expert has more
    replicas than there are GPUs."""
    if replicas_E.max() > num_gpus:
        return []
    randoms = [("random", config.seed * 1000 + i) for i in range(config.layout_seeds)]
    return randoms[:1] + [("interleave", 0)] + randoms[1:]


def _add_starts(search: _LayerSearch, orders: list[tuple[str, int]]) -> None:
    """Step 1 for the ring `orders`: adds their chain layouts to the starts, then scores every start not yet
    scored (the greedy under static routing only: see `_score_starts`), measuring both for the budget."""
    cluster, budget = search.cluster, search.budget
    began = budget.clock()
    for order, seed in orders:
        chain = chain_layout(search.mean_E, search.replicas_E, cluster.num_gpus, cluster.slots_per_gpu, order, seed,
                             search.counts_TE)
        search.starts[f"chain-{order}" if order != "random" else f"chain-random{seed}"] = search.weighted(chain)
    if orders:
        budget.observe("chain", (budget.clock() - began) / len(orders))
    began = budget.clock()
    new = [name for name in search.starts
           if name not in search.fitted and (name != "deepseek" or search.config.routing == "static")]
    for name in new:
        search.score(name)
    if new:
        budget.observe("score", (budget.clock() - began) / len(new))


def _cpsat_phase(search: _LayerSearch) -> tuple[str, float | None, float | None, float]:
    """Steps 3-4 of a full layer: solve its CP-SAT model in the spare time, hinted with the best candidate, and add
    the solution to the starts, scored. Returns the status, objective, bound and seconds of the solve."""
    config, budget, cluster = search.config, search.budget, search.cluster
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    best_start = search.best()
    began = budget.clock()
    near = {name: search.starts[name] for name in {best_start, "deepseek", "current"} if name in search.starts}
    problem = _layer_problem(search, near)
    lm = build_layer_model(problem)
    split = None
    if config.routing == "dynamic":
        split = router_split_BEG(problem.counts_BE, *search.starts[best_start], num_gpus, slots)
    add_placement_hint(lm, problem, *search.starts[best_start], split)
    solver = cp_model.CpSolver()
    # After the solve, the solution is weighted and scored like a chain start.
    after = budget.estimate("chain") + budget.estimate("score")
    solver.parameters.max_time_in_seconds = max(MIN_SOLVE_S, budget.spare(search.layer, after, *search.work))
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = config.seed
    solving = budget.clock()
    code = solver.solve(lm.model)
    solved = budget.clock() - solving
    status, objective, bound = STATUS_NAMES.get(code, str(code)), None, None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        objective, bound = _add_solution(search, solver, lm, problem)
    elif code == cp_model.INFEASIBLE and (config.groups is not None):
        raise PlacementInfeasibleError(
            f"layer {search.layer}: no placement keeps every group of {len(search.mean_E) // config.groups} experts "
            f"within {config.nodes_per_group} node(s); raise nodes_per_group"
        )
    budget.observe("model", budget.clock() - began - solved)
    return status, objective, bound, solver.wall_time


def _add_solution(search: _LayerSearch, solver: cp_model.CpSolver, lm, problem: LayerProblem) -> tuple[float, float]:
    """Adds the solved placement to the starts as "cpsat", scored, and returns the solve's objective and bound as
    mean imbalance over the sampled steps."""
    config, num_gpus, slots = search.config, search.cluster.num_gpus, search.cluster.slots_per_gpu
    scale = problem.counts_BE.sum(axis=1).mean() / num_gpus * len(problem.counts_BE)
    phy2log = solved_placement(solver, lm, num_gpus)
    if config.routing == "static":
        search.starts["cpsat"] = (phy2log, solved_weights(solver, lm, phy2log, slots, config.weight_scale))
        scale *= config.weight_scale
    else:
        search.starts["cpsat"] = search.weighted(phy2log)
    search.score("cpsat")
    return solver.objective_value / scale, solver.best_objective_bound / scale


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


def _layer_problem(search: _LayerSearch, starts: dict) -> LayerProblem:
    """The CP-SAT problem of the layer: B sampled steps, each expert allowed on the GPUs where `starts` put it, on
    `extra_candidates` random others and, under node awareness, on every GPU of its group's nodes."""
    config, cluster = search.config, search.cluster
    num_steps, num_experts = search.counts_TE.shape
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    rng = np.random.default_rng([config.seed, search.layer])
    # Sampled steps: evenly spread over the window.
    chosen_steps = np.unique(np.linspace(0, num_steps - 1, min(config.sampled_steps, num_steps)).round().astype(int))
    allowed_EG = np.zeros((num_experts, num_gpus), dtype=bool)
    gpu_of_slot = np.arange(cluster.num_slots) // slots
    for phy2log, _ in starts.values():
        allowed_EG[phy2log, gpu_of_slot] = True
    if config.extra_candidates:
        extra = rng.integers(0, num_gpus, size=(num_experts, config.extra_candidates))
        allowed_EG[np.arange(num_experts)[:, None], extra] = True
    current_EG = None
    move_cost = 0
    if search.current is not None:
        current_EG = np.zeros((num_experts, num_gpus), dtype=bool)
        current_EG[search.current.phy2log_LP[search.layer], gpu_of_slot] = True
        move_cost = int(round(config.migration_cost * search.mean_E.sum() / num_gpus * len(chosen_steps)))
    group_of_E = node_of_G = None
    if config.groups is not None:
        group_of_E, node_of_G = _allow_group_nodes(allowed_EG, search.mean_E, cluster, config)
    return LayerProblem(
        counts_BE=search.counts_TE[chosen_steps].astype(np.int64),
        candidates=[np.flatnonzero(row) for row in allowed_EG],
        num_gpus=num_gpus,
        slots_per_gpu=slots,
        routing=config.routing,
        speed_G=np.round(search.speed_G * SPEED_SCALE).astype(np.int64),
        weight_scale=config.weight_scale,
        current_EG=current_EG,
        move_cost=move_cost,
        group_of_E=group_of_E,
        node_of_G=node_of_G,
        nodes_per_group=config.nodes_per_group,
    )


def _allow_group_nodes(allowed_EG: np.ndarray, mean_E: np.ndarray, cluster: ClusterSpec,
                       config: CpSatConfig) -> tuple[np.ndarray, np.ndarray]:
    """Node awareness: allows, in place in `allowed_EG` [E, G], every expert on all GPUs of `nodes_per_group`
    nodes of its group, heaviest groups first on consecutive nodes round the cluster, so each node serves about
    the same number of groups. Returns group_of_E [E] and node_of_G [G]."""
    num_experts, num_gpus = allowed_EG.shape
    if num_experts % config.groups:
        raise PlacementInfeasibleError(f"groups={config.groups} does not divide the {num_experts} experts")
    if config.nodes_per_group > cluster.num_nodes:
        raise PlacementInfeasibleError(
            f"nodes_per_group={config.nodes_per_group} exceeds the cluster's {cluster.num_nodes} node(s)"
        )
    group_of_E = np.arange(num_experts) // (num_experts // config.groups)
    node_of_G = np.arange(num_gpus) // cluster.node_size
    group_load = np.bincount(group_of_E, mean_E, minlength=config.groups)
    for rank, group in enumerate(np.argsort(-group_load, kind="stable")):
        nodes = [(rank * config.nodes_per_group + i) % cluster.num_nodes for i in range(config.nodes_per_group)]
        allowed_EG[np.ix_(group_of_E == group, np.isin(node_of_G, nodes))] = True
    return group_of_E, node_of_G
