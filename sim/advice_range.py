"""What the adviser knows: each close layout's rate over the traffic scenarios, the ties they leave, and the user's
own layout against the pick (`eplb advise --current`, `--scenarios`).

The ranked table rests on one traffic, the user's trace. Its figures move with what that trace does not pin down
(`sim.scenarios`: the skew of a production mix, bursts, the seed), often by more than the differences between the
best layouts. So the pick and the layouts close to it (`SCREEN`) are rerun over the traffic cases, on the
simulator's request-level decode traffic at the model's shape, and:

- a layout that matches or beats the pick (within `TIE`) in any case is a tie: the advice does not hold across the
  cases, and says so rather than choosing;
- the pick's gain over the user's current layout is a range over the cases, beside the central figure;
- the break-even: the imbalance at which the current layout would serve as many tokens per card as the pick does.
"""

from collections.abc import Callable

from scipy.optimize import brentq

from sim.capacity import decode_capacity
from sim.config import SimConfig
from sim.scenarios import TrafficCase, apply_case, spread

SCREEN = 0.05  # layouts within this share of the pick's central rate are rerun over the cases
MAX_SCREENED = 4  # at most this many besides the pick (the closest first)
TIE = 0.002  # a layout within this share of the pick in a case matches it there
CASE_LAYERS = 4  # layers of the cases' synthetic traffic (the cpsat budget scales with them)
MIN_CASE_STEPS = 100  # steps of a case's traffic: at least this many, and three fit windows (two scored)


def case_config(config: SimConfig, case: TrafficCase) -> SimConfig:
    """A candidate's config read under `case`: the simulator's own decode traffic (request-level, the case's skew,
    bursts and seed) in place of the trace, `CASE_LAYERS` layers, the cpsat budget per layer kept, three fit windows
    of steps (at least `MIN_CASE_STEPS`, at most the config's): two scored, as a row needs to answer."""
    balance = config.balance
    per_layer = balance.work_limit / max(1, balance.trace_layers or balance.layers)
    steps = min(balance.steps, max(MIN_CASE_STEPS, 3 * balance.window))
    synthetic = config.model_copy(update={"balance": balance.model_copy(update={
        "routing_trace": None, "trace_layers": None, "traffic": "requests", "layers": CASE_LAYERS,
        "work_limit": per_layer * CASE_LAYERS, "steps": steps})})
    return apply_case(synthetic, case)


def case_work(config: SimConfig, case_list: list[TrafficCase], rows: int) -> float:
    """The cpsat work units (`balance.work_limit` a fit) rerunning `rows` layouts over `case_list` takes: each a
    replay of `balance.steps` steps refitted every `balance.refit_every` after its first window (`case_config`)."""
    balance = case_config(config, case_list[0]).balance if case_list else config.balance
    window = min(balance.window, balance.steps // 2)
    fits = -(-(balance.steps - window) // balance.refit_every)
    return rows * len(case_list) * fits * balance.work_limit


def screened(rows: list[dict], best: dict, policy: str) -> list[dict]:
    """The pick and the answerable rows within `SCREEN` of its rate under `policy` (closest first, at most
    `MAX_SCREENED` more)."""
    rate = best[policy]["tokens_per_s_per_card"]
    close = [row for row in rows if row is not best and row.get("answerable", True)
             and row[policy]["tokens_per_s_per_card"] >= (1 - SCREEN) * rate]
    return [best, *close[:MAX_SCREENED]]


def case_rates(config_of: Callable[[dict], SimConfig], rows: list[dict], case_list: list[TrafficCase],
               progress: Callable[[], None] | None = None) -> list[list[float]]:
    """[row][case] decode tokens/s per card of each row's config (`config_of(row)`) under each case."""
    found = []
    for row in rows:
        rates = []
        for case in case_list:
            rates.append(decode_capacity(case_config(config_of(row), case))["tokens_per_s_per_card"])
            if progress is not None:
                progress()
        found.append(rates)
    return found


def ties(rows: list[dict], rates: list[list[float]], policy: str) -> list[dict]:
    """The rows (after the first, the pick) that match or beat the pick within `TIE` in some case, central included:
    [{"cards", "slots_per_card", "node_limits", "wins_in", "cases"}], `wins_in` counting those cases."""
    central = [row[policy]["tokens_per_s_per_card"] for row in rows]
    found = []
    for index in range(1, len(rows)):
        pairs = [(central[index], central[0]), *zip(rates[index], rates[0])]
        wins = sum(rate >= (1 - TIE) * pick for rate, pick in pairs)
        if wins:
            found.append({key: rows[index][key] for key in ("cards", "slots_per_card", "node_limits")}
                         | {"wins_in": wins, "cases": len(pairs)})
    return found


def gain_range(pick: dict, current: dict, pick_rates: list[float], current_rates: list[float],
               policy: str) -> dict:
    """The pick's gain over the current layout (tokens/s per card, less one): central and its range over the
    cases."""
    central = pick[policy]["tokens_per_s_per_card"] / current[policy]["tokens_per_s_per_card"] - 1.0
    return spread(central, [mine / theirs - 1.0 for mine, theirs in zip(pick_rates, current_rates) if theirs > 0])


def break_even(config: SimConfig, current: dict, target_rate: float, policy: str) -> float | None:
    """The expert imbalance at which the current layout's config serves `target_rate` tokens/s per card (its
    capacity at that fixed imbalance); None where even perfect balance serves less, or where its own imbalance
    already serves as much."""
    own = current[policy]["imbalance"]
    if own is None or current[policy]["tokens_per_s_per_card"] >= target_rate:
        return None

    def gap(imbalance: float) -> float:
        return decode_capacity(config, imbalance)["tokens_per_s_per_card"] - target_rate

    if gap(1.0) < 0:
        return None
    return float(brentq(gap, 1.0, own, xtol=1e-4))
