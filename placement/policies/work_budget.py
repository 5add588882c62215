"""The deterministic budget of a `cpsat` fit, the default: each layer's work from counted, never timed, costs.

Why: some engines compute a placement on every rank, independently, and broadcast nothing (`eplb/engines/`); ranks whose
maps differ load different experts into the same slots. A budget read from the clock gives different placements in
different processes (a layer's level, where a search stops, CP-SAT's time limit all move with the machine's load).
Here every decision comes from counted work: the fixed phases (a chain start, scoring a candidate, building the
CP-SAT model) charge a cost modelled from the layer's shape, the ring search its rounds, the swap search its
candidate evaluations, CP-SAT its deterministic time. A unit is about a second of one core of the machine the model
was measured on (`scripts/bench_work_budget.py` gives the seconds a unit takes); a faster or busier machine takes less
or more time for the same work and returns the same placement.

Each layer gets an equal share of `CpSatConfig.work_limit`, whatever the other layers do (no budget passes from
layer to layer, so the order in which threads take layers changes nothing): it takes the best of `LEVELS` whose
modelled fixed work fits its share (`plan_level` for one layer) and its searches get what is left.
"""

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from placement.policies.cpsat_budget import LEVELS, MIN_SOLVE_S, plan_level

# Modelled costs, in units, measured on this project's 2-core machine (figures: docs/placement.md, 'Budget'):
CHAIN_UNITS = 6e-3  # one chain layout with its fitted weights
SCORE_UNITS = {"dynamic": (1e-3, 6e-7), "static": (5e-5, 5e-8), "equal": (5e-5, 5e-8)}  # fixed + per step x slot
MODEL_UNITS_PER_VARIABLE = 2.5e-5  # the CP-SAT model, per sampled step and (expert, GPU) candidate
RING_ROUND_UNITS = 1e-2  # one round of the ring search (`ring_search.BATCH_ELEMENTS` swap-step scores)
SWAP_EVALUATIONS_PER_UNIT = 5e7  # candidate-step evaluations of the swap search
DETERMINISTIC_TIME_PER_UNIT = 0.6  # CP-SAT's deterministic time a unit buys (one of CP-SAT's took 1.4-3.4 s here)


@dataclass(frozen=True)
class LayerShape:
    """What the modelled costs depend on: T window steps, P slots, G GPUs, E experts, the routing, B sampled steps
    and the candidate GPUs per expert of the CP-SAT model."""

    steps: int
    slots: int
    gpus: int
    experts: int
    routing: str
    sampled_steps: int
    candidates_per_expert: int


class WorkBudget:
    """Equal, independent shares of `work_limit` units, one per layer (see the module docstring)."""

    def __init__(self, work_limit: float, num_layers: int, shape: LayerShape) -> None:
        self.work_limit = work_limit
        self.share = work_limit / max(1, num_layers)
        self.shape = shape
        self._spent: dict[int, float] = {}  # layer -> units; each layer is one thread's at a time
        self.clock = time.perf_counter  # measures phases for the fit's info only; decides nothing

    def estimate(self, phase: str) -> float:
        """Modelled units of one `phase`: "chain", "score" (one candidate on the window) or "model"."""
        shape = self.shape
        if phase == "chain":
            return CHAIN_UNITS
        if phase == "score":
            fixed, per = SCORE_UNITS[shape.routing]
            return fixed + per * shape.steps * (shape.slots + shape.gpus)
        if phase == "model":
            return MODEL_UNITS_PER_VARIABLE * shape.sampled_steps * shape.experts * shape.candidates_per_expert
        raise ValueError(f"unknown phase {phase!r}")

    def costs(self, num_chains: int, num_others: int) -> list[float]:
        """Fixed units of one layer at each of LEVELS (as `FitBudget.costs`)."""
        chain, score = self.estimate("chain"), self.estimate("score")
        starts = num_chains * (chain + score) + num_others * score
        one_chain = min(num_chains, 1) * (chain + score) + num_others * score
        return [starts + self.estimate("model") + MIN_SOLVE_S, starts, one_chain, 0.0]

    def start_layer(self, layer: int, num_chains: int, num_others: int, best: str = "full") -> str:
        """The level of `layer`: the best whose fixed work fits its share, no better than `best`."""
        self._spent[layer] = 0.0
        level = plan_level(self.share, 1, self.costs(num_chains, num_others))
        return LEVELS[max(level, LEVELS.index(best))]

    def resume(self, layer: int, level: str, floor: str, rest: list[float], num_chains: int,
               num_others: int) -> str:
        """The level at which a layer begun at `level` goes on, between `level` and `floor`, given its share less
        what it spent: rest[i] is its work still to do at level i."""
        best = plan_level(self.share - self._spent[layer], 1, self.costs(num_chains, num_others), first=rest)
        return LEVELS[min(max(best, LEVELS.index(level)), LEVELS.index(floor))]

    def charge(self, layer: int, amount: float) -> None:
        """`amount` units of work done by `layer`."""
        self._spent[layer] = self._spent.get(layer, 0.0) + amount

    def spare(self, layer: int, still_to_do: float, num_chains: int, num_others: int) -> float:
        """Units a layer may search, besides `still_to_do` units of its fixed work."""
        return max(0.0, self.share - self._spent.get(layer, 0.0) - still_to_do)

    def ring_limits(self, amount: float) -> tuple[float | None, int]:
        """(no deadline, the rounds `amount` units pay for) of a ring search."""
        return None, int(amount / RING_ROUND_UNITS)

    def swap_evaluations(self, amount: float) -> float:
        """The swap search's candidate evaluations for `amount` units."""
        return amount * SWAP_EVALUATIONS_PER_UNIT

    def limit_solver(self, solver: cp_model.CpSolver, amount: float) -> None:
        """Gives CP-SAT `amount` units (at least MIN_SOLVE_S) of deterministic time, and no wall-clock limit."""
        solver.parameters.max_deterministic_time = max(MIN_SOLVE_S, amount) * DETERMINISTIC_TIME_PER_UNIT

    def observe(self, phase: str, seconds: float) -> None:
        """Measured seconds decide nothing here."""

    def finish_layer(self, layer: int) -> None:
        """Nothing to release: the layer's share was its own."""

    def reopen(self, num_layers: int) -> None:
        """No layer is left at the greedy for want of time: nothing to reopen."""

    def summary(self) -> dict:
        return {"budget": "work", "work_limit": self.work_limit, "share_per_layer": round(self.share, 6),
                "costs_units": {phase: round(self.estimate(phase), 6) for phase in ("chain", "score", "model")}}
