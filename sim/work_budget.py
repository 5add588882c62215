"""How much work a run would take, estimated from its config before any is done, and the budgets it must fit.

Every config value has a finite range, but values each in range can still describe a run that would not finish or
not fit in memory (a thousand sessions a second for a day, a year of one-second fleet steps). So each run is
estimated up front and refused, with one `SimConfigError` that names the config keys to lower, when it would
exceed a budget:

- the request-level engine (`sim.engine.stages`): its events, `EVENTS_PER_REQUEST` per request plus one per prefill node
  (an arrival wakes every idle node) plus one per decode step, within `MAX_ENGINE_EVENTS`; and its memory (the
  requests, their prefix blocks in the requests and the persistent tier, the per-second timeline, the routing
  trace) within half the machine's (`MEMORY_SHARE`);
- the decode replay (`sim.engine.decode_balance`): the live router's work, steps x layers x expert slots of the unit
  (its water filling runs over every slot of every layer of every step), within `MAX_ROUTED_SLOT_STEPS`; layer
  fits within `MAX_LAYER_FITS`; and cpsat's work budgets within `MAX_SOLVER_UNITS`;
- the fleet run (`sim.fleet.run`): its steps within `MAX_FLEET_STEPS` and its expected card failures within
  `MAX_FLEET_FAILURES`.

The budgets bound a run's wall time and memory on one machine (how they were sized: docs/simulator.md, 'Work
budgets'). Synthetic requests are estimated from the generator's means; a trace's are counted (it is read first:
reading the input is not the work budgeted). Decode steps are estimated as if each step took the one-sequence step time
throughout the arrivals and a few replies after: an upper estimate, since a fuller batch takes longer steps.
"""

import math
import os
from dataclasses import dataclass

from sim import stage_costs
from sim.config import SimConfig, SimConfigError, SyntheticWorkload
from sim.workload import TYPICAL_OUTPUT_TOKENS_PER_S
from traces.request_trace import Request

MAX_ENGINE_EVENTS = 20_000_000  # SimPy events of one run, so that it ends in reasonable wall time
MAX_ROUTED_SLOT_STEPS = 4_000_000  # steps x layers x slots the live router splits during the decode replay
MAX_LAYER_FITS = 500  # refits x layers of the decode replay's policy
MAX_SOLVER_UNITS = 300.0  # refits x balance.work_limit under cpsat
MAX_FLEET_STEPS = 600_000  # steps of one fleet pass: 366 days of minute steps and a drain fit
MAX_FLEET_FAILURES = 500_000  # card failures expected over the fleet run's passes

MEMORY_SHARE = 0.5  # of the machine's memory a run's estimate may take (the estimate is rough)
EVENTS_PER_REQUEST = 4  # arrival, vision, its share of a prefill batch, decode admission
REQUEST_BYTES = 2_000  # a request, its record and its per-design FLOP counts
BLOCK_BYTES = 250  # a prefix block id in its request and its entry in the persistent tier
TIMELINE_SERIES = 5  # per-second float64 series of the engine's timeline
ROUTING_COPIES = 4  # int64 copies of the routing trace the replay holds at once
REPLY_TAIL = 5  # mean replies of decode after the last arrival, in the step estimate


@dataclass(frozen=True)
class EngineWork:
    """The request-level run's estimated size."""

    requests: float
    decode_steps: float
    events: float
    memory_bytes: float


def machine_memory_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def engine_work(config: SimConfig, trace_requests: list[Request] | None,
                routing_shape: tuple[int, int, int]) -> EngineWork:
    """The size of the request-level run of `config` over `trace_requests` (None: synthetic) and a routing trace of
    `routing_shape` (T, L, E)."""
    if trace_requests is None:
        requests, output_tokens, blocks = _synthetic_load(config.workload.synthetic, config.duration_s,
                                                          config.cache.block_tokens)
        arrivals_s = config.duration_s
    else:
        requests = float(len(trace_requests))
        output_tokens = float(sum(r.output_tokens for r in trace_requests))
        blocks = float(sum(len(r.block_hashes) for r in trace_requests))
        arrivals_s = max((r.arrival_s for r in trace_requests), default=0.0)
    step_s = stage_costs.decode_step(config, 1, 1, 1.0)[0]
    busy_s = arrivals_s + REPLY_TAIL * output_tokens / max(requests, 1.0) * step_s
    decode_steps = min(output_tokens, config.cluster.decode_units * busy_s / step_s)
    events = requests * (EVENTS_PER_REQUEST + config.cluster.prefill_nodes) + decode_steps
    horizon_s = config.duration_s * 4 + 3600  # the engine's timeline (sim.engine.stages)
    memory = (requests * REQUEST_BYTES + blocks * BLOCK_BYTES + TIMELINE_SERIES * 8 * horizon_s
              + ROUTING_COPIES * 8 * math.prod(routing_shape))
    return EngineWork(requests, decode_steps, events, memory)


def check_engine_work(config: SimConfig, trace_requests: list[Request] | None,
                      routing_shape: tuple[int, int, int]) -> EngineWork:
    """The run's `EngineWork`, once it is known to fit the budgets.

    Raises:
        SimConfigError: too many events, more memory than the machine has, or a persistent tier smaller than one
            prefix block; the message names the keys to change.
    """
    block_bytes = stage_costs.disk_bytes_per_block(config)
    if config.cache.disk_capacity_tb * 1e12 < block_bytes:
        raise SimConfigError(f"cache.disk_capacity_tb={config.cache.disk_capacity_tb:g} holds no prefix block "
                             f"({block_bytes / 1e12:.3g} TB each at cache.block_tokens={config.cache.block_tokens}); "
                             f"raise cache.disk_capacity_tb or lower cache.block_tokens")
    work = engine_work(config, trace_requests, routing_shape)
    lower = ("workload.time_scale or duration_s" if trace_requests is not None
             else "workload.synthetic.sessions_per_s or duration_s")
    if work.events > MAX_ENGINE_EVENTS:
        also = ("cluster.decode_units" if work.decode_steps > work.events / 2 else "cluster.prefill_nodes")
        raise SimConfigError(
            f"this run would take about {work.events:,.0f} events ({work.requests:,.0f} requests, "
            f"{work.decode_steps:,.0f} decode steps; budget {MAX_ENGINE_EVENTS:,}): lower {lower} (or {also}); "
            f"a config with a fleet section simulates days of a whole fleet")
    memory = MEMORY_SHARE * machine_memory_bytes()
    if work.memory_bytes > memory:
        raise SimConfigError(
            f"this run would need about {work.memory_bytes / 2**30:,.1f} GiB ({work.requests:,.0f} requests; a run "
            f"may take {memory / 2**30:,.1f} GiB, half this machine's): lower {lower}, or raise cache.block_tokens "
            f"(fewer prefix blocks per prompt)")
    return work


def check_replay_work(config: SimConfig, routing_shape: tuple[int, int, int]) -> None:
    """Refuse a decode replay of a routing trace of `routing_shape` (T, L, E) over the budgets.

    Raises:
        SimConfigError: too much routing, too many layer fits or cpsat seconds; the message names the keys to
            change.
    """
    balance = config.balance
    if balance.policy == "none":
        return  # one placement, scored at once
    steps, layers, _ = routing_shape
    served = steps - min(balance.window, steps // 2)
    fits = math.ceil(served / balance.refit_every)
    slots = config.cluster.decode_cards * config.decode_slots_per_card
    shorter = ("use a shorter balance.routing_trace" if balance.routing_trace is not None
               else "lower balance.steps or balance.layers")
    if served * layers * slots > MAX_ROUTED_SLOT_STEPS:
        raise SimConfigError(f"the decode replay would route {served * layers * slots:,} slot-steps ({served:,} "
                             f"steps x {layers} layers x {slots:,} expert slots; budget {MAX_ROUTED_SLOT_STEPS:,}): "
                             f"{shorter}, or the slots (cluster.decode_cards, balance.slots_per_card)")
    if fits * layers > MAX_LAYER_FITS:
        raise SimConfigError(f"the decode replay would fit {fits * layers:,} layers ({fits:,} refits x {layers} "
                             f"layers; budget {MAX_LAYER_FITS:,}): raise balance.refit_every, or {shorter}")
    if balance.policy == "cpsat" and fits * balance.work_limit > MAX_SOLVER_UNITS:
        raise SimConfigError(f"the decode replay would give cpsat up to {fits * balance.work_limit:,.0f} work units "
                             f"({fits:,} refits x balance.work_limit={balance.work_limit:g}; budget "
                             f"{MAX_SOLVER_UNITS:,.0f}): lower balance.work_limit or raise balance.refit_every")


def check_fleet_work(config: SimConfig) -> None:
    """Refuse a fleet run of `config` (its `fleet` set) over the budgets.

    Raises:
        SimConfigError: too many steps or card failures; the message names the keys to change.
    """
    fleet = config.fleet
    steps = math.ceil(fleet.days * 86400.0 / fleet.step_s) + math.ceil(fleet.drain_s / fleet.step_s)
    if steps > MAX_FLEET_STEPS:
        raise SimConfigError(f"this fleet run would take {steps:,} steps (budget {MAX_FLEET_STEPS:,}): raise "
                             f"fleet.step_s={fleet.step_s:g}, or lower fleet.days={fleet.days:g} or "
                             f"fleet.drain_s={fleet.drain_s:g}")
    auto, faults = fleet.autoscaler, fleet.faults
    passes = 2 if auto.enabled else 1  # the autoscaled run, then the fixed split of the same node-hours
    fixed = (auto.fixed_prefill_nodes or 0) + (auto.fixed_decode_nodes or 0)
    cards = max(auto.quota_nodes, fixed) * config.cluster.cards_per_node
    hours = steps * fleet.step_s / 3600.0
    failures = faults.card_failures_per_hour * faults.failure_multiplier * cards * hours * passes
    if failures > MAX_FLEET_FAILURES:
        raise SimConfigError(
            f"this fleet run would draw about {failures:,.0f} card failures ({cards:,} cards at most over "
            f"{hours:,.0f} h, {passes} pass(es); budget {MAX_FLEET_FAILURES:,}): lower "
            f"fleet.faults.card_failures_per_hour or fleet.faults.failure_multiplier, or fleet.days")


def _synthetic_load(workload: SyntheticWorkload, duration_s: float, block_tokens: int) -> tuple[float, float, float]:
    """(requests, output tokens, prefix blocks) the generator is expected to make: sessions at the peak rate, each
    with its class's mean turns, fewer when the turns' spacing (reply and think time) does not fit the arrivals."""
    peak = 1 + min(1.0, workload.daily_peak_to_mean - 1) if workload.daily_curve else 1.0
    sessions = workload.sessions_per_s * duration_s * peak
    requests = output_tokens = blocks = 0.0
    for kind, share in (("chat", 1 - workload.agent_share), ("agent", workload.agent_share)):
        reply = workload.output_tokens[kind]
        spacing_s = reply / TYPICAL_OUTPUT_TOKENS_PER_S + workload.think_time_s[kind]
        turns = min(workload.turns_mean[kind], 1 + duration_s / 2 / spacing_s)
        count = sessions * share * turns
        prompt = workload.first_input_tokens[kind] + (turns - 1) / 2 * (workload.turn_input_tokens[kind] + reply)
        requests += count
        output_tokens += count * reply
        blocks += count * (prompt / block_tokens + 1)
    return requests, output_tokens, blocks
