"""The fleet run's report: one JSON-ready dict (nodes, tokens, money, queue waits, faults, the timeline for the
figures, and the fixed split beside the autoscaled run) and its text form.

Legend: T time steps of a pass (the days' arrival steps, then the drain).
"""

import math

import numpy as np

from sim.config import SimConfig
from sim.fleet.autoscaler import STAGES
from sim.fleet.economics import card_hour_usd
from sim.fleet.steps import FleetRun, arrival_steps
from sim.fleet.unit_capacity import UnitCapacity

TIMELINE_STEP_S = 600.0  # the figures' series: a point every 10 minutes ...
TIMELINE_POINTS = 2000  # ... and at most about this many points


def fleet_report(config: SimConfig, unit: UnitCapacity, run: FleetRun, fixed: FleetRun | None,
                 wall_s: float) -> dict:
    """The JSON-ready report of a fleet run: the autoscaled (or only) pass `run`, and the fixed split `fixed` of the
    same node-hours when there is one."""
    fleet = config.fleet
    arrival = arrival_steps(config)
    held = run.held[:arrival]
    days = fleet.days
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
        "unit": _unit(unit),
        "autoscaler": _autoscaler(run, fleet.autoscaler.quota_nodes),
        "faults": _faults(config, run),
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
    for policy, figures in report.get("policies", {}).items():
        lines.append(f"  under {policy}: decode imbalance {figures['decode_imbalance']:.3f}, "
                     f"{figures['decode_tokens_per_s_per_node']:,.0f} tok/s per decode node, nodes mean "
                     f"{figures['nodes_mean']:.1f}, cost ${figures['cost_usd']:,.0f}")
    if "cost_saved_usd_per_day" in report:
        lines.append(f"  cpsat saves ${report['cost_saved_usd_per_day']:,.0f} a day over deepseek")
    faults = report["faults"]
    lines.append(f"  faults ({faults['handling']}): {faults['failures']} card failures, {faults['with_spare']} "
                 f"covered by a spare; spares cost ${faults['spare_cost_usd']:,.0f}")
    lines.append(f"  wall {report['wall_seconds']:.1f} s")
    return "\n".join(lines)


def _unit(unit: UnitCapacity) -> dict:
    """One unit of each stage: its nodes and rates."""
    return {"prefill_nodes": unit.prefill_nodes,
            "prefill_tokens_per_s_per_node": unit.prefill_tokens_per_s / unit.prefill_nodes,
            "decode_nodes": unit.decode_nodes, "decode_sequences": unit.decode_sequences,
            "decode_tokens_per_s_per_node": unit.decode_tokens_per_s / unit.decode_nodes,
            "decode_step_s": unit.decode_step_s, "decode_imbalance": unit.decode_imbalance,
            "prefill_imbalance": unit.prefill_imbalance}


def _autoscaler(run: FleetRun, quota_nodes: int) -> dict | None:
    """What the autoscaler did over the pass (nodes); None for a fixed split."""
    if run.autoscaler is None:
        return None
    decisions = run.autoscaler.decisions
    return {"decisions": len(decisions),
            "moves": sum(sum(d.moved.values()) for d in decisions),
            "nodes_added": sum(sum(d.grown.values()) for d in decisions),
            "nodes_released": sum(sum(d.released.values()) for d in decisions),
            "quota_nodes": quota_nodes}


def _faults(config: SimConfig, run: FleetRun) -> dict:
    """Card failures over the pass, those a spare covered, and what the spares cost over the days."""
    faults, events = config.fleet.faults, run.faults.events
    return {"handling": faults.handling, "failures": len(events),
            "with_spare": sum(event.spare_used for event in events),
            "spare_nodes": sum(faults.spare_nodes.values()),
            "spare_cost_usd": sum(faults.spare_nodes.get(stage, 0) * card_hour_usd(config, stage)
                                  for stage in STAGES) * config.cluster.cards_per_node * config.fleet.days * 24.0}


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
    """Series for the figures over the days: a point every `TIMELINE_STEP_S`, at most about `TIMELINE_POINTS`; an
    infinite wait (no capacity) is written as -1."""
    stride = max(1, round(TIMELINE_STEP_S / step_s), math.ceil(arrival / TIMELINE_POINTS))
    pick = slice(0, arrival, stride)
    wait = run.wait_s["prefill"] + run.wait_s["decode"]
    return {"hour": (run.time_s[pick] / 3600.0).round(3).tolist(),
            "prefill_nodes": run.nodes["prefill"][pick].tolist(),
            "decode_nodes": run.nodes["decode"][pick].tolist(),
            "nodes_held": run.held[pick].tolist(),
            "queue_wait_s": np.where(np.isfinite(wait[pick]), wait[pick], -1.0).round(3).tolist(),
            "output_tokens_per_s": (run.output_tokens[pick] / step_s).round(1).tolist()}
