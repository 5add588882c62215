"""What one prefill instance and one decode EP unit deliver at the traffic's operating point: capacity mode
(`sim.capacity`) at the fleet's prompt, cache hits, context and per-user speed.

- Prefill: an instance of `fleet.prefill_instance_nodes` nodes, batches of mean prompts (the cached share read
  from the persistent tier, as in the detailed run) as large as `cluster.max_prefill_batch_tokens` allows; its rate
  counts every prompt token, hits included (as DeepSeek's published per-node rate does).
- Decode: a unit of `cluster.decode_cards` cards holds the most sequences of `kv_tokens_per_sequence` context whose
  time per output token meets the per-user speed (under `speculative` when enabled: a step yields 1 + accepted
  draft tokens), whose caches fit its HBM and which the batch cap admits; its rate is that many sequences times the
  speed (as DeepSeek's published per-node rate at its per-user speed).

Both take their expert imbalance from the placement code under `balance.policy` at the batch found (as in capacity
mode), unless `fleet.decode_imbalance` / `fleet.prefill_imbalance` fix it. The rates a fleet plans with are day
averages: each unit's capacity times the declared calibration's `utilisation.day` (the share of its capacity a
deployed node delivered over DeepSeek's published day), since a node in service does not run at capacity all day.
"""

from dataclasses import dataclass

from sim.calibration import fitted
from sim.capacity import decode_capacity, prefill_capacity
from sim.config import SimConfig


@dataclass(frozen=True)
class UnitCapacity:
    """Rates of one unit of each stage (tokens per second of simulated time)."""

    prefill_nodes: int  # nodes per prefill instance
    prefill_tokens_per_s: float  # prompt tokens per second of one instance over a day, hits included
    decode_nodes: int  # nodes per decode unit
    decode_sequences: int  # sequences one decode unit serves at the per-user speed, at capacity
    decode_tokens_per_s: float  # generated tokens per second of one decode unit over a day
    decode_step_s: float  # its step at that batch
    decode_imbalance: float = 1.0  # the decode units' expert imbalance at that batch
    prefill_imbalance: float = 1.0  # the prefill instances' at theirs
    utilisation: float = 1.0  # the day's share of capacity the token rates above include (utilisation.day)


def unit_capacity(config: SimConfig) -> UnitCapacity:
    """Both stages' unit rates for `config.fleet` (which must be set).

    Raises:
        ValueError: the decode unit is not whole nodes, or one sequence already misses the per-user speed.
    """
    fleet, cluster = config.fleet, config.cluster
    traffic = fleet.traffic
    decode_cards = cluster.decode_cards
    if decode_cards % cluster.cards_per_node:
        raise ValueError(f"cluster.decode_cards={decode_cards} is not a whole number of "
                         f"{cluster.cards_per_node}-card nodes; the fleet moves whole nodes")
    point = config.capacity.model_copy(update={
        "prompt_tokens": max(1, round(traffic.prompt_tokens)), "prompt_length_spread": traffic.prompt_length_spread,
        "cached_share": min(traffic.cache_hit_share, 0.999),
        "prefill_instance_nodes": fleet.prefill_instance_nodes, "ttft_slo_s": None, "decode_batch_per_card": None,
        "decode_context_tokens": max(1, round(traffic.kv_tokens_per_sequence)),
        "tpot_slo_ms": 1000.0 / fleet.tokens_per_s_per_user})
    at = config.model_copy(update={"capacity": point})
    try:
        prefill = prefill_capacity(at, fleet.prefill_imbalance)
        decode = decode_capacity(at, fleet.decode_imbalance)
    except ValueError as exc:  # capacity mode names its own keys; here they come from the fleet's traffic
        raise ValueError(f"the fleet's units (fleet.traffic.kv_tokens_per_sequence={traffic.kv_tokens_per_sequence:g}, "
                         f"prompt_tokens={traffic.prompt_tokens:g}; capacity.* set from them): {exc}") from exc
    if decode["sequences"] < 1 or decode["tpot_ms"] > point.tpot_slo_ms * (1 + 1e-9):
        raise ValueError(f"one sequence per decode unit already misses fleet.tokens_per_s_per_user="
                         f"{fleet.tokens_per_s_per_user}; lower it or use faster cards")
    day = fitted("utilisation.day")
    return UnitCapacity(
        prefill_nodes=fleet.prefill_instance_nodes,
        prefill_tokens_per_s=prefill["tokens_per_s_per_card"] * prefill["cards"] * day,
        decode_nodes=decode_cards // cluster.cards_per_node,
        decode_sequences=decode["sequences"],
        decode_tokens_per_s=decode["sequences"] * fleet.tokens_per_s_per_user * day,
        decode_step_s=decode["step_ms"] / 1000.0,
        decode_imbalance=decode["imbalance"],
        prefill_imbalance=prefill["imbalance"],
        utilisation=day,
    )
