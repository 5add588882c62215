"""The cpsat time budget: levels chosen from measured work, stepped down in order, ending by the deadline.

The budget is driven by an injected clock (a simulated fit whose work costs known seconds) or by a tiny real time
limit whose outcome does not depend on the machine's speed; nothing here asserts on wall-clock time.
"""

import numpy as np
import pytest

from placement import ClusterSpec, fit_placement
from placement import blas_threads
from placement.policies import cpsat_layer
from placement.policies.cpsat_budget import LEVELS, MIN_SOLVE_S, FitBudget, plan_level
from placement.policies.cpsat_layer import fitted_objective


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [(25.0, "full"), (15.0, "starts"), (5.0, "one-chain"), (4.9, "greedy"), (-1.0, "greedy")],
    ids=["all-fit", "no-searches", "one-chain", "greedy", "past-deadline"],
)
def test_plan_level_takes_the_best_level_at_which_every_layer_fits(capacity, expected):
    assert LEVELS[plan_level(capacity, 10, [2.5, 1.5, 0.5, 0.0])] == expected


class FakeClock:
    """A clock that moves only when the simulated work says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate_fit(num_layers: int, time_limit: float, slowdown_from: int | None = None) -> tuple[list[str], float]:
    """The budget's calls as `fit_cpsat` makes them, on one worker, for layers of 3 chain starts whose phases cost
    fixed seconds (twice as much from layer `slowdown_from` on, as when busy processes start beside the fit);
    returns each layer's level and the time the fit ends."""
    clock = FakeClock()
    budget = FitBudget(time_limit, num_layers, workers=1, clock=clock)

    def run_layer(layer: int, best: str) -> str:
        factor = 2.0 if slowdown_from is not None and layer >= slowdown_from else 1.0
        chain, score, model = 0.1 * factor, 0.1 * factor, 0.5 * factor
        level = budget.start_layer(layer, 3, 1, best)
        for batch, more in enumerate((1, 2)):  # the first chain start with the greedy, then the other two
            if level == "greedy" or (batch and level == "one-chain"):
                break
            clock.now += more * chain
            budget.observe("chain", chain)
            clock.now += (more + 1 - batch) * score
            budget.observe("score", score)
            if batch == 0 and level != "one-chain":
                rest = 2 * (budget.estimate("chain") + budget.estimate("score"))
                level = budget.resume(layer, level, "one-chain",
                                      [rest + budget.estimate("model") + MIN_SOLVE_S, rest, 0, 0], 3, 1)
        if level == "full":
            level = budget.resume(layer, level, "starts", [budget.estimate("model") + MIN_SOLVE_S, 0, 0, 0], 3, 1)
        if level == "full":
            clock.now += model  # built; reading the solution back is free here
            clock.now += max(MIN_SOLVE_S, budget.spare(layer, 0.0, 3, 1))
            budget.observe("model", model)
        budget.finish_layer(layer)
        return level

    levels = [run_layer(layer, "full") for layer in range(num_layers)]
    again = [layer for layer, level in enumerate(levels) if level == "greedy"]
    budget.reopen(len(again))
    for layer in again:
        levels[layer] = run_layer(layer, "one-chain")
    return levels, clock.now


def test_budget_degrades_the_first_layers_only_as_far_as_needed_and_ends_by_the_deadline():
    # Per layer: one-chain 0.3 s, starts 0.7 s, full 1.25 s: 20 layers fit in 10 s only partly at starts.
    levels, end = simulate_fit(20, 10.0)
    assert end <= 10.0
    assert "greedy" not in levels and "starts" in levels and "one-chain" in levels
    # After the first layer (measured, no estimates yet), the levels only rise again: degraded layers come first.
    ranks = [LEVELS.index(level) for level in levels[1:]]
    assert ranks == sorted(ranks, reverse=True)


def test_budget_spends_the_time_left_over_on_full_layers_and_ends_by_the_deadline():
    levels, end = simulate_fit(20, 30.0)
    assert end <= 30.0 + 1e-9
    assert set(levels) <= {"full", "starts"} and levels.count("full") >= 10


def test_budget_holds_within_ten_percent_when_the_work_slows_down_twofold_mid_fit():
    levels, end = simulate_fit(40, 12.0, slowdown_from=20)
    assert end <= 12.0 * 1.1
    assert LEVELS.index(max(levels[20:], key=LEVELS.index)) >= LEVELS.index(min(levels[:20], key=LEVELS.index))


def test_a_full_layer_searches_in_its_share_of_the_time_left_over():
    clock = FakeClock()
    budget = FitBudget(10.0, 2, workers=1, clock=clock)
    for phase, seconds in (("chain", 0.5), ("score", 0.5), ("model", 1.0)):
        budget.observe(phase, seconds)
    # Full fixed work per layer: 3 chains x (0.5 + 0.5) + 0.5 for the greedy + 1.0 model = 4.5 s (+ 0.05 solve).
    assert budget.start_layer(0, 3, 1) == "full"
    # Layer 0 has 1 s of work to come; layer 1 will need 4.5 s; both share the 10 - 1 - 4.5 s left over.
    assert budget.spare(0, 1.0, 3, 1) == pytest.approx(2.25)


def test_layers_left_at_the_greedy_are_owed_a_chain_start_before_others_take_more():
    clock = FakeClock()
    budget = FitBudget(0.8, 3, workers=1, clock=clock)
    budget.observe("chain", 1.0)
    budget.observe("score", 1.0)
    assert budget.start_layer(0, 3, 1) == "greedy"  # one chain start alone would take 3 s
    budget.finish_layer(0)
    for _ in range(4):  # the cores free up: one-chain 0.15 s, starts 0.35 s, full 0.9 s per layer
        budget.observe("chain", 0.05)
        budget.observe("score", 0.05)
    # 2 layers at starts would fit the 0.8 s, but not with the 0.15 s owed to layer 0 ...
    assert budget.start_layer(1, 3, 1) == "one-chain"
    budget.finish_layer(1)
    assert budget.start_layer(2, 3, 1) == "starts"  # 0.35 + 0.15 <= 0.8
    budget.finish_layer(2)
    # ... which, solved again, gets its chain start.
    budget.reopen(1)
    assert budget.start_layer(0, 3, 1, best="one-chain") == "one-chain"


def skewed_counts(num_steps: int, num_layers: int, num_experts: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0, 1.0, size=(num_layers, num_experts))
    popularity /= popularity.sum(axis=1, keepdims=True)
    return rng.multinomial(512, popularity, size=(num_steps, num_layers))


def assert_valid_and_no_worse_than_greedy(placement, greedy, counts, cluster, routing="dynamic"):
    placement.validate()  # shapes, every expert placed, weights summing to 1
    ones = np.ones(cluster.num_gpus)
    for layer in range(counts.shape[1]):
        ours = fitted_objective(counts[:, layer], placement.phy2log_LP[layer], placement.weights_LP[layer], cluster,
                                routing, ones)
        hint = fitted_objective(counts[:, layer], greedy.phy2log_LP[layer], greedy.weights_LP[layer], cluster,
                                routing, ones)
        assert ours <= hint + 1e-12, f"layer {layer}: {ours} worse than the greedy's {hint}"


def test_tiny_time_limit_gives_a_valid_placement_no_worse_than_the_greedy_and_reports_degraded_layers():
    # 16 layers need at least 16 x 0.05 s of CP-SAT at full level, more than 0.2 s on 2 workers: some must degrade.
    counts = skewed_counts(12, 16, 24, 3)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    placement = fit_placement("cpsat", counts, cluster, time_limit_s=0.2)
    greedy = fit_placement("deepseek", counts, cluster)
    assert_valid_and_no_worse_than_greedy(placement, greedy, counts, cluster)
    info = placement.info
    assert sum(info["levels"].values()) == 16 and len(info["layer_levels"]) == 16
    assert info["degraded_layers"] == 16 - info["levels"]["full"] > 0
    assert "order full > starts > one-chain > greedy" in info["degraded_reason"]
    assert set(info["layer_costs"]) == {"chain", "score", "model"} and info["budget"] == "wall clock"


@pytest.mark.parametrize("level", LEVELS, ids=LEVELS)
def test_each_level_does_its_share_of_the_work_and_stays_no_worse_than_the_greedy(level, monkeypatch):
    monkeypatch.setattr(FitBudget, "start_layer", lambda budget, layer, chains, others, best="full": level)
    counts = skewed_counts(12, 2, 24, 4)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    placement = fit_placement("cpsat", counts, cluster, time_limit_s=2.0)
    greedy = fit_placement("deepseek", counts, cluster)
    assert_valid_and_no_worse_than_greedy(placement, greedy, counts, cluster)
    info = placement.info
    candidates = set(info["fitted_mean"]) - {"deepseek"}  # the greedy is scored unless a start provably beats it
    if level == "greedy":
        assert (placement.phy2log_LP == greedy.phy2log_LP).all() and (placement.weights_LP == greedy.weights_LP).all()
        assert info["scored_layers"] == 0 and info["fitted_chosen"] is None and info["levels"]["greedy"] == 2
    elif level == "one-chain":
        assert candidates == {"chain-random0"} and info["levels"]["one-chain"] == 2
    elif level == "starts":  # every chain start, and the swap search where it finds a better slot map
        assert candidates - {"swap"} == {"chain-random0", "chain-interleave", "chain-random1"}
        assert info["status"] == {"skipped": 2} and info["levels"]["starts"] == 2
    else:
        # A full layer may still drop its CP-SAT step when the time left cannot take it (a loaded machine).
        assert info["levels"]["full"] + info["levels"]["starts"] == 2
        assert "chain-search" in candidates  # 12 steps on 8 GPUs: the ring search pays off


def test_layers_left_at_the_greedy_are_solved_again_with_a_chain_start_when_time_is_left(monkeypatch):
    start_layer = FitBudget.start_layer

    def first_pass_greedy(budget, layer, chains, others, best="full"):
        level = start_layer(budget, layer, chains, others, best)
        return "greedy" if best == "full" else level

    monkeypatch.setattr(FitBudget, "start_layer", first_pass_greedy)
    counts = skewed_counts(12, 3, 24, 5)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    placement = fit_placement("cpsat", counts, cluster, time_limit_s=5.0)
    assert placement.info["revisited_layers"] == 3 and placement.info["levels"]["one-chain"] == 3
    assert_valid_and_no_worse_than_greedy(placement, fit_placement("deepseek", counts, cluster), counts, cluster)


@pytest.mark.parametrize("seed", range(3), ids=[f"seed{s}" for s in range(3)])
def test_the_fixed_load_bound_never_exceeds_the_fitted_objective(seed):
    counts = skewed_counts(10, 1, 24, seed)
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=4)
    speed = np.random.default_rng(seed).uniform(0.5, 1.5, size=8)
    greedy = fit_placement("deepseek", counts, cluster)
    chain = fit_placement("cpsat", counts, cluster, time_limit_s=1.0, ring_search=False)
    for placement in (greedy, chain):
        bound = cpsat_layer._fixed_load_bound(counts[:, 0], placement.phy2log_LP[0], cluster, speed)
        assert bound <= fitted_objective(counts[:, 0], placement.phy2log_LP[0], placement.weights_LP[0], cluster,
                                         "dynamic", speed) + 1e-12


def test_openblas_runs_one_thread_inside_a_fit_and_gets_its_threads_back():
    calls = blas_threads._openblas_thread_calls()
    if not calls:
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    get, put = calls[0]
    before = get()
    put(2)
    try:
        with blas_threads.one_blas_thread():
            with blas_threads.one_blas_thread():
                assert get() == 1
            assert get() == 1  # the outer fit still runs
        assert get() == 2
    finally:
        put(before)
