"""The wall-clock budget of a `cpsat` fit: which level of work each layer can afford, from measured costs.

Only for callers that ask for it (`CpSatConfig.time_limit_s`: a caller that solves once and hands the result to
every rank); by default a fit spends the deterministic `work_budget.WorkBudget` instead, whose result does not depend
on the clock. Both answer the same questions of `cpsat_layer` (its level, the spare budget of its searches, the
limits of the ring search, the swap search and CP-SAT), this one in seconds.

A fit shares one deadline among its layers, solved `workers` at a time. Each layer's fixed work (chain starts,
scoring candidates on the window, the CP-SAT model around its solve) is measured as layers run, and slows down
when other processes share the cores; a layer takes the best of `LEVELS` at which it and the layers not yet started
fit the time left (`plan_level`), and the searches (ring search, CP-SAT) get what is left over.
"""

import threading
import time
from collections import deque

from ortools.sat.python import cp_model

# What one layer does, best first. A layer takes a later level when the time left cannot absorb the remaining
# layers' measured work at a better one (`plan_level`):
#   full       every chain start scored (and the greedy: see `cpsat_layer._score_starts`); the ring search and
#              CP-SAT in the spare time;
#   starts     every chain start scored (no search, no CP-SAT);
#   one-chain  the first chain start (`cpsat_layer._chain_orders`) scored;
#   greedy     the greedy as it is, unscored: free, and what the result must never be worse than.
LEVELS = ("full", "starts", "one-chain", "greedy")
MIN_SOLVE_S = 0.05  # CP-SAT runs only with at least this long
# Before any layer has built a CP-SAT model, its cost (model, hint, reading back and scoring the solution) in units
# of scoring one candidate: a round value within the range seen on the synthetic full shape (figures:
# docs/benchmarks.md, 'The cpsat budget under load').
MODEL_PRIOR = 10.0
# Candidate evaluations of the swap search (`swap_search`) per second of its budget: about what one core of the
# machine this was measured on does (5-10e7 at 32-144 GPUs), so a second of budget is about a second of search.
SWAP_EVALUATIONS_PER_SECOND = 5e7


def plan_level(capacity_s: float, layers: int, costs: list[float], first: list[float] | None = None) -> int:
    """The best level (index into LEVELS) at which `layers` layers fit into `capacity_s` thread-seconds.

    costs[i] is the fixed work of one layer at level i, in seconds, non-increasing in i; first[i], if given, the
    work still to do at level i of the first layer, already begun. The last level if none fits. Asked again as each
    layer starts, with the time then left, the levels of the layers still to come step down in order as the time
    runs short, and back up when earlier layers left time over. E.g. 10 layers, 10 s on one thread, costs
    [2, 1.5, 0.5, 0]: layers 1-5 take level 2 (15 s > 10 s at level 1), then 7.5 s is left for 5 layers, and
    layers 6-10 take level 1.
    """
    for level, cost in enumerate(costs):
        if (cost if first is None else first[level]) + (layers - 1) * cost <= capacity_s:
            return level
    return len(costs) - 1


class FitBudget:
    """Shares one wall-clock deadline among layers solved `workers` at a time, from their measured work.

    Each layer's fixed work is measured in wall seconds as it runs: one chain start built and weighted (`chain`),
    one candidate scored on the window (`score`), and the CP-SAT model around its solve (`model`: model and hint
    built, solution read back, weighted and scored). When other processes share the cores all of it slows down,
    and the estimates, means of the last 4 * workers measurements, follow. The thread-seconds left are the time
    left on each worker less the planned work still to come of the layers running on the others. `clock` is
    injectable for tests.
    """

    def __init__(self, deadline: float, num_layers: int, workers: int, clock=time.perf_counter) -> None:
        self.deadline = deadline
        self.clock = clock
        self._workers = workers
        self._unstarted = num_layers
        self._greedy = 0  # layers at the greedy, waiting to be solved again
        self._running: dict[int, tuple[float, float]] = {}  # layer -> (start time, planned seconds)
        self._seen = {phase: deque(maxlen=4 * workers) for phase in ("chain", "score", "model")}
        self._lock = threading.Lock()

    def observe(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._seen[phase].append(seconds)

    def estimate(self, phase: str) -> float:
        with self._lock:
            seen = list(self._seen[phase])
        if seen:
            return sum(seen) / len(seen)
        return MODEL_PRIOR * self.estimate("score") if phase == "model" else 0.0

    def costs(self, num_chains: int, num_others: int) -> list[float]:
        """Fixed seconds of one layer at each of LEVELS, with `num_chains` chain starts and `num_others` other
        candidates (the greedy, the current placement) to score; `full` counts the shortest solve."""
        chain, score = self.estimate("chain"), self.estimate("score")
        starts = num_chains * (chain + score) + num_others * score
        one_chain = min(num_chains, 1) * (chain + score) + num_others * score
        return [starts + self.estimate("model") + MIN_SOLVE_S, starts, one_chain, 0.0]

    def start_layer(self, layer: int, num_chains: int, num_others: int, best: str = "full") -> str:
        """Claims `layer`, the next one, and returns its level, no better than `best`. The layers left at the
        greedy are owed a chain start, solved again at the end if the cores free up (`reopen`, best="one-chain"):
        that gains far more than further chain starts (figures: docs/benchmarks.md, 'The cpsat budget under
        load'), so no layer takes more than one chain start unless their work fits as well. `finish_layer` must
        follow."""
        costs = self.costs(num_chains, num_others)
        one_chain = LEVELS.index("one-chain")
        with self._lock:
            self._unstarted -= 1
            level = plan_level(self._capacity(layer, costs), self._unstarted + 1, costs)
            if level >= one_chain:  # the work owed does not push this layer below a chain start
                level = max(one_chain, plan_level(self._capacity(layer, costs, owed=False), self._unstarted + 1,
                                                  costs))
            level = max(level, LEVELS.index(best))
            self._greedy += (level == LEVELS.index("greedy")) - (best != "full")
            self._running[layer] = (self.clock(), costs[level])
        return LEVELS[level]

    def reopen(self, num_layers: int) -> None:
        """`num_layers` layers left at the greedy are to be solved again."""
        with self._lock:
            self._unstarted += num_layers

    def resume(self, layer: int, level: str, floor: str, rest: list[float], num_chains: int,
               num_others: int) -> str:
        """The level at which a layer begun at `level` goes on, between `level` and `floor` (what its work so far
        already gives it): rest[i] is its work still to do at level i, the layers not yet started count at level i."""
        costs = self.costs(num_chains, num_others)
        with self._lock:
            best = plan_level(self._capacity(layer, costs), self._unstarted + 1, costs, first=rest)
            best = min(max(best, LEVELS.index(level)), LEVELS.index(floor))
            self._running[layer] = (self.clock(), rest[best])
        return LEVELS[best]

    def finish_layer(self, layer: int) -> None:
        with self._lock:
            self._running.pop(layer, None)

    def charge(self, layer: int, amount: float) -> None:
        """Work done by `layer` (seconds of the model): nothing to count, the clock runs by itself."""

    def ring_limits(self, amount: float) -> tuple[float | None, int]:
        """(deadline, most rounds) of a ring search given `amount` seconds."""
        return time.perf_counter() + amount, 10**9

    def swap_evaluations(self, amount: float) -> float:
        """The swap search's candidate evaluations for `amount` seconds."""
        return amount * SWAP_EVALUATIONS_PER_SECOND

    def limit_solver(self, solver: cp_model.CpSolver, amount: float) -> None:
        """Gives CP-SAT `amount` seconds (at least MIN_SOLVE_S) of wall clock."""
        solver.parameters.max_time_in_seconds = max(MIN_SOLVE_S, amount)

    def summary(self) -> dict:
        return {"budget": "wall clock", "costs_s": {phase: round(self.estimate(phase), 4)
                                                    for phase in ("chain", "score", "model")}}

    def spare(self, layer: int, still_to_do: float, num_chains: int, num_others: int) -> float:
        """Seconds a full layer may search, besides `still_to_do` seconds of its fixed work: its share of the time
        left over if every layer not yet started runs at full, and no more than its own thread has."""
        costs = self.costs(num_chains, num_others)
        with self._lock:
            later = self._unstarted
            shared = (self._capacity(layer, costs) - still_to_do - later * (costs[0] - MIN_SOLVE_S)) / (later + 1)
        return max(0.0, min(shared, self.deadline - self.clock() - still_to_do))

    def _capacity(self, layer: int, costs: list[float], owed: bool = True) -> float:
        """Thread-seconds left for `layer` and the layers not yet started, less, if `owed`, the chain starts owed
        to the layers at the greedy (call with the lock held)."""
        now = self.clock()
        left = self.deadline - now
        committed = sum(max(0.0, planned - (now - began)) for other, (began, planned) in self._running.items()
                        if other != layer)
        owed_s = self._greedy * costs[LEVELS.index("one-chain")] if owed else 0.0
        return min(left * self._workers - committed, left * (self._unstarted + 1)) - owed_s
