"""The fleet run: days of a whole serving fleet, step by step on token rates, from units costed in detail.

The units' rates come from `sim.fleet.unit_capacity` (the detailed run's cost model at the traffic's operating
point); each pass over the steps is `sim.fleet.steps.run_pass`, its report `sim.fleet.report`. With the autoscaler
on, the same traffic then runs through a fixed split holding the same node-hours, for comparison (its failures are
drawn anew: they follow the cards in service). With `fleet.store` the traffic's cache hit share is the prefix
store's in steady state (`sim.fleet.prefix_store`), reported with its first week from empty; with
`fleet.store.start_empty` each day runs at the store's hit share on that day from empty.
"""

import math
import time
from collections.abc import Callable

from sim.config import SimConfig
from sim.fleet.autoscaler import STAGES
from sim.fleet.prefix_store import fleet_store, store_report, with_hit_share
from sim.fleet.report import fleet_report
from sim.fleet.steps import FleetRun, arrival_steps, run_pass
from sim.fleet.unit_capacity import UnitCapacity, unit_capacity
from sim.work_budget import check_fleet_work


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
    steady, from_empty = fleet_store(config)
    if steady is not None:  # the store's steady hit share replaces the traffic's given one
        config = with_hit_share(config, steady.hit_share)
    report = _run(config, progress, began)
    if steady is not None:
        report["prefix_store"] = {**store_report(steady, from_empty), "start_empty": config.fleet.store.start_empty}
    return report


def _run(config: SimConfig, progress: Callable[[float, float], None] | None, began: float) -> dict:
    """run_fleet's passes and report, its traffic's hit share settled."""
    unit = unit_capacity(config)
    auto = config.fleet.autoscaler
    step = dict.fromkeys(STAGES, 1) if auto.granularity == "node" else {"prefill": unit.prefill_nodes,
                                                                          "decode": unit.decode_nodes}
    configured = _configured_split(config, step)
    if not auto.enabled:
        run = run_pass(config, unit, fixed=configured, progress=progress)
        return fleet_report(config, unit, run, None, time.perf_counter() - began)
    scaled = run_pass(config, unit, fixed=None, progress=progress)
    arrival = arrival_steps(config)
    same_node_hours = {stage: configured[stage] or _whole_units(scaled.nodes[stage][:arrival].mean(), step[stage])
                       for stage in STAGES}
    fixed = run_pass(config, unit, fixed=same_node_hours, progress=None)
    report = fleet_report(config, unit, scaled, fixed, time.perf_counter() - began)
    if config.fleet.compare_policies:
        _compare_policies(config, report, unit, scaled)
        report["wall_seconds"] = time.perf_counter() - began
    return report


def _compare_policies(config: SimConfig, report: dict, unit: UnitCapacity, scaled: FleetRun) -> None:
    """Add `policies` (nodes, cost and the units' imbalance and rates under each of fleet.compare_policies, the same
    traffic autoscaled) and, with cpsat and deepseek both there, `cost_saved_usd_per_day` (deepseek's cost per day
    less cpsat's) to `report`."""
    policies = {}
    for policy in config.fleet.compare_policies:
        units, run = unit, scaled  # the configured policy's run is the report's own
        if policy != config.balance.policy:
            other = config.model_copy(update={"balance": config.balance.model_copy(update={"policy": policy})})
            units = unit_capacity(other)
            run = run_pass(other, units, fixed=None, progress=None)
        held = run.held[:arrival_steps(config)]
        policies[policy] = {"nodes_mean": float(held.mean()), "nodes_peak": float(held.max()),
                            "cost_usd": run.cost_usd, "decode_imbalance": units.decode_imbalance,
                            "prefill_imbalance": units.prefill_imbalance,
                            "decode_tokens_per_s_per_node": units.decode_tokens_per_s / units.decode_nodes,
                            "prefill_tokens_per_s_per_node": units.prefill_tokens_per_s / units.prefill_nodes}
    report["policies"] = policies
    if "cpsat" in policies and "deepseek" in policies:
        report["cost_saved_usd_per_day"] = (policies["deepseek"]["cost_usd"] - policies["cpsat"]["cost_usd"]) \
            / config.fleet.days


def _configured_split(config: SimConfig, step: dict[str, int]) -> dict[str, int | None]:
    """The configured fixed split's nodes per stage (None where not set), once the quota is known to hold the
    stages' minimums and the spares and the split is made of whole `step`-node units.

    Raises:
        ValueError: as `run_fleet` says.
    """
    auto = config.fleet.autoscaler
    spares = sum(config.fleet.faults.spare_nodes.values())
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
    return configured


def _whole_units(nodes: float, unit_nodes: int) -> int:
    """The fewest whole units (at least one) holding `nodes` nodes, in nodes."""
    return max(1, math.ceil(nodes / unit_nodes - 1e-9)) * unit_nodes
