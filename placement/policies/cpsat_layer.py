"""One layer of a `cpsat` fit: its candidates, scored on the window, at the level of work the budget allows.

Legend: T window steps, E logical experts, G GPUs, S slots per GPU, P = G * S slots, M experts with replicas on two
or more GPUs, Y the most GPUs one such expert spans.

`solve_layer` runs the phases of `placement.policies.cpsat_policy`'s steps for one layer, each a function here: the
starting placements (`_score_starts`), the swap search (`_swap_phase`), the ring search (`_ring_search_phase`), the
CP-SAT candidate (`cpsat_solve.cpsat_phase`) and the choice (`_choose`). A `_LayerSearch` carries the candidates and
the level between them; the budget (deterministic `WorkBudget` by default, or the wall-clock `FitBudget`) may lower
the level before the other chain starts and before CP-SAT, and gives each search its limit.
"""

from dataclasses import dataclass, field

import numpy as np

from placement.bounds import imbalance_lower_bound
from placement.cluster import ClusterSpec
from placement.placement_model import Placement
from placement.policies.chain_layout import chain_layout
from placement.policies.cpsat_budget import MIN_SOLVE_S
from placement.policies.cpsat_config import CpSatConfig
from placement.drift_swaps import ring_spans
from placement.policies.cpsat_solve import cpsat_phase
from placement.policies.fit_stop import FitStop
from placement.policies.node_limits import NodeLimits, node_chain_layout
from placement.policies.ring_search import ring_search, search_pays_off
from placement.policies.swap_search import swap_search
from placement.routing.dynamic_split import ROUTER_ROUNDS, ReplicaGraph, optimal_split
from placement.routing.static_weights import fitted_weights

# Share of a layer's spare budget the swap search may take (it stops sooner when no swap helps); the ring search
# takes half of what is left, CP-SAT the rest.
SWAP_SHARE = 0.25
# A candidate replaces the incumbent (`_choose`) only if it fits the window at least this much better (relative).
MARGIN = 1e-3
# A layer stops searching once a candidate fits within this (relative) of the window's lower bound: provably near
# the best any placement can do, nothing left to find.
BOUND_TOLERANCE = 1e-4
# At this many slots per GPU or fewer a GPU's load is a pair of experts, and only the greedy and the swap search from
# it are candidates (`swaps_only`): chain layouts and CP-SAT's fit choose pairs on the window's noise and bursts.
# There a swap is kept only if its gain exceeds PAIRING_SWAP_Z standard errors of its per-step gains, and the search
# runs on the whole window only if, run on the window's older steps, its layout beats the greedy on the newest
# PAIRING_HOLDOUT_SHARE of them, which took no part in it.
PAIRING_SLOTS = 2
PAIRING_SWAP_Z = 2.0
PAIRING_HOLDOUT_SHARE = 1 / 3


@dataclass(frozen=True)
class LayerResult:
    """The placement chosen for one layer and how it was found."""

    phy2log_P: np.ndarray
    weights_P: np.ndarray
    source: str  # "deepseek", "chain-...", "chain-search", "swap", "current" or "cpsat"
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
    """Mean over steps of max / mean GPU load (loads divided by speed) under the router that will run ("static" and
    "equal" both route by `weights_P`; "dynamic" re-splits each step)."""
    return float(step_imbalance_T(counts_TE, phy2log_P, weights_P, cluster, routing, speed_G).mean())


def step_imbalance_T(counts_TE: np.ndarray, phy2log_P, weights_P, cluster: ClusterSpec, routing: str,
                     speed_G: np.ndarray) -> np.ndarray:
    """[T] each step's max / mean GPU load under the router that will run (see `fitted_objective`)."""
    gpu_of_slot = np.arange(cluster.num_slots) // cluster.slots_per_gpu
    counts = counts_TE.astype(np.float64)
    if routing in ("static", "equal"):
        loads = np.zeros((len(counts), cluster.num_gpus))
        np.add.at(loads.T, gpu_of_slot, (counts[:, phy2log_P] * weights_P).T)
    else:
        graph = ReplicaGraph.build(phy2log_P, gpu_of_slot, counts.shape[1], cluster.num_gpus, weights_P)
        _, loads, _ = optimal_split(counts, graph, tolerance=1e-3, max_rounds=ROUTER_ROUNDS)
    mean = np.maximum(loads.mean(axis=1), 1e-12)
    return (loads / speed_G).max(axis=1) / mean


def equal_weights(phy2log_P: np.ndarray, num_experts: int) -> np.ndarray:
    """[P] each slot's equal share of its expert's tokens (1 / replicas)."""
    return 1.0 / np.bincount(phy2log_P, minlength=num_experts)[phy2log_P]


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
        limits: the node limits, or None.
        orders: ring orders of the chain starts (`_chain_orders`).
        level: one of LEVELS, the work the budget lets the layer do; it may step down between phases.
        starts: candidate name -> (phy2log_P [P] int64, weights_P [P] float).
        fitted: candidate name -> fitted objective (`fitted_objective`) of the candidates scored so far.
        steps: candidate name -> [T] its per-step imbalance on the window (`step_imbalance_T`).
        enough: a scored candidate is within `config.good_enough`, or within BOUND_TOLERANCE of `bound`: the phases
            still to come are skipped.
        bound: the window's lower bound on the fitted objective (`placement.bounds`; 0 with GPU speeds).
        greedy_floor: under dynamic routing, a lower bound on the greedy's fitted objective with its move penalty
            (`_fixed_load_bound`), or None.
        search_seconds: wall time inside the ring and swap searches.
        stop: the fit's stop flag, checked between steps (`fit_stop`; a stopped layer raises `FitStopped`).
    """

    layer: int
    counts_TE: np.ndarray
    mean_E: np.ndarray
    replicas_E: np.ndarray
    cluster: ClusterSpec
    config: CpSatConfig
    speed_G: np.ndarray
    current: Placement | None
    budget: object
    limits: NodeLimits | None
    orders: list[tuple[str, int]]
    level: str
    starts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    fitted: dict[str, float] = field(default_factory=dict)
    steps: dict[str, np.ndarray] = field(default_factory=dict)
    enough: bool = False
    bound: float = 0.0
    greedy_floor: float | None = None
    search_seconds: float = 0.0
    stop: FitStop = field(default_factory=FitStop)

    @property
    def work(self) -> tuple[int, int]:
        """Chain starts, and other candidates to score: the current placement, and the greedy unless dynamic
        routing may skip it."""
        return len(self.orders), (self.current is not None) + (self.config.routing != "dynamic")

    def weighted(self, phy2log_P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(phy2log_P, its weights): equal under equal routing, else fitted to the window's mean load."""
        if self.config.routing == "equal":
            return phy2log_P, equal_weights(phy2log_P, len(self.mean_E))
        return phy2log_P, fitted_weights(phy2log_P, self.mean_E, self.cluster.num_gpus, self.cluster.slots_per_gpu)

    def score(self, name: str) -> None:
        """Scores candidate `name` on the window under the router that will run."""
        self.stop.check()
        self.steps[name] = step_imbalance_T(self.counts_TE, *self.starts[name], self.cluster, self.config.routing,
                                            self.speed_G)
        self.fitted[name] = float(self.steps[name].mean())

    def beats(self, name: str, incumbent: str) -> bool:
        """Whether candidate `name` fits the window better than `incumbent` by more than the window's noise: by
        MARGIN (relative) at least, and on windows of several steps by more than two standard errors of the
        per-step differences."""
        gain = self.penalised(incumbent) - self.penalised(name)
        if gain <= MARGIN * self.penalised(incumbent):
            return False
        differences = self.steps[incumbent] - self.steps[name]
        if len(differences) < 2:
            return True
        return gain > 2.0 * differences.std(ddof=1) / np.sqrt(len(differences))

    def is_ring(self, name: str) -> bool:
        """Whether candidate `name` is a ring layout with replicated experts (each expert's replicas on consecutive
        GPUs: the live router's exact chain split and the rebalancer's drift swaps need one)."""
        phy2log = self.starts[name][0]
        return bool(np.bincount(phy2log).max() > 1) and ring_spans(
            phy2log, len(self.mean_E), self.cluster.num_gpus, self.cluster.slots_per_gpu) is not None

    def penalised(self, name: str) -> float:
        """The fitted objective of candidate `name` plus its move penalty against the current placement."""
        return self.fitted[name] + _move_penalty(self.starts[name][0], self.current, self.layer, self.config,
                                                 self.cluster.slots_per_gpu)

    def best(self) -> str:
        """The scored candidate with the least penalised objective (ties: the first scored)."""
        return min(self.fitted, key=self.penalised)

    def check_enough(self) -> None:
        """Sets `enough` once the best scored candidate is within `config.good_enough` or at the window's bound."""
        best = self.penalised(self.best())
        self.enough = ((self.config.good_enough is not None and best <= self.config.good_enough)
                       or best <= self.bound * (1 + BOUND_TOLERANCE))


def solve_layer(layer, counts_TE, mean_E, replicas_E, greedy: Placement, cluster: ClusterSpec, config: CpSatConfig,
                speed_G, current: Placement | None, budget, limits: NodeLimits | None = None,
                best: str = "full", stop: FitStop | None = None) -> LayerResult:
    """One layer, at the best of LEVELS from `best` on that the budget allows. Under `limits` every candidate keeps
    each expert group within its nodes (`node_limits`); `greedy` is then the hierarchical greedy. `stop`: the fit's
    stop flag (raises `FitStopped` between steps once it is set)."""
    search = _LayerSearch(layer, counts_TE, mean_E, replicas_E, cluster, config, speed_G, current, budget, limits,
                          _chain_orders(replicas_E, cluster, config), level="greedy", stop=stop or FitStop())
    if config.gpu_capacity is None:
        search.bound = float(imbalance_lower_bound(counts_TE, cluster.num_slots, cluster.num_gpus).mean())
    search.level = budget.start_layer(layer, *search.work, best)
    if search.level == "greedy":
        return LayerResult(greedy.phy2log_LP[layer], greedy.weights_LP[layer], "deepseek", "skipped", {}, None, None,
                           level=search.level)
    search.starts["deepseek"] = (greedy.phy2log_LP[layer], greedy.weights_LP[layer])
    if current is not None:
        search.starts["current"] = search.weighted(current.phy2log_LP[layer])
    _score_starts(search)
    _swap_phase(search)
    _ring_search_phase(search)
    if search.level == "full" and not search.enough:
        search.level = budget.resume(layer, search.level, "starts",
                                     [budget.estimate("model") + MIN_SOLVE_S, 0.0, 0.0, 0.0], *search.work)
    solve = ("skipped", None, None, 0.0)
    if search.level == "full" and not search.enough and not swaps_only(cluster, config):
        solve = cpsat_phase(search)
    return _choose(search, *solve)


def swaps_only(cluster: ClusterSpec, config: CpSatConfig) -> bool:
    """Whether the layer's candidates are the greedy and the swap search from it alone, the swap search with the whole
    budget: under equal routing, where CP-SAT's model (per-step or fixed shares) is not the router's and its solutions
    did not beat the swap search's (`scripts/bench_work_budget.py`'s adapter rows), and at PAIRING_SLOTS slots per GPU
    or fewer, where a GPU serves a pair of experts: a chain layout fills its chain GPUs with the halves of two
    replicated (hot) experts and leaves the others to be paired by the window's steps, CP-SAT pairs them on a few
    sampled steps, and both win windows on their noise and bursts to lose the steps after them; the swap search from the
    greedy's heaviest-with-lightest pairs keeps a swap only if it clears the noise of the steps it was chosen on
    (PAIRING_SWAP_Z), and runs at all only where its layout fitted on the window's older steps beats the greedy on the
    newest ones, held out of that fit (PAIRING_HOLDOUT_SHARE), so it leaves the greedy's layout where the window cannot
    tell (figures: docs/placement.md, 'Two slots a GPU')."""
    return config.routing == "equal" or cluster.slots_per_gpu <= PAIRING_SLOTS


def _score_starts(search: _LayerSearch) -> None:
    """Step 1: the first chain start with the other candidates, the greedy unless a start provably beats it, then
    the other chain starts if the level and the budget left still allow them."""
    _add_starts(search, search.orders[:1])
    # Under dynamic routing the greedy is scored only if no start provably beats it: its experts with one replica
    # cannot move, which bounds its fitted objective from below (a chain start usually beats that bound, and
    # scoring is most of a layer's fixed work: figures in docs/placement.md, 'Budget: deterministic work').
    if "deepseek" not in search.fitted:
        greedy_P = search.starts["deepseek"][0]
        search.greedy_floor = greedy_floor = (
            _fixed_load_bound(search.counts_TE, greedy_P, search.cluster, search.speed_G)
            + _move_penalty(greedy_P, search.current, search.layer, search.config, search.cluster.slots_per_gpu))
        if not search.fitted or search.penalised(search.best()) > greedy_floor:
            search.score("deepseek")
            search.budget.charge(search.layer, search.budget.estimate("score"))
    search.check_enough()
    if search.level == "one-chain" or len(search.orders) <= 1 or search.enough:
        return
    budget = search.budget
    rest = (len(search.orders) - 1) * (budget.estimate("chain") + budget.estimate("score"))
    search.level = budget.resume(search.layer, search.level, "one-chain",
                                 [rest + budget.estimate("model") + MIN_SOLVE_S, rest, 0.0, 0.0], *search.work)
    if search.level != "one-chain":
        _add_starts(search, search.orders[1:])
        search.check_enough()


def _swap_phase(search: _LayerSearch) -> None:
    """Step 2: the swap search (`swap_search`) from the greedy; its slot map becomes the candidate "swap" (under
    node limits, swaps stay within a node). At level `full` it takes up to SWAP_SHARE of the layer's spare budget
    (the ring search and CP-SAT follow), at level `starts` and where the swaps are the only search (`swaps_only`)
    all of it."""
    config, budget, cluster = search.config, search.budget, search.cluster
    if search.level not in ("full", "starts") or search.enough or not config.swap_search:
        return
    after = budget.estimate("chain") + budget.estimate("score")
    share = 1.0
    if search.level == "full" and not swaps_only(cluster, config):
        after += budget.estimate("model") + MIN_SOLVE_S
        share = SWAP_SHARE
    amount = share * budget.spare(search.layer, after, *search.work)
    evaluations = budget.swap_evaluations(amount)
    began = budget.clock()
    pairing = cluster.slots_per_gpu <= PAIRING_SLOTS
    phy2log, _, spent = swap_search(search.counts_TE, search.starts["deepseek"][0], cluster.num_gpus,
                                    cluster.slots_per_gpu, search.speed_G, evaluations,
                                    recount=config.routing == "equal",
                                    node_of_G=None if search.limits is None else search.limits.node_of_G,
                                    min_z=PAIRING_SWAP_Z if pairing else 0.0, stop=search.stop.check,
                                    holdout_share=PAIRING_HOLDOUT_SHARE if pairing else 0.0)
    budget.charge(search.layer, amount * min(1.0, spent / max(evaluations, 1.0)))
    search.search_seconds += budget.clock() - began
    start = np.sort(search.starts["deepseek"][0].reshape(cluster.num_gpus, -1), axis=1).reshape(-1)
    if not np.array_equal(phy2log, start):
        search.starts["swap"] = search.weighted(phy2log)
        search.score("swap")
        budget.charge(search.layer, budget.estimate("chain") + budget.estimate("score"))
        search.check_enough()


def _ring_search_phase(search: _LayerSearch) -> None:
    """Step 3: under dynamic routing, where it pays off, the ring search from the best chain start, in half the
    layer's spare budget; its layout becomes the candidate "chain-search"."""
    config, budget, cluster = search.config, search.budget, search.cluster
    chains = [name for name in search.fitted if name.startswith("chain")]
    if not (search.level == "full" and not search.enough and config.routing == "dynamic" and config.ring_search
            and search.limits is None and chains and search_pays_off(len(search.counts_TE), cluster.num_gpus)):
        return
    searched = budget.clock()
    start = min(chains, key=search.fitted.get)
    # Half the spare budget: the searched layout is then weighted and scored like a chain start, and the model built.
    after = budget.estimate("chain") + budget.estimate("score") + budget.estimate("model")
    amount = 0.5 * budget.spare(search.layer, after, *search.work)
    deadline, rounds = budget.ring_limits(amount)
    phy2log, _, done = ring_search(search.counts_TE, search.starts[start][0], cluster.num_gpus,
                                          cluster.slots_per_gpu, search.speed_G, (config.seed, search.layer),
                                          deadline, max_rounds=rounds, stop=search.stop.check)
    budget.charge(search.layer, amount * done / max(rounds, 1))
    search.starts["chain-search"] = search.weighted(phy2log)
    search.score("chain-search")
    budget.charge(search.layer, budget.estimate("chain") + budget.estimate("score"))
    search.search_seconds += budget.clock() - searched
    search.check_enough()


def _choose(search: _LayerSearch, status: str, objective: float | None, bound: float | None,
            seconds: float) -> LayerResult:
    """The best scored candidate (every candidate keeps the node limits when there are any), unless it beats the
    incumbent by no more than the window's noise (`_LayerSearch.beats`): such a gain is not one the next steps
    keep. The incumbent is the best ring layout no worse than the greedy (the live router's exact split and the
    rebalancer's drift swaps need a ring, and its connectivity serves drifting traffic), else the greedy (unless it
    wastes a slot on a second replica of an expert on one GPU)."""
    chosen = search.best()
    incumbent = _incumbent(search)
    if incumbent is not None and chosen != incumbent and not search.beats(chosen, incumbent):
        chosen = incumbent
    phy2log, weights = search.starts[chosen]
    return LayerResult(np.asarray(phy2log), np.asarray(weights), chosen, status, search.fitted, objective, bound,
                       seconds, search.search_seconds, search.level, search.enough)


def _incumbent(search: _LayerSearch) -> str | None:
    """The candidate a challenger must clearly beat (see `_choose`), or None."""
    rings = [name for name in search.fitted if name != "deepseek" and search.is_ring(name)]
    greedy = search.starts["deepseek"][0]
    if "deepseek" not in search.fitted and search.greedy_floor is not None:
        best = search.best()
        if best == "deepseek" or search.penalised(best) > (1 - MARGIN) * search.greedy_floor:
            search.score("deepseek")  # not clearly past the greedy's floor: its own score decides
    # A ring incumbent must be no worse than the greedy: than its score, or (unscored) than the floor under it.
    greedy_fit = search.penalised("deepseek") if "deepseek" in search.fitted else search.greedy_floor
    rings = [name for name in rings if greedy_fit is not None and search.penalised(name) <= greedy_fit]
    if rings:
        return min(rings, key=search.penalised)
    gpu_of_slot = np.arange(len(greedy)) // search.cluster.slots_per_gpu
    clean = len(np.unique(greedy * search.cluster.num_gpus + gpu_of_slot)) == len(greedy)
    return "deepseek" if clean and "deepseek" in search.fitted else None


def _chain_orders(replicas_E: np.ndarray, cluster: ClusterSpec, config: CpSatConfig) -> list[tuple[str, int]]:
    """Ring orders of the chain starts, the one that level `one-chain` keeps first: a random order, which fits
    better than the interleaved one (figures: docs/placement.md, 'Chain layout'). None where an expert has more
    replicas than there are GPUs, and where the swap search is the only search (`swaps_only`; under equal routing a
    chain lets no load move, which needs a per-step split)."""
    if replicas_E.max() > cluster.num_gpus or swaps_only(cluster, config):
        return []
    randoms = [("random", config.seed * 1000 + i) for i in range(config.layout_seeds)]
    return randoms[:1] + [("interleave", 0)] + randoms[1:]


def _add_starts(search: _LayerSearch, orders: list[tuple[str, int]]) -> None:
    """Step 1 for the ring `orders`: adds their chain layouts to the starts (under node limits, one chain per node
    over the experts the greedy put there), then scores every start not yet scored (the greedy only where dynamic
    routing may not skip it: see `_score_starts`), charging both to the budget."""
    cluster, budget = search.cluster, search.budget
    began = budget.clock()
    built = 0
    for order, seed in orders:
        search.stop.check()
        if search.limits is None:
            chain = chain_layout(search.mean_E, search.replicas_E, cluster.num_gpus, cluster.slots_per_gpu, order,
                                 seed, search.counts_TE)
        else:
            chain = node_chain_layout(search.starts["deepseek"][0], search.mean_E, search.counts_TE, cluster, order,
                                      seed)
        built += 1
        if chain is not None:
            search.starts[f"chain-{order}" if order != "random" else f"chain-random{seed}"] = search.weighted(chain)
    if built:
        budget.observe("chain", (budget.clock() - began) / built)
        budget.charge(search.layer, built * budget.estimate("chain"))
    began = budget.clock()
    new = [name for name in search.starts
           if name not in search.fitted and (name != "deepseek" or search.config.routing != "dynamic")]
    for name in new:
        search.score(name)
    if new:
        budget.observe("score", (budget.clock() - began) / len(new))
        budget.charge(search.layer, len(new) * budget.estimate("score"))


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
