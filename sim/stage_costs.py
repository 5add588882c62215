"""What the engine asks the cost model, in the engine's terms: seconds of a prefill batch (disk reads included), of
a decode step, of a vision encode; bytes of a prefix block on disk under each sliding-window design; and decoder
FLOPs of a prompt under each design, for the side-by-side report.

Sliding-window designs, for a prompt whose first `cached` tokens hit the persistent tier:
- "disk": the sliding-window state is stored on disk with every block: nothing is recomputed, and each block
  carries one snapshot of the sliding layers' window besides the other layers' KV;
- "memory": the state lives in server memory for its lifetime; on a miss the last `window_recompute_tokens` cached
  tokens are recomputed through every layer (they rebuild the window when it is no longer than that);
- "recompute": no state is kept: the sliding layers recompute every cached token (approximated, for timing, as that
  many tokens through a share of the layers equal to the sliding layers' share).
"""

import math

from sim.config import SimConfig
from sim.cost_model import (MICRO_BATCHES, decode_step_seconds, kv_cache_read_seconds, max_decode_batch,
                            prefill_seconds, vision_encode_seconds)
from sim.engine.load_imbalance import load_imbalance
from sim.hardware import PROFILES
from sim.speculative import SpeculativeStep, step_cost

MEAN_CONTEXT_FOR_CAPACITY = 4096  # context the HBM budget is sized at (tokens)


def disk_bytes_per_block(config: SimConfig, design: str | None = None) -> float:
    """Bytes one prefix block takes on the persistent tier under `design` (default: the configured one)."""
    model, block = config.model, config.cache.block_tokens
    design = design or config.cache.window_design
    growth = model.kv_bytes_per_token()  # full and compressed layers: what grows with the context
    bytes_per_block = growth * block
    if design == "disk":
        window = model.sliding_window
        bytes_per_block += model.kv_bytes(window) - growth * window  # the sliding layers' window, once per block
    return max(bytes_per_block, 1.0)


def vision_seconds(config: SimConfig, images: int) -> float:
    return vision_encode_seconds(PROFILES[config.hardware.vision], images)


def recompute_equivalent_tokens(config: SimConfig, cached_tokens: int) -> int:
    """Tokens through every layer that cost what recomputing `cached_tokens` in the sliding layers costs."""
    counts = config.model.layer_counts()
    return round(cached_tokens * counts.get("sliding", 0) / config.model.num_layers)


def prefill_batch_seconds(config: SimConfig, records: list) -> tuple[float, float]:
    """(seconds, expert imbalance) of one prefill instance's batch: the cost model's time for the new (and
    recomputed) tokens at the instance's imbalance (`prefill_instance_imbalance`), plus reading the cached prefixes
    from the persistent tier."""
    nodes = config.cluster.prefill_instance_nodes
    new = sum(r.request.input_tokens - r.cached_tokens + r.recomputed_tokens for r in records)
    imbalance = prefill_instance_imbalance(config, new)
    seconds = prefill_seconds_of(config, [r.request.input_tokens for r in records], [r.cached_tokens for r in records],
                                 [r.recomputed_tokens for r in records], nodes=nodes, imbalance=imbalance)
    return seconds, imbalance


def prefill_instance_imbalance(config: SimConfig, new_tokens: int) -> float:
    """Expert imbalance of a prefill instance's batch of `new_tokens`: 1.0 for a one-node instance (taken as
    balanced); else the placement code's under balance.policy at the tokens per card of one of the batch's two
    micro-batches (`sim.engine.load_imbalance`)."""
    nodes = config.cluster.prefill_instance_nodes
    if nodes == 1:
        return 1.0
    cards = nodes * config.cluster.cards_per_node
    slots = math.ceil((config.model.num_routed_experts + prefill_redundant_experts(config)) / cards)
    return load_imbalance(config, cards, slots, "prefill").at(new_tokens / cards / MICRO_BATCHES)


def prefill_redundant_experts(config: SimConfig) -> int:
    """Expert replicas of a multi-node prefill instance beyond one per expert (none under balance.policy none)."""
    return 0 if config.balance.policy == "none" else config.capacity.prefill_redundant_experts


def prefill_seconds_of(config: SimConfig, input_tokens: list[int], cached_tokens: list[int],
                       recomputed_tokens: list[int], nodes: int, imbalance: float = 1.0,
                       redundant_experts: int | None = None) -> float:
    """Seconds of a prefill batch on an instance of `nodes` nodes: prompts of `input_tokens`, of which
    `cached_tokens` hit the persistent tier (read at disk_read_gb_s per node) and `recomputed_tokens` of those are
    computed again (the window's tail, or the sliding layers under "recompute"), the routed experts at `imbalance`
    with `redundant_experts` replicas (None: the instance's when it spans nodes, none for a node alone), each expert
    group on one node under capacity.prefill_node_limits."""
    new = [total - cached + again for total, cached, again in zip(input_tokens, cached_tokens, recomputed_tokens)]
    kept = [max(0, cached - again) for cached, again in zip(cached_tokens, recomputed_tokens)]
    redundant = redundant_experts if redundant_experts is not None else \
        (prefill_redundant_experts(config) if nodes > 1 else 0)
    compute = prefill_seconds(config.model, PROFILES[config.hardware.prefill], nodes * config.cluster.cards_per_node,
                              new, kept, moe_imbalance=imbalance, redundant_experts=redundant,
                              node_limited=config.capacity.prefill_node_limits and nodes > 1).total_s
    read_bytes = sum(cached_tokens) / config.cache.block_tokens * disk_bytes_per_block(config)
    return compute + kv_cache_read_seconds(read_bytes, config.cache.disk_read_gb_s * nodes)


def decoder_flops_by_design(config: SimConfig, input_tokens: int, cached_tokens: int,
                            window_hit: bool) -> dict[str, float]:
    """Prefill FLOPs in decoder layers of one prompt under each design, and "none" (no cache: all recomputed)."""
    model = config.model
    fresh = model.prefill_flops(input_tokens - cached_tokens, cached_tokens).total
    tail = min(config.cache.window_recompute_tokens, cached_tokens)
    memory_extra = 0.0 if window_hit or not tail else model.prefill_flops(tail, cached_tokens - tail).total
    sliding_share = model.layer_counts().get("sliding", 0) / model.num_layers
    recompute_extra = sliding_share * model.prefill_flops(cached_tokens, 0).total if cached_tokens else 0.0
    return {"none": model.prefill_flops(input_tokens, 0).total, "disk": fresh, "memory": fresh + memory_extra,
            "recompute": fresh + recompute_extra}


def decode_kv_capacity_tokens(config: SimConfig) -> int:
    """KV tokens one decode unit's HBM holds after the weights."""
    sequences = max_decode_batch(config.model, PROFILES[config.hardware.decode], config.cluster.decode_cards,
                                 MEAN_CONTEXT_FOR_CAPACITY, redundant_experts=redundant_experts(config))
    return max(1, sequences * MEAN_CONTEXT_FOR_CAPACITY)


def decode_step(config: SimConfig, batch_size: int, kv_tokens: float, imbalance: float,
                tokens_per_sequence: float = 1.0) -> tuple[float, float]:
    """(seconds, MoE share of the step) of one decode step of a unit, each sequence running `tokens_per_sequence`
    tokens (1 + mean draft tokens verified under speculative decoding; the draft's own passes are not included)."""
    cost = decode_step_seconds(config.model, PROFILES[config.hardware.decode], config.cluster.decode_cards,
                               batch_size, kv_tokens, moe_imbalance=imbalance,
                               tokens_per_sequence=tokens_per_sequence, redundant_experts=redundant_experts(config))
    return cost.total_s, cost.moe_share


def speculative_decode_step(config: SimConfig, step: SpeculativeStep, batch_size: int, kv_tokens: float,
                            imbalance: float) -> tuple[float, float]:
    """(seconds, MoE share) of one speculative decode step of a unit under `step`: the target's pass over
    1 + verified tokens per sequence plus the draft's passes (`sim.speculative.step_cost`)."""
    cost = step_cost(config.speculative, step, config.model, PROFILES[config.hardware.decode],
                     config.cluster.decode_cards, batch_size, kv_tokens, moe_imbalance=imbalance,
                     redundant_experts=redundant_experts(config))
    return cost.total_s, cost.moe_share


def redundant_experts(config: SimConfig) -> int:
    """Expert replicas a decode unit holds beyond one per expert: balance.slots_per_card (default E / cards + 1)
    slots on every card, none without a balancing policy."""
    if config.balance.policy == "none":
        return 0
    return max(0, config.cluster.decode_cards * config.decode_slots_per_card - config.model.num_routed_experts)
