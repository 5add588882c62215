"""The CP-SAT model of one layer's placement, built apart from its solving so tests can inspect it.

Legend: B sampled steps, E logical experts, G GPUs, S slots per GPU; `candidates[e]` are the GPUs expert e may use.

Decisions (all jointly): which GPUs hold a replica of each expert (so the replica count), and how each expert's
tokens are split over its replicas: per sampled step under dynamic routing (the router re-splits every step),
or one fixed share under static routing. Objective: the sum over sampled steps of the busiest GPU's load
(each GPU's load divided by its speed), plus an optional cost per expert copied in from elsewhere.
Loads are token counts (integers, no scaling); static shares are integers out of `weight_scale`.
"""

from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

SPEED_SCALE = 100  # GPU speeds are integers out of this many parts


@dataclass(frozen=True)
class LayerProblem:
    """The data of one layer's model.

    Attributes:
        counts_BE: [B, E] int, tokens per expert in each sampled step.
        candidates: per expert, the sorted GPU ids that may hold one of its replicas.
        num_gpus: G.
        slots_per_gpu: S.
        routing: "dynamic" or "static".
        speed_G: [G] int, relative GPU speed out of SPEED_SCALE.
        weight_scale: static shares are integers out of this many parts.
        current_EG: [E, G] bool, replicas of the placement now serving (for the migration cost), or None.
        move_cost: objective units (tokens) per replica placed where the current placement has none.
        group_of_E: [E] int, the expert group of each expert, or None (no node awareness).
        node_of_G: [G] int, the node of each GPU.
        nodes_per_group: most nodes one group's replicas may span.
    """

    counts_BE: np.ndarray
    candidates: list[np.ndarray]
    num_gpus: int
    slots_per_gpu: int
    routing: str = "dynamic"
    speed_G: np.ndarray | None = None
    weight_scale: int = 1000
    current_EG: np.ndarray | None = None
    move_cost: int = 0
    group_of_E: np.ndarray | None = None
    node_of_G: np.ndarray | None = None
    nodes_per_group: int | None = None

    @property
    def speeds(self) -> np.ndarray:
        return np.full(self.num_gpus, SPEED_SCALE) if self.speed_G is None else self.speed_G


@dataclass
class LayerModel:
    """A built model and handles to its variables.

    Attributes:
        model: the CP-SAT model.
        holds: (e, g) -> BoolVar, 1 iff expert e has a replica on GPU g.
        tokens: (b, e, g) -> IntVar, tokens of expert e on GPU g in sampled step b (dynamic routing).
        shares: (e, g) -> IntVar, parts of expert e's tokens on GPU g out of weight_scale (static routing).
        peaks: [B] IntVar, the busiest GPU's load in each sampled step (speed-scaled under static routing).
    """

    model: cp_model.CpModel
    holds: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    tokens: dict[tuple[int, int, int], cp_model.IntVar] = field(default_factory=dict)
    shares: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    peaks: list[cp_model.IntVar] = field(default_factory=list)


def build_layer_model(problem: LayerProblem) -> LayerModel:
    """Build the CP-SAT model of `problem` (no solving)."""
    counts, speeds = problem.counts_BE, problem.speeds
    num_steps, num_experts = counts.shape
    lm = LayerModel(cp_model.CpModel())
    m = lm.model
    gpu_terms: list[list[tuple[int, int]]] = [[] for _ in range(problem.num_gpus)]  # (expert, gpu) pairs per GPU

    # holds[e, g] == 1 iff expert e has a replica on GPU g (at most one per GPU: no duplicate replicas).
    for expert, gpus in enumerate(problem.candidates):
        for gpu in gpus:
            lm.holds[expert, int(gpu)] = m.new_bool_var(f"holds_e{expert}_g{gpu}")
            gpu_terms[int(gpu)].append((expert, int(gpu)))
    # Every expert has at least one replica.
    for expert, gpus in enumerate(problem.candidates):
        m.add(sum(lm.holds[expert, int(g)] for g in gpus) >= 1)
    # Every GPU fills exactly S slots.
    for gpu in range(problem.num_gpus):
        m.add(sum(lm.holds[pair] for pair in gpu_terms[gpu]) == problem.slots_per_gpu)

    # peaks[b] >= load of every GPU in sampled step b, times SPEED_SCALE, divided by its speed (static loads are
    # also in parts of weight_scale).
    totals = counts.sum(axis=1) * (problem.weight_scale if problem.routing == "static" else 1)
    for step in range(num_steps):
        high = -(-SPEED_SCALE * int(totals[step]) // int(speeds.min()))
        lm.peaks.append(m.new_int_var(0, max(1, high), f"peak_k{step}"))

    if problem.routing == "dynamic":
        _add_dynamic_split(problem, lm, gpu_terms, speeds)
    else:
        _add_static_split(problem, lm, gpu_terms, speeds)
    if problem.group_of_E is not None:
        _add_node_limit(problem, lm)

    objective = sum(lm.peaks)
    if problem.current_EG is not None and problem.move_cost > 0:
        new_replicas = [var for (e, g), var in lm.holds.items() if not problem.current_EG[e, g]]
        objective += problem.move_cost * sum(new_replicas)
    m.minimize(objective)
    return lm


def _add_dynamic_split(problem: LayerProblem, lm: LayerModel, gpu_terms, speeds) -> None:
    m, counts = lm.model, problem.counts_BE
    for step in range(counts.shape[0]):
        loads: list[list] = [[] for _ in range(problem.num_gpus)]
        for expert, gpus in enumerate(problem.candidates):
            tokens = int(counts[step, expert])
            if tokens == 0:
                continue
            # tokens[b, e, g]: expert e's tokens on GPU g in step b; only on GPUs holding a replica; all placed.
            parts = []
            for gpu in gpus:
                var = m.new_int_var(0, tokens, f"tokens_k{step}_e{expert}_g{gpu}")
                m.add(var <= tokens * lm.holds[expert, int(gpu)])
                lm.tokens[step, expert, int(gpu)] = var
                parts.append(var)
                loads[int(gpu)].append(var)
            m.add(sum(parts) == tokens)
        for gpu in range(problem.num_gpus):
            if loads[gpu]:
                m.add(SPEED_SCALE * sum(loads[gpu]) <= int(speeds[gpu]) * lm.peaks[step])


def _add_static_split(problem: LayerProblem, lm: LayerModel, gpu_terms, speeds) -> None:
    m, counts, scale = lm.model, problem.counts_BE, problem.weight_scale
    # shares[e, g]: parts of expert e's tokens GPU g takes, out of `scale`, the same in every step.
    for expert, gpus in enumerate(problem.candidates):
        parts = []
        for gpu in gpus:
            var = m.new_int_var(0, scale, f"share_e{expert}_g{gpu}")
            m.add(var <= scale * lm.holds[expert, int(gpu)])
            lm.shares[expert, int(gpu)] = var
            parts.append(var)
        m.add(sum(parts) == scale)
    for step in range(counts.shape[0]):
        for gpu in range(problem.num_gpus):
            terms = [int(counts[step, e]) * lm.shares[e, g] for e, g in gpu_terms[gpu] if counts[step, e] > 0]
            if terms:
                m.add(SPEED_SCALE * sum(terms) <= int(speeds[gpu]) * lm.peaks[step])


def _add_node_limit(problem: LayerProblem, lm: LayerModel) -> None:
    m = lm.model
    num_groups = int(problem.group_of_E.max()) + 1
    num_nodes = int(problem.node_of_G.max()) + 1
    # uses[q, n] == 1 iff some replica of expert group q lives on node n; a group spans at most nodes_per_group.
    uses = {(q, n): m.new_bool_var(f"uses_q{q}_n{n}") for q in range(num_groups) for n in range(num_nodes)}
    for (expert, gpu), var in lm.holds.items():
        m.add_implication(var, uses[int(problem.group_of_E[expert]), int(problem.node_of_G[gpu])])
    for q in range(num_groups):
        m.add(sum(uses[q, n] for n in range(num_nodes)) <= problem.nodes_per_group)


def add_placement_hint(
    lm: LayerModel, problem: LayerProblem, phy2log_P: np.ndarray, weights_P: np.ndarray, split_BEG=None
) -> bool:
    """Hint the model with a complete solution: a placement, its whole-token split per sampled step (dynamic:
    `split_BEG` [B, E, G] tokens from the router, else the static weights) or its integer shares (static), and
    the resulting peaks.

    Returns False (and hints nothing) when the placement is outside the model: a duplicate replica on one GPU
    or a replica on a GPU that is not among the expert's candidates.
    """
    slots = problem.slots_per_gpu
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    pairs = set(zip(phy2log_P.tolist(), gpu_of_slot.tolist()))
    if len(pairs) != len(phy2log_P) or any(pair not in lm.holds for pair in pairs):
        return False
    for pair, var in lm.holds.items():
        lm.model.add_hint(var, pair in pairs)
    share_EG = np.zeros((len(problem.candidates), problem.num_gpus))
    share_EG[phy2log_P, gpu_of_slot] = weights_P
    counts, speeds = problem.counts_BE, problem.speeds
    if problem.routing == "static":
        parts_EG = whole_parts(share_EG * problem.weight_scale, np.full(len(share_EG), problem.weight_scale))
        for (expert, gpu), var in lm.shares.items():
            lm.model.add_hint(var, int(parts_EG[expert, gpu]))
        loads_BG = counts @ parts_EG
    else:
        loads_BG = np.zeros((len(counts), problem.num_gpus), dtype=np.int64)
        for step in range(len(counts)):
            wanted_EG = share_EG * counts[step][:, None] if split_BEG is None else split_BEG[step]
            tokens_EG = whole_parts(wanted_EG, counts[step])
            loads_BG[step] = tokens_EG.sum(axis=0)
            for expert, gpu in zip(*np.nonzero(counts[step][:, None] * np.ones_like(tokens_EG))):
                var = lm.tokens.get((step, int(expert), int(gpu)))
                if var is not None:
                    lm.model.add_hint(var, int(tokens_EG[expert, gpu]))
    peaks = np.ceil(SPEED_SCALE * loads_BG / speeds[None, :]).max(axis=1).astype(np.int64)
    for step, var in enumerate(lm.peaks):
        lm.model.add_hint(var, int(peaks[step]))
    return True


def whole_parts(share_EG: np.ndarray, totals_E: np.ndarray) -> np.ndarray:
    """[E, G] int: round each row of share_EG to whole parts summing to totals_E (largest remainders)."""
    floor = np.floor(share_EG).astype(np.int64)
    leftover = totals_E.astype(np.int64) - floor.sum(axis=1)
    remainder = np.where(share_EG > 0, share_EG - floor, -1.0)
    rank = np.argsort(np.argsort(-remainder, axis=1, kind="stable"), axis=1)
    return floor + (rank < leftover[:, None])


def model_size(lm: LayerModel) -> dict:
    """Variables and constraints of the model (for inspection and tests)."""
    proto = lm.model.proto
    return {"variables": len(proto.variables), "constraints": len(proto.constraints)}


def solved_placement(solver: cp_model.CpSolver, lm: LayerModel, num_gpus: int) -> np.ndarray:
    """[P] int64: the placement of a solved model, each GPU's experts in ascending order (slot p on GPU p // S)."""
    per_gpu: list[list[int]] = [[] for _ in range(num_gpus)]
    for (expert, gpu), var in sorted(lm.holds.items()):
        if solver.boolean_value(var):
            per_gpu[gpu].append(expert)
    return np.array([e for experts in per_gpu for e in experts], dtype=np.int64)


def solved_weights(solver: cp_model.CpSolver, lm: LayerModel, phy2log_P: np.ndarray, slots_per_gpu: int,
                   weight_scale: int) -> np.ndarray:
    """[P] float: the solved static share of each slot's expert on its GPU, out of 1 (static routing)."""
    gpu_of_slot = np.arange(len(phy2log_P)) // slots_per_gpu
    return np.array([solver.value(lm.shares[int(e), int(g)]) / weight_scale for e, g in zip(phy2log_P, gpu_of_slot)])
