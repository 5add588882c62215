"""What one prefill instance and one decode EP unit deliver at the traffic's operating point, from the functions
the detailed run times every batch and step with (`sim.stage_costs`, imported).

- Prefill: an instance of `prefill_instance_nodes` nodes runs one mean prompt per card per batch, the cached share
  read from the persistent tier rather than computed (the read costs time, as in the detailed run; the window
  state is taken to be found); its rate counts every prompt token, hits included (as DeepSeek's published
  per-node rate does).
- Decode: a unit of `cluster.decode_cards` cards holds the most sequences whose step still meets the per-user
  speed (one step per 1 / tokens_per_s_per_user seconds), whose caches fit its HBM when each reserves its final
  context (prompt + reply, as the detailed run's admission does) and which the batch cap
  (`cluster.max_decode_batch_per_card`) admits, at the fleet's `decode_imbalance`; its rate is that many
  sequences times the speed (as DeepSeek's published per-node rate at its per-user speed).

(DeepSeek's rates: docs/simulator.md, 'Fleet calibration'.)
"""

from dataclasses import dataclass

from sim import stage_costs
from sim.config import SimConfig


@dataclass(frozen=True)
class UnitCapacity:
    """Rates of one unit of each stage (tokens per second of simulated time)."""

    prefill_nodes: int  # nodes per prefill instance
    prefill_tokens_per_s: float  # prompt tokens per second of one instance, hits included
    decode_nodes: int  # nodes per decode unit
    decode_sequences: int  # sequences one decode unit serves at the per-user speed
    decode_tokens_per_s: float  # generated tokens per second of one decode unit
    decode_step_s: float  # its step at that batch


def unit_capacity(config: SimConfig) -> UnitCapacity:
    """Both stages' unit rates for `config.fleet` (which must be set)."""
    fleet, cluster = config.fleet, config.cluster
    traffic = fleet.traffic
    nodes = fleet.prefill_instance_nodes
    prompts = nodes * cluster.cards_per_node  # one mean prompt per card
    prompt = max(1, round(traffic.prompt_tokens))
    cached = min(round(prompt * traffic.cache_hit_share), prompt - 1)  # the last token is always computed
    batch = stage_costs.prefill_seconds_of(config, [prompt] * prompts, [cached] * prompts, [0] * prompts, nodes)
    decode_cards = cluster.decode_cards
    if decode_cards % cluster.cards_per_node:
        raise ValueError(f"cluster.decode_cards={decode_cards} is not a whole number of "
                         f"{cluster.cards_per_node}-card nodes; the fleet moves whole nodes")
    sequences, step = _most_sequences(config)
    return UnitCapacity(
        prefill_nodes=fleet.prefill_instance_nodes,
        prefill_tokens_per_s=prompt * prompts / batch,
        decode_nodes=decode_cards // cluster.cards_per_node,
        decode_sequences=sequences,
        decode_tokens_per_s=sequences * fleet.tokens_per_s_per_user,
        decode_step_s=step,
    )


def _most_sequences(config: SimConfig) -> tuple[int, float]:
    """The largest batch of a decode unit whose step meets the per-user speed and whose caches fit, by bisection
    (step time grows with the batch), and its step seconds."""
    fleet, cards = config.fleet, config.cluster.decode_cards
    context = fleet.traffic.kv_tokens_per_sequence
    budget = 1.0 / fleet.tokens_per_s_per_user
    final = fleet.traffic.prompt_tokens + fleet.traffic.output_tokens_per_request  # reserved at admission
    fits = min(stage_costs.decode_kv_capacity_tokens(config) // max(1, round(final)),
               config.cluster.max_decode_batch_per_card * cards)

    def step(batch: int) -> float:
        return stage_costs.decode_step(config, batch, round(batch * context), fleet.decode_imbalance)[0]

    low, high = 0, max(1, int(fits))
    if step(high) <= budget:
        return high, step(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if step(middle) <= budget else (low, middle)
    if low == 0:
        raise ValueError(f"one sequence per decode unit already misses fleet.tokens_per_s_per_user="
                         f"{fleet.tokens_per_s_per_user}; lower it or use faster cards")
    return low, step(low)
