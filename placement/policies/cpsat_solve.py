"""Steps 3-4 of a full `cpsat` layer: its CP-SAT model built around the best candidates, solved, read back.

Legend: T window steps, E logical experts, G GPUs, S slots per GPU, P = G * S slots, B sampled steps.

The model (`cpsat_model`) covers B steps sampled evenly from the window; each expert may use the GPUs where the
best candidate, the greedy and the current placement put it, plus `extra_candidates` random others (under node
limits, every GPU of the nodes its group may use). The best candidate is its hint, so the solve starts from it, and
the solution is added to the candidates and scored like them: the layer keeps whichever fits the window best.
The solve's limit comes from the fit's budget (deterministic time by default, `work_budget`).
"""

import numpy as np
from ortools.sat.python import cp_model

from placement.policies.cpsat_model import (
    SPEED_SCALE,
    LayerProblem,
    add_placement_hint,
    build_layer_model,
    solved_placement,
    solved_weights,
)
from placement.policies.node_limits import NodeLimits
from placement.routing.dynamic_split import ROUTER_ROUNDS, ReplicaGraph, optimal_split

STATUS_NAMES = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
                cp_model.MODEL_INVALID: "invalid", cp_model.UNKNOWN: "unknown"}


def cpsat_phase(search) -> tuple[str, float | None, float | None, float]:
    """Builds and solves the layer's model in the spare budget, hinted with the best candidate, and adds the
    solution to `search`'s candidates, scored. Returns the status, objective, bound and wall seconds of the solve.

    `search` is the layer's `cpsat_layer._LayerSearch`."""
    config, budget, cluster = search.config, search.budget, search.cluster
    num_gpus, slots = cluster.num_gpus, cluster.slots_per_gpu
    search.stop.check()
    best_start = search.best()
    began = budget.clock()
    near = {name: search.starts[name] for name in (best_start, "deepseek", "current") if name in search.starts}
    problem = layer_problem(search, near)
    lm = build_layer_model(problem)
    split = None
    if problem.routing == "dynamic":
        split = router_split_BEG(problem.counts_BE, *search.starts[best_start], num_gpus, slots)
    add_placement_hint(lm, problem, *search.starts[best_start], split)
    budget.charge(search.layer, budget.estimate("model"))
    solver = cp_model.CpSolver()
    # After the solve, the solution is weighted and scored like a chain start.
    after = budget.estimate("chain") + budget.estimate("score")
    budget.limit_solver(solver, budget.spare(search.layer, after, *search.work))
    solver.parameters.num_workers = 1
    # CP-SAT would otherwise install its own SIGINT handler for the solve and leave SIGINT at the default action after
    # it: a Ctrl-C then kills the process on the spot, past every cleanup (temporary files, child processes).
    solver.parameters.catch_sigint_signal = False
    solver.parameters.random_seed = config.seed
    solving = budget.clock()
    with search.stop.solving(solver):  # a stopped fit ends the solve at once, and the layer with it
        code = solver.solve(lm.model)
    solved = budget.clock() - solving
    budget.charge(search.layer, solver.deterministic_time)
    status, objective, bound = STATUS_NAMES.get(code, str(code)), None, None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        objective, bound = _add_solution(search, solver, lm, problem)
    budget.observe("model", budget.clock() - began - solved)
    return status, objective, bound, solver.wall_time


def router_split_BEG(counts_BE: np.ndarray, phy2log_P, weights_P, num_gpus: int, slots: int) -> np.ndarray:
    """[B, E, G] tokens of each expert on each GPU under the dynamic router (fractional): the hint's split."""
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


def _add_solution(search, solver: cp_model.CpSolver, lm, problem: LayerProblem) -> tuple[float, float]:
    """Adds the solved placement to the starts as "cpsat", scored, and returns the solve's objective and bound as
    mean imbalance over the sampled steps."""
    config, num_gpus, slots = search.config, search.cluster.num_gpus, search.cluster.slots_per_gpu
    scale = problem.counts_BE.sum(axis=1).mean() / num_gpus * len(problem.counts_BE)
    phy2log = solved_placement(solver, lm, num_gpus)
    if config.routing == "static":
        search.starts["cpsat"] = (phy2log, solved_weights(solver, lm, phy2log, slots, config.weight_scale))
    else:
        search.starts["cpsat"] = search.weighted(phy2log)
    if problem.routing == "static":
        scale *= config.weight_scale
    search.score("cpsat")
    search.budget.charge(search.layer, search.budget.estimate("chain") + search.budget.estimate("score"))
    return solver.objective_value / scale, solver.best_objective_bound / scale


def layer_problem(search, starts: dict) -> LayerProblem:
    """The CP-SAT problem of the layer: B sampled steps, each expert allowed on the GPUs where `starts` put it, on
    `extra_candidates` random others and, under node limits, on every GPU of the nodes its group may use."""
    config, cluster, limits = search.config, search.cluster, search.limits
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
    if limits is not None:
        _allow_group_nodes(allowed_EG, limits, search.starts["deepseek"][0], cluster.num_nodes, slots)
    return LayerProblem(
        counts_BE=search.counts_TE[chosen_steps].astype(np.int64),
        candidates=[np.flatnonzero(row) for row in allowed_EG],
        num_gpus=num_gpus,
        slots_per_gpu=slots,
        routing="dynamic" if config.routing == "dynamic" else "static",
        speed_G=np.round(search.speed_G * SPEED_SCALE).astype(np.int64),
        weight_scale=config.weight_scale,
        current_EG=current_EG,
        move_cost=move_cost,
        group_of_E=None if limits is None else limits.group_of_E,
        node_of_G=None if limits is None else limits.node_of_G,
        nodes_per_group=None if limits is None else limits.nodes_per_group,
    )


def _allow_group_nodes(allowed_EG: np.ndarray, limits: NodeLimits, greedy_P: np.ndarray, num_nodes: int,
                       slots_per_gpu: int) -> None:
    """Node limits, in place in `allowed_EG` [E, G]: an expert only on the nodes its group may use, its home node
    (the hierarchical greedy's, `greedy_P` [P]) and the next `nodes_per_group - 1` round the cluster, and there on
    every GPU."""
    home_Q = limits.home_nodes(greedy_P, slots_per_gpu)
    nodes_QK = (home_Q[:, None] + np.arange(limits.nodes_per_group)[None]) % num_nodes
    allowed_EG[:] = (nodes_QK[limits.group_of_E][:, :, None] == limits.node_of_G[None, None]).any(axis=1)
