"""The fleet run: days of a whole serving fleet, step by step on token rates, from units costed in detail.

Each step (`fleet.step_s`): arrivals follow the daily curve (plus noise and bursts); prefill serves prompt tokens up
to its instances' capacity, decode serves generated tokens up to its units' capacity at the per-user speed (both
from `sim.fleet.unit_capacity`, the detailed run's cost model at the traffic's operating point); what does not fit waits
(a queue per stage, whose wait is backlog over capacity). The autoscaler sizes both stages every interval for the
load plus draining the backlog; failures take capacity away and send sequences back to prefill. Revenue comes from
the tokens served (hits and misses at their prices, valley hours discounted), cost from every node held (spares
included). The same traffic then runs through a fixed split holding the same node-hours, for comparison (its
failures are drawn anew: they follow the cards in service).
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.fleet.autoscaler import STAGES, Autoscaler, within_quota
from sim.config import SimConfig
from sim.fleet.economics import card_hour_usd, revenue_usd
from sim.fleet.faults import Faults
from sim.fleet.config import DailyTraffic
from sim.fleet.unit_capacity import UnitCapacity, unit_capacity
from sim.work_budget import check_fleet_work
from sim.workload import daily_rate_factor


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


def run_fleet(config: SimConfig, progress: Callable[[float, float], None] | None = None) -> dict:
    """The fleet run of `config` (its `fleet` must be set): autoscaled, then the fixed split of the same node-hours
    (or, with the autoscaler off, the configured fixed split alone); the report.

    Raises:
        ValueError: the quota cannot hold the stages' minimums and the spares, or a fixed split is missing or not
            made of whole units (the message names the field).
        SimConfigError: the run exceeds a budget of `sim.work_budget` (checked before any work).
    """
    check_fleet_work(config)
    began = time.perf_counter()
    unit = unit_capacity(config)
    auto, spares = config.fleet.autoscaler, sum(config.fleet.faults.spare_nodes.values())
    step = {"prefill": unit.prefill_nodes, "decode": unit.decode_nodes}
    if auto.granularity == "node":
        step = dict.fromkeys(STAGES, 1)
    least = sum(_whole_units(getattr(auto, f"min_{stage}_nodes"), step[stage]) for stage in STAGES)
    if least + spares > auto.quota_nodes:
        raise ValueError(f"fleet.autoscaler.quota_nodes={auto.quota_nodes} cannot hold the stages' minimums in whole "
                         f"units ({least} nodes) and the spares ({spares}); raise it or lower the minimums")
    configured = {stage: getattr(auto, f"fixed_{stage}_nodes") for stage in STAGES}
    for stage, nodes in configured.items():
        if nodes is not None and nodes % step[stage]:
            raise ValueError(f"fleet.autoscaler.fixed_{stage}_nodes={nodes} is not a whole number of "
                             f"{step[stage]}-node units; use a multiple of {step[stage]} (or granularity: node)")
    if not auto.enabled:
        missing = [f"fixed_{stage}_nodes" for stage, nodes in configured.items() if nodes is None]
        if missing:
            raise ValueError(f"fleet.autoscaler.enabled is false but {' and '.join(missing)} is not set; give the "
                             f"fixed split's nodes per stage")
        run = _run(config, unit, fixed=configured, progress=progress)
        return fleet_report(config, unit, run, None, time.perf_counter() - began)
    scaled = _run(config, unit, fixed=None, progress=progress)
    arrival = _arrival_steps(config)
    same_node_hours = {stage: configured[stage] or _whole_units(scaled.nodes[stage][:arrival].mean(), step[stage])
                       for stage in STAGES}
    fixed = _run(config, unit, fixed=same_node_hours, progress=None)
    return fleet_report(config, unit, scaled, fixed, time.perf_counter() - began)


def _arrival_steps(config: SimConfig) -> int:
    return math.ceil(config.fleet.days * 86400.0 / config.fleet.step_s)


def _whole_units(nodes: float, unit_nodes: int) -> int:
    """The fewest whole units (at least one) holding `nodes` nodes, in nodes."""
    return max(1, math.ceil(nodes / unit_nodes - 1e-9)) * unit_nodes


def _run(config: SimConfig, unit: UnitCapacity, fixed: dict[str, int] | None,
         progress: Callable[[float, float], None] | None) -> FleetRun:
    fleet = config.fleet
    traffic, auto, step_s = fleet.traffic, fleet.autoscaler, fleet.step_s
    arrival = _arrival_steps(config)
    steps = arrival + math.ceil(fleet.drain_s / step_s)
    rng = np.random.default_rng(config.seed)
    load = daily_load(traffic, arrival, step_s, rng)
    fault_rng = np.random.default_rng([config.seed, 1])
    input_per_s = traffic.input_tokens_per_day / 86400.0
    output_per_input = _output_per_input(traffic, load, step_s)
    unit_nodes = {"prefill": unit.prefill_nodes, "decode": unit.decode_nodes}
    # "node": a stage's capacity grows node by node (units of any size); "unit": only whole units serve.
    step_nodes = dict.fromkeys(STAGES, 1) if auto.granularity == "node" else unit_nodes
    node_rate = {"prefill": unit.prefill_tokens_per_s / unit.prefill_nodes,
                 "decode": unit.decode_tokens_per_s / unit.decode_nodes}
    cards_per_node = config.cluster.cards_per_node
    cards_per_unit = {stage: unit_nodes[stage] * cards_per_node for stage in STAGES}
    faults = Faults(fleet.faults, cards_per_unit, cards_per_node, fault_rng)
    spares = sum(fleet.faults.spare_nodes.values())
    if fixed is None:
        first = {"prefill": input_per_s * load[0] / node_rate["prefill"],
                 "decode": input_per_s * load[0] * output_per_input[0] / node_rate["decode"]}
        scaler = Autoscaler(auto, step_nodes, dict.fromkeys(STAGES, 0), reserved=spares)
        scaler.serving = within_quota({stage: scaler.target_nodes(stage, first[stage]) for stage in STAGES},
                                      step_nodes, auto.quota_nodes - spares)
    else:
        nodes, scaler = fixed, None
    price = {stage: card_hour_usd(config, stage) for stage in STAGES}
    spare_nodes = {stage: fleet.faults.spare_nodes.get(stage, 0) for stage in STAGES}
    series = {name: np.zeros(steps) for name in ("prefill", "decode", "held", "wait_prefill", "wait_decode",
                                                  "output", "arrivals")}
    # prompt tokens waiting (re-prefills included), the billable ones among them, the replies they owe, and
    # generated tokens waiting
    backlog = {"prefill": 0.0, "billable": 0.0, "owed": 0.0, "decode": 0.0}
    tokens = {"input_hit": 0.0, "input_miss": 0.0, "output": 0.0}
    revenue = cost = card_hours = requeued = 0.0
    next_decision = 0.0
    last_rate = input_per_s * load[0]
    lead = max(auto.move_s, auto.grow_s)
    interval_steps = max(1, round(auto.interval_s / step_s))
    serving_rate = 0.0  # generated tokens per second last step: sequences in flight x speed
    for index in range(steps):
        now = index * step_s
        arriving = input_per_s * load[index] * step_s if index < arrival else 0.0
        if scaler is not None:
            scaler.advance(now)
            if now >= next_decision:
                # Size for the load one lead time ahead (the trend since the last decision) plus draining the
                # backlog over a few intervals: nodes asked for now serve only after the lead time.
                window = load[max(0, index - interval_steps):max(1, min(index, arrival))]
                rate = input_per_s * window.mean() if index <= arrival else 0.0
                ahead = max(rate, rate + (rate - last_rate) * lead / auto.interval_s)
                last_rate = rate
                drain = 3.0 * max(auto.interval_s, step_s)
                # Capacity out of service (failed cards, restarting units) is replaced too.
                needed = {"prefill": (ahead + backlog["prefill"] / drain) / node_rate["prefill"],
                          "decode": (ahead * output_per_input[min(index, arrival - 1)] + backlog["decode"] / drain)
                          / node_rate["decode"]}
                needed = {stage: value + faults.units_lost(stage, now) * unit_nodes[stage]
                          for stage, value in needed.items()}
                scaler.decide(now, needed)
                next_decision = now + auto.interval_s
            nodes = scaler.serving
            held_by_stage = {stage: nodes[stage] + scaler.incoming(stage) + spare_nodes[stage] for stage in STAGES}
        else:
            held_by_stage = {stage: nodes[stage] + spare_nodes[stage] for stage in STAGES}
        held = sum(held_by_stage.values())
        serving_cards = {stage: nodes[stage] * cards_per_node for stage in STAGES}
        in_flight = serving_rate / fleet.tokens_per_s_per_user
        # A prefill card's failure loses its instance's batch in flight (one prompt per card), recomputed.
        per_card = {"prefill": 1.0, "decode": in_flight / max(serving_cards["decode"], 1)}
        _, lost = faults.step(now, step_s, serving_cards, per_card)
        requeued += sum(lost.values())
        # Re-queued sequences are prefilled again (not billed): a decode sequence's whole context, a prompt.
        backlog["prefill"] += arriving + lost["decode"] * traffic.kv_tokens_per_sequence \
            + lost["prefill"] * traffic.prompt_tokens
        backlog["billable"] += arriving
        backlog["owed"] += arriving * output_per_input[min(index, arrival - 1)]  # replies the prompts will need
        capacity = {stage: max(0.0, _units(nodes[stage], unit_nodes[stage], auto.granularity)
                               - faults.units_lost(stage, now))
                    * (unit.prefill_tokens_per_s if stage == "prefill" else unit.decode_tokens_per_s)
                    for stage in STAGES}
        served = min(backlog["prefill"], capacity["prefill"] * step_s)
        billable = served * backlog["billable"] / backlog["prefill"] if backlog["prefill"] > 0 else 0.0
        owed = backlog["owed"] * billable / backlog["billable"] if backlog["billable"] > 0 else 0.0
        backlog["prefill"] -= served
        backlog["billable"] -= billable
        backlog["owed"] -= owed
        backlog["decode"] += owed
        generated = min(backlog["decode"], capacity["decode"] * step_s)
        backlog["decode"] -= generated
        serving_rate = generated / step_s
        hour = now / 3600.0
        hit = billable * traffic.cache_hit_share
        revenue += revenue_usd(hit, billable - hit, generated, hour, fleet.prices)
        tokens["input_hit"] += hit
        tokens["input_miss"] += billable - hit
        tokens["output"] += generated
        if index < arrival:  # the days are billed; the drain finishes their work (the next day's start)
            card_hours += held * cards_per_node * step_s / 3600.0
            cost += sum(held_by_stage[stage] * price[stage] for stage in STAGES) * cards_per_node * step_s / 3600.0
        for stage in STAGES:
            series[stage][index] = nodes[stage]
            series[f"wait_{stage}"][index] = backlog[stage] / capacity[stage] if capacity[stage] > 0 else math.inf
        series["held"][index] = held
        series["output"][index] = generated
        series["arrivals"][index] = arriving * output_per_input[min(index, arrival - 1)] \
            / traffic.output_tokens_per_request
        if progress is not None and index % 60 == 0:
            progress(min(now, arrival * step_s), arrival * step_s)
    per_request = traffic.output_tokens_per_request
    left = backlog["owed"] + backlog["decode"]
    return FleetRun(
        time_s=np.arange(steps) * step_s,
        nodes={stage: series[stage] for stage in STAGES},
        held=series["held"],
        wait_s={stage: series[f"wait_{stage}"] for stage in STAGES},
        output_tokens=series["output"],
        arrivals=series["arrivals"],
        revenue_usd=revenue,
        cost_usd=cost,
        card_hours=card_hours,
        tokens=tokens,
        requests=float(series["arrivals"].sum()),
        requests_lost=left / per_request,
        requests_requeued=requeued,
        faults=faults,
        autoscaler=scaler,
    )


def _units(nodes: int, unit_nodes: int, granularity: str) -> float:
    """Units of capacity `nodes` nodes give: whole units only, or pro rata."""
    return nodes / unit_nodes if granularity == "node" else float(nodes // unit_nodes)


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-th percentile of `values` counted `weights` times each."""
    if weights.sum() <= 0:
        return math.nan
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(np.searchsorted(cumulative, q / 100.0), len(order) - 1)])


def _waits(run: FleetRun, arrival: int) -> dict:
    """Queue waits (prefill + decode admission) a request arriving at each step meets, over requests."""
    wait = run.wait_s["prefill"][:arrival] + run.wait_s["decode"][:arrival]
    weights = run.arrivals[:arrival]
    return {"queue_wait_p50_s": _weighted_percentile(wait, weights, 50),
            "queue_wait_p99_s": _weighted_percentile(wait, weights, 99),
            "queue_wait_max_s": float(wait.max()) if len(wait) else 0.0}


def _timeline(run: FleetRun, arrival: int, step_s: float) -> dict:
    """Series for the figures: every 10 minutes, at most about 2,000 points."""
    stride = max(1, round(600.0 / step_s), math.ceil(arrival / 2000))
    pick = slice(0, arrival, stride)
    wait = run.wait_s["prefill"] + run.wait_s["decode"]
    return {"hour": (run.time_s[pick] / 3600.0).round(3).tolist(),
            "prefill_nodes": run.nodes["prefill"][pick].tolist(),
            "decode_nodes": run.nodes["decode"][pick].tolist(),
            "nodes_held": run.held[pick].tolist(),
            "queue_wait_s": np.where(np.isfinite(wait[pick]), wait[pick], -1.0).round(3).tolist(),
            "output_tokens_per_s": (run.output_tokens[pick] / step_s).round(1).tolist()}


def fleet_report(config: SimConfig, unit: UnitCapacity, run: FleetRun, fixed: FleetRun | None,
                 wall_s: float) -> dict:
    """The JSON-ready report of a fleet run."""
    fleet = config.fleet
    arrival = _arrival_steps(config)
    held = run.held[:arrival]
    days = fleet.days
    events = run.faults.events
    spare_nodes = sum(fleet.faults.spare_nodes.values())
    report = {
        "mode": "fleet",
        "days": days,
        "cost_usd": run.cost_usd,
        "revenue_usd": run.revenue_usd,
        "revenue_per_card_hour_usd": run.revenue_usd / max(run.card_hours, 1e-9),
        "nodes_mean": float(held.mean()),
        "nodes_peak": float(held.max()),
        "nodes_min": float(held.min()),
        "nodes_prefill_mean": float(run.nodes["prefill"][:arrival].mean()),
        "nodes_decode_mean": float(run.nodes["decode"][:arrival].mean()),
        "requests": run.requests,
        "requests_lost": run.requests_lost,
        "requests_requeued": run.requests_requeued,
        "input_tokens": run.tokens["input_hit"] + run.tokens["input_miss"],
        "input_cache_hit_tokens": run.tokens["input_hit"],
        "output_tokens": run.tokens["output"],
        "card_hours": run.card_hours,
        "card_hour_usd": {stage: card_hour_usd(config, stage) for stage in STAGES},
        **_waits(run, arrival),
        "unit": {"prefill_nodes": unit.prefill_nodes, "prefill_tokens_per_s_per_node":
                 unit.prefill_tokens_per_s / unit.prefill_nodes, "decode_nodes": unit.decode_nodes,
                 "decode_sequences": unit.decode_sequences,
                 "decode_tokens_per_s_per_node": unit.decode_tokens_per_s / unit.decode_nodes,
                 "decode_step_s": unit.decode_step_s},
        "autoscaler": None if run.autoscaler is None else {
            "decisions": len(run.autoscaler.decisions),
            "moves": sum(sum(d.moved.values()) for d in run.autoscaler.decisions),
            "nodes_added": sum(sum(d.grown.values()) for d in run.autoscaler.decisions),
            "nodes_released": sum(sum(d.released.values()) for d in run.autoscaler.decisions),
            "quota_nodes": fleet.autoscaler.quota_nodes},
        "faults": {"handling": fleet.faults.handling, "failures": len(events),
                   "with_spare": sum(event.spare_used for event in events),
                   "spare_nodes": spare_nodes,
                   "spare_cost_usd": sum(fleet.faults.spare_nodes.get(stage, 0) * card_hour_usd(config, stage)
                                         for stage in STAGES) * config.cluster.cards_per_node * days * 24.0},
        "wall_seconds": wall_s,
        "sim_seconds_per_wall_second": days * 86400.0 / max(wall_s, 1e-9),
        "timeline": _timeline(run, arrival, fleet.step_s),
    }
    if fixed is not None:
        report["fixed_split"] = {
            "prefill_nodes": int(fixed.nodes["prefill"][0]), "decode_nodes": int(fixed.nodes["decode"][0]),
            "cost_usd": fixed.cost_usd, "requests_lost": fixed.requests_lost, **_waits(fixed, arrival)}
    return report


def fleet_text(report: dict) -> str:
    """A readable summary of a fleet report."""
    unit = report["unit"]
    lines = [
        f"Fleet run: {report['days']:g} day(s)",
        f"  units: prefill {unit['prefill_nodes']} nodes at {unit['prefill_tokens_per_s_per_node']:,.0f} prompt "
        f"tok/s per node; decode {unit['decode_nodes']} nodes, {unit['decode_sequences']} sequences, "
        f"{unit['decode_tokens_per_s_per_node']:,.0f} tok/s per node",
        f"  nodes: mean {report['nodes_mean']:.1f} (prefill {report['nodes_prefill_mean']:.1f}, decode "
        f"{report['nodes_decode_mean']:.1f}), peak {report['nodes_peak']:.0f}, least {report['nodes_min']:.0f}",
        f"  tokens: {report['input_tokens'] / 1e9:,.1f}B in ({report['input_cache_hit_tokens'] / 1e9:,.1f}B cache "
        f"hits), {report['output_tokens'] / 1e9:,.1f}B out; requests {report['requests']:,.0f}, lost "
        f"{report['requests_lost']:,.0f}, re-queued {report['requests_requeued']:,.0f}",
        f"  money: cost ${report['cost_usd']:,.0f}, revenue ${report['revenue_usd']:,.0f}, "
        f"${report['revenue_per_card_hour_usd']:.2f} per card-hour",
        f"  queue wait p50 {report['queue_wait_p50_s']:.2f} s, p99 {report['queue_wait_p99_s']:.2f} s",
    ]
    fixed = report.get("fixed_split")
    if fixed:
        lines.append(f"  fixed split ({fixed['prefill_nodes']} prefill + {fixed['decode_nodes']} decode nodes): "
                     f"queue wait p50 {fixed['queue_wait_p50_s']:.2f} s, p99 {fixed['queue_wait_p99_s']:.2f} s, "
                     f"cost ${fixed['cost_usd']:,.0f}")
    faults = report["faults"]
    lines.append(f"  faults ({faults['handling']}): {faults['failures']} card failures, {faults['with_spare']} "
                 f"covered by a spare; spares cost ${faults['spare_cost_usd']:,.0f}")
    lines.append(f"  wall {report['wall_seconds']:.1f} s")
    return "\n".join(lines)
