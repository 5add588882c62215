"""One pass of the fleet run over its time steps, on token rates.

Each step (`fleet.step_s`), in this order:
1. scale: the autoscaler (when on) lets arrived nodes serve and, every `interval_s`, sizes both stages for the load
   one lead time ahead plus draining the backlog, and the capacity out of service;
2. fail: card failures take capacity away and send sequences back to prefill (`sim.fleet.faults`);
3. serve: arrivals join the prefill backlog; prefill serves prompt tokens up to its units' capacity and hands the
   replies they owe to decode, which serves generated tokens up to its own (both from `sim.fleet.unit_capacity`);
   what does not fit waits (a queue per stage, whose wait is backlog over capacity);
4. bill: revenue from the tokens served (hits and misses at their prices, valley hours discounted), cost from every
   node held (spares included), during the days only (the drain finishes their work);
5. record: the step's series.

Legend: T time steps of the pass (the days' arrival steps, then the drain).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim.config import SimConfig
from sim.fleet.autoscaler import STAGES, Autoscaler, within_quota
from sim.fleet.config import DailyTraffic
from sim.fleet.economics import card_hour_usd, revenue_usd
from sim.fleet.faults import Faults
from sim.fleet.prefix_store import daily_hit_shares, with_hit_share
from sim.fleet.unit_capacity import UnitCapacity, unit_capacity
from sim.workload import daily_rate_factor

PROGRESS_EVERY = 60  # steps between progress reports
DRAIN_INTERVALS = 3.0  # the autoscaler sizes a stage to drain its backlog over this many decision intervals


@dataclass
class FleetRun:
    """One pass over the steps: per-step series [T] (arrivals then the drain) and totals."""

    time_s: np.ndarray
    nodes: dict[str, np.ndarray]  # serving nodes per stage
    held: np.ndarray  # nodes held (serving, moving, arriving, spares)
    wait_s: dict[str, np.ndarray]  # queue wait per stage
    output_tokens: np.ndarray  # generated per step
    arrivals: np.ndarray  # requests arrived per step
    revenue_usd: float
    cost_usd: float
    card_hours: float
    tokens: dict[str, float]  # input_hit, input_miss, output (served, billed)
    requests: float
    requests_lost: float
    requests_requeued: float
    faults: Faults
    autoscaler: Autoscaler | None


@dataclass(frozen=True)
class _Plan:
    """What a pass knows before its first step; per-stage dicts are keyed by `STAGES`."""

    arrival: int  # steps with arrivals (the days)
    steps: int  # arrival steps, then the drain
    step_s: float
    load_T: np.ndarray  # [arrival] load factor, mean 1
    input_per_s: float  # prompt tokens per second at load 1
    output_per_input_T: np.ndarray  # [arrival] generated tokens each step's prompts owe per prompt token
    output_tokens_per_request: float  # turns generated tokens into requests
    unit_nodes: dict[str, int]  # nodes per unit
    step_nodes: dict[str, int]  # nodes by which a stage's capacity grows: 1 (granularity node) or a unit's
    node_rate: dict[str, float]  # tokens per second of one node
    unit_rate: dict[str, float]  # tokens per second of one unit
    cards_per_node: int
    price: dict[str, float]  # $ per card-hour
    spare_nodes: dict[str, int]
    hit_share_D: np.ndarray  # [days] share of each day's prompt tokens served from the prefix cache
    prefill_scale_D: np.ndarray  # [days] a prefill unit's rate that day over `unit_rate["prefill"]`

    def output_per_input(self, index: int) -> float:
        """Generated tokens per prompt token owed by step `index`'s prompts (the last day's step in the drain)."""
        return self.output_per_input_T[min(index, self.arrival - 1)]

    def day(self, index: int) -> int:
        """The day step `index` falls in (the drain counts as the last day)."""
        return min(int(index * self.step_s // 86400), len(self.hit_share_D) - 1)

    def rate(self, stage: str, index: int, per: str = "node") -> float:
        """Tokens per second of one node (or `per="unit"`) of `stage` at step `index`: a prefill rate moves with the
        day's cache hit share."""
        rate = (self.node_rate if per == "node" else self.unit_rate)[stage]
        return rate * self.prefill_scale_D[self.day(index)] if stage == "prefill" else rate


@dataclass
class _Backlog:
    """Tokens waiting between steps."""

    prefill: float = 0.0  # prompt tokens waiting, re-prefills included
    billable: float = 0.0  # the billable ones among them (arrivals, not re-prefills)
    owed: float = 0.0  # generated tokens the waiting prompts' replies will need
    decode: float = 0.0  # generated tokens waiting for decode

    def of(self, stage: str) -> float:
        """Tokens waiting for `stage`."""
        return self.prefill if stage == "prefill" else self.decode


@dataclass
class _Control:
    """The autoscaler and what its next decision needs."""

    scaler: Autoscaler
    next_decision_s: float = 0.0
    last_rate: float = 0.0  # prompt tokens per second the last decision saw
    lead_s: float = 0.0  # the longest wait before a node asked for serves (move or grow)
    interval_steps: int = 1  # steps per decision interval


@dataclass
class _Totals:
    """Sums over the pass."""

    revenue_usd: float = 0.0
    cost_usd: float = 0.0
    card_hours: float = 0.0
    requeued: float = 0.0
    tokens: dict[str, float] = field(default_factory=lambda: {"input_hit": 0.0, "input_miss": 0.0, "output": 0.0})
    serving_rate: float = 0.0  # generated tokens per second last step: sequences in flight x speed


def arrival_steps(config: SimConfig) -> int:
    """Steps of the fleet's days (arrivals), before the drain."""
    return math.ceil(config.fleet.days * 86400.0 / config.fleet.step_s)


def daily_load(traffic: DailyTraffic, steps: int, step_s: float, rng: np.random.Generator) -> np.ndarray:
    """[steps] load factor, mean exactly 1: a cosine with the configured peak-to-mean peaking at peak_hour, times
    log-normal noise, plus bursts."""
    curve = daily_rate_factor(np.arange(steps) * step_s, traffic.peak_to_mean, traffic.peak_hour)
    curve = curve * np.exp(traffic.noise * rng.standard_normal(steps) - traffic.noise ** 2 / 2)
    days = steps * step_s / 86400.0
    for _ in range(int(rng.poisson(traffic.bursts_per_day * days))):
        start = int(rng.integers(steps))
        curve[start:start + max(1, round(traffic.burst_minutes * 60 / step_s))] *= 1.0 + traffic.burst_size
    return curve / curve.mean()


def _output_per_input(traffic: DailyTraffic, load: np.ndarray, step_s: float) -> np.ndarray:
    """[T] generated tokens each step's prompts will need per prompt token: the day's ratio, swung by `mix_swing`
    over the hours (peak at `mix_peak_hour`), scaled so the days' totals stay the configured ones."""
    shape = daily_rate_factor(np.arange(len(load)) * step_s, 1.0 + traffic.mix_swing, traffic.mix_peak_hour)
    ratio = traffic.output_tokens_per_day / traffic.input_tokens_per_day
    return ratio * shape * load.sum() / (load * shape).sum()


def run_pass(config: SimConfig, unit: UnitCapacity, fixed: dict[str, int] | None,
             progress: Callable[[float, float], None] | None) -> FleetRun:
    """One pass of `config.fleet`: autoscaled (`fixed` None) or a fixed split of `fixed` nodes per stage."""
    fleet = config.fleet
    plan = _plan(config, unit)
    faults = Faults(fleet.faults, {stage: plan.unit_nodes[stage] * plan.cards_per_node for stage in STAGES},
                    plan.cards_per_node, np.random.default_rng([config.seed, 1]))
    control = None if fixed is not None else _first_control(config, plan)
    nodes = fixed if control is None else control.scaler.serving
    series = {name: np.zeros(plan.steps) for name in ("prefill", "decode", "held", "wait_prefill", "wait_decode",
                                                      "output", "arrivals")}
    backlog, totals = _Backlog(), _Totals()
    for index in range(plan.steps):
        now = index * plan.step_s
        arriving = plan.input_per_s * plan.load_T[index] * plan.step_s if index < plan.arrival else 0.0
        if control is not None:
            _scale(control, config, plan, index, backlog, faults)
            nodes = control.scaler.serving
        held_by_stage = {stage: nodes[stage] + (0 if control is None else control.scaler.incoming(stage))
                         + plan.spare_nodes[stage] for stage in STAGES}
        _fail(faults, config, plan, nodes, now, arriving, backlog, totals)
        capacity = {stage: max(0.0, _units(nodes[stage], plan.unit_nodes[stage], fleet.autoscaler.granularity)
                               - faults.units_lost(stage, now)) * plan.rate(stage, index, "unit") for stage in STAGES}
        billable, generated = _serve(plan, index, arriving, capacity, backlog)
        totals.serving_rate = generated / plan.step_s
        _bill(config, plan, index, billable, generated, held_by_stage, totals)
        _record(series, plan, index, nodes, held_by_stage, backlog, capacity, arriving, generated)
        if progress is not None and index % PROGRESS_EVERY == 0:
            progress(min(now, plan.arrival * plan.step_s), plan.arrival * plan.step_s)
    return _result(plan, series, backlog, totals, faults, control)


def _plan(config: SimConfig, unit: UnitCapacity) -> _Plan:
    """The pass's steps, its load curve (drawn from the config's seed) and its per-stage rates and prices."""
    fleet = config.fleet
    step_s, arrival = fleet.step_s, arrival_steps(config)
    load_T = daily_load(fleet.traffic, arrival, step_s, np.random.default_rng(config.seed))
    unit_nodes = {"prefill": unit.prefill_nodes, "decode": unit.decode_nodes}
    return _Plan(
        arrival=arrival, steps=arrival + math.ceil(fleet.drain_s / step_s), step_s=step_s, load_T=load_T,
        input_per_s=fleet.traffic.input_tokens_per_day / 86400.0,
        output_per_input_T=_output_per_input(fleet.traffic, load_T, step_s),
        output_tokens_per_request=fleet.traffic.output_tokens_per_request,
        unit_nodes=unit_nodes,
        # "node": a stage's capacity grows node by node (units of any size); "unit": only whole units serve.
        step_nodes=dict.fromkeys(STAGES, 1) if fleet.autoscaler.granularity == "node" else unit_nodes,
        node_rate={"prefill": unit.prefill_tokens_per_s / unit.prefill_nodes,
                   "decode": unit.decode_tokens_per_s / unit.decode_nodes},
        unit_rate={"prefill": unit.prefill_tokens_per_s, "decode": unit.decode_tokens_per_s},
        cards_per_node=config.cluster.cards_per_node,
        price={stage: card_hour_usd(config, stage) for stage in STAGES},
        spare_nodes={stage: fleet.faults.spare_nodes.get(stage, 0) for stage in STAGES},
        **_daily_prefill(config, unit, math.ceil(arrival * step_s / 86400.0)))


def _daily_prefill(config: SimConfig, unit: UnitCapacity, days: int) -> dict[str, np.ndarray]:
    """`hit_share_D` and `prefill_scale_D` of a pass: the traffic's hit share every day, or with a prefix store
    started empty (`fleet.store.start_empty`) the store's on each day, with a prefill unit's rate at it."""
    store, share = config.fleet.store, config.fleet.traffic.cache_hit_share
    if store is None or not store.start_empty:
        return {"hit_share_D": np.full(max(days, 1), share), "prefill_scale_D": np.ones(max(days, 1))}
    shares = daily_hit_shares(config, max(days, 1))
    scales = [1.0 if abs(day - share) < 1e-12 else
              unit_capacity(with_hit_share(config, day)).prefill_tokens_per_s / unit.prefill_tokens_per_s
              for day in shares]
    return {"hit_share_D": np.asarray(shares), "prefill_scale_D": np.asarray(scales)}


def _first_control(config: SimConfig, plan: _Plan) -> _Control:
    """The autoscaler sized for the first step's load, cut to the quota left after the spares."""
    auto = config.fleet.autoscaler
    spares = sum(config.fleet.faults.spare_nodes.values())
    first_rate = plan.input_per_s * plan.load_T[0]
    first = {"prefill": first_rate / plan.rate("prefill", 0),
             "decode": first_rate * plan.output_per_input_T[0] / plan.rate("decode", 0)}
    scaler = Autoscaler(auto, plan.step_nodes, dict.fromkeys(STAGES, 0), reserved=spares)
    scaler.serving = within_quota({stage: scaler.target_nodes(stage, first[stage]) for stage in STAGES},
                                  plan.step_nodes, auto.quota_nodes - spares)
    return _Control(scaler, last_rate=first_rate, lead_s=max(auto.move_s, auto.grow_s),
                    interval_steps=max(1, round(auto.interval_s / plan.step_s)))


def _scale(control: _Control, config: SimConfig, plan: _Plan, index: int, backlog: _Backlog,
           faults: Faults) -> None:
    """Phase 1: arrived nodes start serving; at a decision time, size the stages for what they will need.

    The stages are sized for the load one lead time ahead (the trend since the last decision) plus draining the
    backlog over a few intervals, since nodes asked for now serve only after the lead time; capacity out of service
    (failed cards, restarting units) is replaced too."""
    auto, now = config.fleet.autoscaler, index * plan.step_s
    control.scaler.advance(now)
    if now < control.next_decision_s:
        return
    window = plan.load_T[max(0, index - control.interval_steps):max(1, min(index, plan.arrival))]
    rate = plan.input_per_s * window.mean() if index <= plan.arrival else 0.0
    ahead = max(rate, rate + (rate - control.last_rate) * control.lead_s / auto.interval_s)
    control.last_rate = rate
    drain = DRAIN_INTERVALS * max(auto.interval_s, plan.step_s)
    needed = {"prefill": (ahead + backlog.prefill / drain) / plan.rate("prefill", index),
              "decode": (ahead * plan.output_per_input(index) + backlog.decode / drain) / plan.rate("decode", index)}
    needed = {stage: value + faults.units_lost(stage, now) * plan.unit_nodes[stage]
              for stage, value in needed.items()}
    control.scaler.decide(now, needed)
    control.next_decision_s = now + auto.interval_s


def _fail(faults: Faults, config: SimConfig, plan: _Plan, nodes: dict[str, int], now: float, arriving: float,
          backlog: _Backlog, totals: _Totals) -> None:
    """Phase 2: card failures this step; their sequences, and the step's arrivals, join the prefill backlog.

    A prefill card's failure loses its instance's batch in flight (one prompt per card), recomputed; re-queued
    sequences are prefilled again and not billed: a decode sequence's whole context, a prompt."""
    traffic = config.fleet.traffic
    serving_cards = {stage: nodes[stage] * plan.cards_per_node for stage in STAGES}
    in_flight = totals.serving_rate / config.fleet.tokens_per_s_per_user
    per_card = {"prefill": 1.0, "decode": in_flight / max(serving_cards["decode"], 1)}
    _, lost = faults.step(now, plan.step_s, serving_cards, per_card)
    totals.requeued += sum(lost.values())
    backlog.prefill += arriving + lost["decode"] * traffic.kv_tokens_per_sequence \
        + lost["prefill"] * traffic.prompt_tokens


def _serve(plan: _Plan, index: int, arriving: float, capacity: dict[str, float],
           backlog: _Backlog) -> tuple[float, float]:
    """Phase 3: prefill serves prompt tokens up to its capacity, pro rata between billable prompts and re-prefills,
    and hands the replies they owe to decode, which serves up to its own; (billable prompt tokens served, generated
    tokens)."""
    backlog.billable += arriving
    backlog.owed += arriving * plan.output_per_input(index)  # replies the prompts will need
    served = min(backlog.prefill, capacity["prefill"] * plan.step_s)
    billable = served * backlog.billable / backlog.prefill if backlog.prefill > 0 else 0.0
    owed = backlog.owed * billable / backlog.billable if backlog.billable > 0 else 0.0
    backlog.prefill -= served
    backlog.billable -= billable
    backlog.owed -= owed
    backlog.decode += owed
    generated = min(backlog.decode, capacity["decode"] * plan.step_s)
    backlog.decode -= generated
    return billable, generated


def _bill(config: SimConfig, plan: _Plan, index: int, billable: float, generated: float,
          held_by_stage: dict[str, int], totals: _Totals) -> None:
    """Phase 4: revenue of the tokens served; during the days, the cost and card-hours of every node held."""
    step_s = plan.step_s
    hit = billable * plan.hit_share_D[plan.day(index)]
    totals.revenue_usd += revenue_usd(hit, billable - hit, generated, index * step_s / 3600.0, config.fleet.prices)
    totals.tokens["input_hit"] += hit
    totals.tokens["input_miss"] += billable - hit
    totals.tokens["output"] += generated
    if index < plan.arrival:  # the days are billed; the drain finishes their work (the next day's start)
        held = sum(held_by_stage.values())
        totals.card_hours += held * plan.cards_per_node * step_s / 3600.0
        totals.cost_usd += sum(held_by_stage[stage] * plan.price[stage] for stage in STAGES) \
            * plan.cards_per_node * step_s / 3600.0


def _record(series: dict[str, np.ndarray], plan: _Plan, index: int, nodes: dict[str, int],
            held_by_stage: dict[str, int], backlog: _Backlog, capacity: dict[str, float], arriving: float,
            generated: float) -> None:
    """Phase 5: the step's nodes, queue waits (backlog over capacity; inf without capacity), output and requests
    arrived."""
    for stage in STAGES:
        series[stage][index] = nodes[stage]
        series[f"wait_{stage}"][index] = backlog.of(stage) / capacity[stage] if capacity[stage] > 0 else math.inf
    series["held"][index] = sum(held_by_stage.values())
    series["output"][index] = generated
    series["arrivals"][index] = arriving * plan.output_per_input(index) / plan.output_tokens_per_request


def _result(plan: _Plan, series: dict[str, np.ndarray], backlog: _Backlog, totals: _Totals,
            faults: Faults, control: _Control | None) -> FleetRun:
    """The pass's `FleetRun`; replies still owed or waiting after the drain count as lost requests."""
    return FleetRun(
        time_s=np.arange(plan.steps) * plan.step_s,
        nodes={stage: series[stage] for stage in STAGES},
        held=series["held"],
        wait_s={stage: series[f"wait_{stage}"] for stage in STAGES},
        output_tokens=series["output"],
        arrivals=series["arrivals"],
        revenue_usd=totals.revenue_usd,
        cost_usd=totals.cost_usd,
        card_hours=totals.card_hours,
        tokens=totals.tokens,
        requests=float(series["arrivals"].sum()),
        requests_lost=(backlog.owed + backlog.decode) / plan.output_tokens_per_request,
        requests_requeued=totals.requeued,
        faults=faults,
        autoscaler=None if control is None else control.scaler,
    )


def _units(nodes: int, unit_nodes: int, granularity: str) -> float:
    """Units of capacity `nodes` nodes give: whole units only, or pro rata."""
    return nodes / unit_nodes if granularity == "node" else float(nodes // unit_nodes)
