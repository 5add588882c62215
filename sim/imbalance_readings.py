"""Every reading of a decode unit's imbalance at one load: the named metrics over at least 1,000 scored steps.

A published imbalance that names no level or window (DeepSeek's production decode figure) can be read several ways
off the same served steps (`placement.imbalance_metrics`: per card or node, per step or over windows of steps, per
routing group). This replays the decode unit's synthetic traffic (`sim.engine.decode_balance`: the config's
policy, refits and routing) at a stated load for `READING_STEPS` scored steps and returns each metric with its noise
floor, so the readings sit side by side with no pick between them.
"""

import numpy as np

from placement.imbalance_metrics import group_metric, named_metrics
from sim.config import SimConfig
from sim.engine.decode_balance import read_routing_trace, served_scores, synthetic_counts

READING_STEPS = 1000  # scored steps behind each reading (the 1,000-step window needs them all)


def decode_readings(config: SimConfig, tokens_per_card: float, steps: int | None = None) -> dict:
    """{metric: {"value", "noise_floor", "rows", "definition"}} of the decode unit (`cluster.decode_cards` cards,
    `decode_slots_per_card` slots) serving its decode traffic at `tokens_per_card` tokens per card a step (a
    micro-batch's) after a first fit window: `steps` (default `READING_STEPS`) steps of its synthetic traffic, or
    the steps of `balance.routing_trace` brought to that load (pooled or thinned as the capacity curve brings it,
    `sim.engine.load_imbalance.trace_at_loads`: as many as the trace gives); `group_step` where the model has expert
    groups."""
    balance = config.balance
    cards = config.cluster.decode_cards
    trace_TLE = read_routing_trace(config)
    if trace_TLE is not None:
        from sim.engine.load_imbalance import trace_at_loads

        reading = config
        counts_TLE = trace_at_loads(trace_TLE, cards, (max(1, round(tokens_per_card)),), config.model.top_k,
                                    config.seed)[0]
    else:
        total = balance.window + (READING_STEPS if steps is None else steps)
        reading = config.model_copy(update={"balance": balance.model_copy(update={"steps": max(balance.steps,
                                                                                               total)})})
        counts_TLE = synthetic_counts(reading, cards, tokens_per_card)
    scores = served_scores(reading, cards, config.decode_slots_per_card, counts_TLE,
                           node_limited=balance.node_limits)[0]
    metrics = named_metrics(scores.loads_TLG, config.cluster.cards_per_node)
    groups = config.model.expert_groups
    if groups > 1:
        metrics["group_step"] = group_metric(np.asarray(counts_TLE[-scores.imbalance_TL.shape[0]:]), groups)
    return metrics
