"""Capacity at a latency target: per-card decode and prefill tokens/s with the load raised until the target binds,
the quantity every published serving figure is (`eplb sim --capacity`).

- Decode: one EP unit of `cluster.decode_cards` cards, every sequence holding `capacity.decode_context_tokens` of
  context. The batch grows until a step, over the tokens each sequence gains per step (1, or 1 + accepted draft
  tokens under `speculative`), exceeds `capacity.tpot_slo_ms`, or the caches no longer fit HBM after the weights,
  or `cluster.max_decode_batch_per_card` binds; or a fixed `capacity.decode_batch_per_card` (a figure published at
  a stated batch). Tokens/s per card = batch x tokens per step / step / cards.
- Prefill: one instance of `capacity.prefill_instance_nodes` nodes, batches of whole prompts of
  `capacity.prompt_tokens` (the `cached_share` read from the persistent tier at `cache.disk_read_gb_s` per node,
  not computed). The batch grows until it takes longer than `capacity.ttft_slo_s` (the batch's own time; queueing
  ahead of it is not counted) or reaches `cluster.max_prefill_batch_tokens` new tokens per node. Tokens/s per card
  counts every prompt token, hits included, as published prefill rates do.

Both stages take their expert imbalance from this project's placement code at the tokens per card of the batch
found (`sim.engine.decode_balance.imbalance_T`: a synthetic routing trace at the model's shape, replayed through
`balance.policy` with the live router), and the batch is found again at that imbalance until it settles: the
imbalance multiplies the routed experts' part of the pass (and the busiest card's all-to-all bytes) once.
"""

import math

from sim.config import SimConfig
from sim.cost_model import decode_step_seconds, max_decode_batch
from sim.engine.decode_balance import placement_imbalance
from sim.hardware import PROFILES
from sim.speculative import expected_step, step_cost
from sim.stage_costs import prefill_redundant_experts, prefill_seconds_of, redundant_experts

SETTLE_ROUNDS = 4  # batch <-> imbalance rounds; the batch moves by under 1% after two on the shipped configs


def capacity_report(config: SimConfig) -> dict:
    """Both stages' capacity (`decode_capacity`, `prefill_capacity`) and the settings they ran under."""
    capacity = config.capacity
    return {"decode": decode_capacity(config), "prefill": prefill_capacity(config),
            "settings": {**capacity.model_dump(), "balance_policy": config.balance.policy,
                         "decode_card": config.hardware.decode, "prefill_card": config.hardware.prefill,
                         "speculative": config.speculative.enabled}}


def decode_capacity(config: SimConfig, imbalance: float | None = None) -> dict:
    """The largest decode batch of one unit that meets the TPOT target and fits; its per-card rate and step.
    `imbalance` fixes the expert imbalance instead of settling it with the placement code (the refit's inner
    search, `sim.validation`)."""
    cards, context = config.cluster.decode_cards, config.capacity.decode_context_tokens
    slo_s = config.capacity.tpot_slo_ms / 1000.0
    fits = max_decode_batch(config.model, PROFILES[config.hardware.decode], cards, context,
                            redundant_experts=redundant_experts(config))
    cap = config.cluster.max_decode_batch_per_card * cards
    most = min(fits, cap)
    if most < 1:
        raise ValueError(f"a decode unit of cluster.decode_cards={cards} {config.hardware.decode} cards holds no "
                         f"sequence of capacity.decode_context_tokens={context} after the weights; use more cards or "
                         f"a shorter context")
    tokens_per_step, verified = _tokens_per_step(config)
    fixed = config.capacity.decode_batch_per_card
    if fixed is not None and round(fixed * cards) > fits:
        raise ValueError(f"capacity.decode_batch_per_card={fixed:g} sequences of {context} tokens do not fit the "
                         f"unit's HBM after the weights ({fits / cards:.1f} per card do); lower it or the context")
    settle = imbalance is None
    imbalance, batch = (1.0 if settle else imbalance), most
    for _ in range(SETTLE_ROUNDS):
        batch = max(1, round(fixed * cards)) if fixed is not None else \
            _largest(lambda b: decode_tpot(config, b, imbalance)[0] <= slo_s, most)
        if batch == 0 or not settle:
            break
        settled = placement_imbalance(config, cards, config.decode_slots_per_card, max(batch, 1) * verified / cards)
        if abs(settled - imbalance) < 1e-4:
            break
        imbalance = settled
    tpot, step = decode_tpot(config, max(batch, 1), imbalance)
    binding = "tpot_slo" if batch < most else ("kv_cache" if fits <= cap else "max_decode_batch_per_card")
    if fixed is not None:
        binding = "fixed_batch"
    return {"tokens_per_s_per_card": batch * tokens_per_step / step / cards if batch else 0.0,
            "batch_per_card": batch / cards, "sequences": batch, "step_ms": 1000 * step, "tpot_ms": 1000 * tpot,
            "tokens_per_step": tokens_per_step, "imbalance": imbalance, "binding": binding if batch else "tpot_slo",
            "cards": cards, "context_tokens": context}


def prefill_capacity(config: SimConfig, imbalance: float | None = None) -> dict:
    """The largest prefill batch of one instance within the TTFT target (or the batch cap); its per-card rate.
    `imbalance` fixes the expert imbalance instead of settling it with the placement code."""
    capacity, cluster, model = config.capacity, config.cluster, config.model
    nodes = capacity.prefill_instance_nodes
    cards = nodes * cluster.cards_per_node
    prompt = capacity.prompt_tokens
    cached = min(round(prompt * capacity.cached_share), prompt - 1)  # the last token is always computed
    most = max(1, cluster.max_prefill_batch_tokens * nodes // (prompt - cached))  # whole prompts
    redundant = prefill_redundant_experts(config)
    slots = math.ceil((model.num_routed_experts + redundant) / cards)
    limit = capacity.ttft_slo_s if capacity.ttft_slo_s is not None else math.inf
    settle = imbalance is None
    imbalance, prompts = (1.0 if settle else imbalance), most
    for _ in range(SETTLE_ROUNDS):
        prompts = _largest(lambda n: _prefill_seconds(config, n, prompt, cached, cards, imbalance) <= limit, most)
        if prompts == 0 or not settle:
            break
        settled = placement_imbalance(config, cards, slots, prompts * (prompt - cached) / cards)
        if abs(settled - imbalance) < 1e-4:
            break
        imbalance = settled
    seconds = _prefill_seconds(config, max(prompts, 1), prompt, cached, cards, imbalance)
    binding = "ttft_slo" if prompts < most else "max_prefill_batch_tokens"
    return {"tokens_per_s_per_card": prompts * prompt / seconds / cards if prompts else 0.0,
            "prompts_per_batch": prompts, "new_tokens_per_card": prompts * (prompt - cached) / cards,
            "batch_s": seconds, "imbalance": imbalance, "binding": binding, "cards": cards,
            "redundant_experts": redundant, "prompt_tokens": prompt, "cached_tokens": cached}


def _tokens_per_step(config: SimConfig) -> tuple[float, float]:
    """(tokens a sequence gains per step, tokens it runs through the target per step)."""
    if not config.speculative.enabled:
        return 1.0, 1.0
    step = expected_step(config.speculative, config.seed)
    return step.tokens_per_step, 1.0 + step.verified_per_step


def decode_tpot(config: SimConfig, batch: int, imbalance: float) -> tuple[float, float]:
    """(seconds per output token, step seconds) of a unit's decode step of `batch` sequences."""
    hardware, cards = PROFILES[config.hardware.decode], config.cluster.decode_cards
    kv_tokens = batch * config.capacity.decode_context_tokens
    redundant = redundant_experts(config)
    if config.speculative.enabled:
        cost = step_cost(config.speculative, expected_step(config.speculative, config.seed), config.model,
                         hardware, cards, batch, kv_tokens, moe_imbalance=imbalance, redundant_experts=redundant)
        return cost.total_s / cost.step.tokens_per_step, cost.total_s
    step = decode_step_seconds(config.model, hardware, cards, batch, kv_tokens, imbalance,
                               redundant_experts=redundant).total_s
    return step, step


def _prefill_seconds(config: SimConfig, prompts: int, prompt: int, cached: int, cards: int,
                     imbalance: float) -> float:
    """Seconds of a batch of `prompts` prompts on the instance of `cards` cards: compute plus reading the cached
    parts (the engine's `stage_costs.prefill_seconds_of`, with the instance's redundant experts whatever its size)."""
    assert cards == config.capacity.prefill_instance_nodes * config.cluster.cards_per_node
    nodes = config.capacity.prefill_instance_nodes
    return prefill_seconds_of(config, [prompt] * prompts, [cached] * prompts, [0] * prompts, nodes, imbalance,
                              redundant_experts=prefill_redundant_experts(config))


def _largest(ok, most: int) -> int:
    """The largest n in [0, most] with ok(n), for ok true up to some n and false after (bisection)."""
    if ok(most):
        return most
    low, high = 0, most
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if ok(middle) else (low, middle)
    return low


def capacity_text(report: dict) -> str:
    """The report, readable."""
    decode, prefill, settings = report["decode"], report["prefill"], report["settings"]
    return "\n".join([
        f"decode: {decode['tokens_per_s_per_card']:,.0f} tokens/s per {settings['decode_card']} card at "
        f"{decode['batch_per_card']:.1f} sequences per card of {decode['context_tokens']:,} tokens, step "
        f"{decode['step_ms']:.1f} ms, TPOT {decode['tpot_ms']:.1f} ms (target {settings['tpot_slo_ms']:g} ms), "
        f"imbalance {decode['imbalance']:.3f}; bound by {decode['binding']}",
        f"prefill: {prefill['tokens_per_s_per_card']:,.0f} prompt tokens/s per {settings['prefill_card']} card on "
        f"{prefill['cards']} cards, {prefill['prompts_per_batch']} prompts of {prefill['prompt_tokens']:,} tokens "
        f"per batch ({prefill['cached_tokens']:,} cached), batch {prefill['batch_s']:.2f} s, imbalance "
        f"{prefill['imbalance']:.3f}; bound by {prefill['binding']}",
    ])
