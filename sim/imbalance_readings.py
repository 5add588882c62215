"""Every reading of a decode unit's imbalance at one load: the named metrics over `balance.reading_steps` steps.

A published imbalance that names no level or window (DeepSeek's production decode figure) can be read several ways
off the same served steps (`placement.imbalance_metrics`: per card or node, per step or over windows of steps, per
routing group). This replays the decode unit's synthetic traffic (`sim.engine.decode_balance`: the config's policy,
refits and routing) at a stated load for `balance.reading_steps` scored steps and returns each metric with its noise
floor, so the readings sit side by side with no pick between them, and beside them the yardsticks
(`placement.yardsticks`): the noise floor, the granularity bound, the in-batch bound and, where the traffic's
expected load is known, the expectation oracle.
"""

from dataclasses import dataclass

import numpy as np

from placement.imbalance_metrics import group_metric, named_metrics
from placement.yardsticks import expectation_oracle, trace_yardsticks
from sim.config import SimConfig
from sim.engine.decode_balance import (group_cluster, policy_options, read_routing_trace, served_routing,
                                       served_scores, synthetic_counts_with_expectation)

ORACLE_EVERY = 25  # the readings' expectation oracle refits on the expected load of each 25 steps


@dataclass(frozen=True)
class DecodeReadings:
    """A decode unit's imbalance at one load, read every way, with the yardsticks beside it.

    Attributes:
        metrics: {metric: {"value", "noise_floor", "rows", "definition"}} (`placement.imbalance_metrics`).
        yardsticks: {"noise_floor", "granularity_bound", "granularity_from", "in_batch_bound",
            "expectation_oracle" (None where the expected load is unknown: a routing trace, or policy none; then
            "oracle_why" says so)} (`placement.yardsticks`).
    """

    metrics: dict
    yardsticks: dict


def decode_readings(config: SimConfig, tokens_per_card: float, steps: int | None = None) -> dict:
    """The metrics of `read_decode_unit` (no oracle: the readings alone)."""
    return read_decode_unit(config, tokens_per_card, steps, oracle=False).metrics


def read_decode_unit(config: SimConfig, tokens_per_card: float, steps: int | None = None,
                     oracle: bool = True) -> DecodeReadings:
    """The decode unit (`cluster.decode_cards` cards, `decode_slots_per_card` slots) serving its decode traffic at
    `tokens_per_card` tokens per card a step (a micro-batch's) after a first fit window: `steps` (default
    `balance.reading_steps`) steps of its synthetic traffic, or the steps of `balance.routing_trace` brought to that
    load (pooled or thinned as the capacity curve brings it, `sim.engine.load_imbalance.trace_at_loads`: as many as the
    trace gives), read every way (`group_step` where the model has expert groups), and its yardsticks: with `oracle`,
    the expectation oracle on synthetic traffic (the config's policy refitted every `ORACLE_EVERY` steps on those steps'
    expected load, no lag)."""
    balance = config.balance
    cards = config.cluster.decode_cards
    trace_TLE = read_routing_trace(config)
    expected_TLE = None
    if trace_TLE is not None:
        from sim.engine.load_imbalance import trace_at_loads

        reading = config
        counts_TLE = trace_at_loads(trace_TLE, cards, (max(1, round(tokens_per_card)),), config.model.top_k,
                                    config.seed)[0]
    else:
        total = balance.window + (balance.reading_steps if steps is None else steps)
        reading = config.model_copy(update={"balance": balance.model_copy(update={"steps": max(balance.steps,
                                                                                               total)})})
        counts_TLE, expected_TLE = synthetic_counts_with_expectation(reading, cards, tokens_per_card)
    slots = config.decode_slots_per_card
    scores = served_scores(reading, cards, slots, counts_TLE, node_limited=balance.node_limits)[0]
    held = slice(counts_TLE.shape[0] - scores.imbalance_TL.shape[0], None)
    metrics = named_metrics(scores.loads_TLG, config.cluster.cards_per_node)
    groups = config.model.expert_groups
    if groups > 1:
        metrics["group_step"] = group_metric(np.asarray(counts_TLE[held]), groups)
    cluster = group_cluster(config, cards, slots)
    found = trace_yardsticks(counts_TLE[held], cluster, None if expected_TLE is None else expected_TLE[held])
    yardsticks = {**found, "in_batch_bound": float(scores.lower_bound_TL.mean()), "expectation_oracle": None}
    if expected_TLE is None or balance.policy == "none" or not oracle:
        yardsticks["oracle_why"] = ("the routing trace carries no expected load" if expected_TLE is None else
                                    "policy none places nothing" if balance.policy == "none" else "not asked")
    else:
        served = expectation_oracle(counts_TLE[held], expected_TLE[held], cluster, balance.policy,
                                    served_routing(config), ORACLE_EVERY,
                                    policy_options(config, balance.node_limits))
        yardsticks["expectation_oracle"] = float(served.imbalance_TL.mean())
    return DecodeReadings(metrics, yardsticks)
