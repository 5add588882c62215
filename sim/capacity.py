"""Capacity at a latency target: per-card decode and prefill tokens/s with the load raised until the target binds,
the quantity every published serving figure is (`eplb sim --capacity`).

- Decode: one EP unit of `cluster.decode_cards` cards, every sequence holding `capacity.decode_context_tokens` of
  context. The batch grows until a step, over the tokens each sequence gains per step (1, or 1 + accepted draft
  tokens under `speculative`), exceeds `capacity.tpot_slo_ms`, or the caches no longer fit HBM after the weights,
  or `cluster.max_decode_batch_per_card` binds; or a fixed `capacity.decode_batch_per_card` (a figure published at
  a stated batch). Tokens/s per card = batch x tokens per step / step / cards.
- Prefill: one instance of `capacity.prefill_instance_nodes` nodes, batches of whole prompts of mean length
  `capacity.prompt_tokens`, all that long or spread as a served day's are (`capacity.prompt_length_spread`,
  `sim.prompt_mix`); the `cached_share` of each is read from the persistent tier at `cache.disk_read_gb_s` per node,
  not computed. The batch grows until it takes longer than `capacity.ttft_slo_s` (the batch's own time; queueing
  ahead of it is not counted) or reaches `cluster.max_prefill_batch_tokens` new tokens per node. Tokens/s per card
  counts every prompt token, hits included, as published prefill rates do.

Both stages take their expert imbalance at each candidate batch from this project's placement code at the tokens per
card of one of the batch's two micro-batches (`sim.engine.load_imbalance`: one synthetic routing trace per group
shape, thinned to each load, so the imbalance falls smoothly with the load): it multiplies the routed experts' part of
the pass (and the busiest card's all-to-all bytes). Throughput is therefore non-decreasing in the latency target and
in the batch cap.
"""

import math

from placement.noise_floor import noise_floor
from sim.config import SimConfig
from sim.cost_model import MICRO_BATCHES, decode_step_seconds, max_decode_batch
from sim.engine.load_imbalance import load_imbalance
from sim.hardware import PROFILES
from sim.prompt_mix import prompt_lengths
from sim.speculative import expected_step, step_cost
from sim.stage_costs import prefill_redundant_experts, prefill_seconds_of, redundant_experts


def capacity_report(config: SimConfig) -> dict:
    """Both stages' capacity (`decode_capacity`, `prefill_capacity`) and the settings they ran under."""
    capacity = config.capacity
    return {"decode": decode_capacity(config), "prefill": prefill_capacity(config),
            "settings": {**capacity.model_dump(), "balance_policy": config.balance.policy,
                         "decode_card": config.hardware.decode, "prefill_card": config.hardware.prefill,
                         "speculative": config.speculative.enabled}}


def decode_capacity(config: SimConfig, imbalance: float | None = None) -> dict:
    """The largest decode batch of one unit that meets the TPOT target and fits; its per-card rate and step.
    `imbalance` fixes the expert imbalance instead of taking it from the placement code at each batch (the refit's
    inner search, `sim.validation`)."""
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
    curve = load_imbalance(config, cards, config.decode_slots_per_card, "decode") if imbalance is None else None

    def imbalance_at(batch: int) -> float:
        return curve.at(batch * verified / cards / MICRO_BATCHES) if curve is not None else imbalance

    batch = max(1, round(fixed * cards)) if fixed is not None else \
        _largest(lambda b: decode_tpot(config, b, imbalance_at(b))[0] <= slo_s, most)
    imbalance = imbalance_at(max(batch, 1))
    tpot, step = decode_tpot(config, max(batch, 1), imbalance)
    binding = "tpot_slo" if batch < most else ("kv_cache" if fits <= cap else "max_decode_batch_per_card")
    if fixed is not None:
        binding = "fixed_batch"
    load = max(batch, 1) * verified / cards / MICRO_BATCHES
    return {"tokens_per_s_per_card": batch * tokens_per_step / step / cards if batch else 0.0,
            "batch_per_card": batch / cards, "sequences": batch, "step_ms": 1000 * step, "tpot_ms": 1000 * tpot,
            "tokens_per_step": tokens_per_step, "imbalance": imbalance, "binding": binding if batch else "tpot_slo",
            "cards": cards, "context_tokens": context, "micro_batch_tokens_per_card": load,
            "noise_floor": noise_floor(load * cards * config.model.top_k, cards),
            "basis": curve.basis if curve is not None else None}


def prefill_capacity(config: SimConfig, imbalance: float | None = None) -> dict:
    """The largest prefill batch of one instance within the TTFT target (or the batch cap); its per-card rate.
    `imbalance` fixes the expert imbalance instead of taking it from the placement code at each batch."""
    capacity, cluster, model = config.capacity, config.cluster, config.model
    nodes = capacity.prefill_instance_nodes
    cards = nodes * cluster.cards_per_node
    prompt = capacity.prompt_tokens
    cached = min(round(prompt * capacity.cached_share), prompt - 1)  # the last token is always computed
    most = max(1, cluster.max_prefill_batch_tokens * nodes // (prompt - cached))  # whole prompts
    redundant = prefill_redundant_experts(config)
    slots = math.ceil((model.num_routed_experts + redundant) / cards)
    limit = capacity.ttft_slo_s if capacity.ttft_slo_s is not None else math.inf
    curve = load_imbalance(config, cards, slots, "prefill") if imbalance is None else None

    def imbalance_at(prompts: int) -> float:
        return curve.at(prompts * (prompt - cached) / cards / MICRO_BATCHES) if curve is not None else imbalance

    prompts = _largest(lambda n: _prefill_seconds(config, n, cards, imbalance_at(n)) <= limit, most)
    imbalance = imbalance_at(max(prompts, 1))
    seconds = _prefill_seconds(config, max(prompts, 1), cards, imbalance)
    lengths, _ = _prefill_batch(config, max(prompts, 1))
    binding = "ttft_slo" if prompts < most else "max_prefill_batch_tokens"
    load = max(prompts, 1) * (prompt - cached) / cards / MICRO_BATCHES
    return {"tokens_per_s_per_card": sum(lengths) / seconds / cards if prompts else 0.0,
            "prompts_per_batch": prompts, "new_tokens_per_card": prompts * (prompt - cached) / cards,
            "batch_s": seconds, "imbalance": imbalance, "binding": binding, "cards": cards,
            "redundant_experts": redundant, "prompt_tokens": prompt, "cached_tokens": cached,
            "micro_batch_tokens_per_card": load, "noise_floor": noise_floor(load * cards * model.top_k, cards)}


def speculation_gain(config: SimConfig, batches_per_card: list[float], imbalance: float | None = None) -> list[dict]:
    """Per decode batch (sequences per card, fixed): tokens/s per card and step with the config's speculative
    decoding and without it, and the gain; `imbalance` fixes the expert imbalance (else the placement code's at each
    batch, as `decode_capacity`). What the draft buys as the batch grows: its verification is nearly free while the
    fixed time per layer dominates a step, and costs its full work where attention binds."""
    if not config.speculative.enabled:
        raise ValueError("speculation_gain compares speculative decoding with none; the config has "
                         "speculative.enabled false")
    plain = config.model_copy(update={"speculative": config.speculative.model_copy(update={"enabled": False})})
    rows = []
    for per_card in batches_per_card:
        def at(base: SimConfig) -> SimConfig:
            return base.model_copy(update={"capacity": base.capacity.model_copy(
                update={"decode_batch_per_card": per_card})})

        with_draft, without = decode_capacity(at(config), imbalance), decode_capacity(at(plain), imbalance)
        rows.append({"batch_per_card": per_card,
                     "tokens_per_s_per_card": with_draft["tokens_per_s_per_card"],
                     "plain_tokens_per_s_per_card": without["tokens_per_s_per_card"],
                     "step_ms": with_draft["step_ms"], "plain_step_ms": without["step_ms"],
                     "gain": with_draft["tokens_per_s_per_card"] / without["tokens_per_s_per_card"] - 1.0})
    return rows


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


def _prefill_batch(config: SimConfig, prompts: int) -> tuple[list[int], list[int]]:
    """(lengths, cached tokens) of the `prompts` prompts of a capacity batch: `sim.prompt_mix`'s lengths of mean
    capacity.prompt_tokens and spread capacity.prompt_length_spread, each with its cached_share read from the cache
    (its last token always computed)."""
    capacity = config.capacity
    lengths = prompt_lengths(capacity.prompt_tokens, capacity.prompt_length_spread, prompts)
    return lengths, [min(round(length * capacity.cached_share), length - 1) for length in lengths]


def _prefill_seconds(config: SimConfig, prompts: int, cards: int, imbalance: float) -> float:
    """Seconds of a batch of `prompts` prompts on the instance of `cards` cards: compute plus reading the cached
    parts (the engine's `stage_costs.prefill_seconds_of`, with the instance's redundant experts whatever its size)."""
    assert cards == config.capacity.prefill_instance_nodes * config.cluster.cards_per_node
    lengths, cached = _prefill_batch(config, prompts)
    return prefill_seconds_of(config, lengths, cached, [0] * prompts, config.capacity.prefill_instance_nodes,
                              imbalance, redundant_experts=prefill_redundant_experts(config))


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
        f"imbalance {decode['imbalance']:.3f} (noise floor {decode['noise_floor']:.3f} at "
        f"{decode['micro_batch_tokens_per_card']:.1f} tokens per card a micro-batch); bound by {decode['binding']}",
        f"prefill: {prefill['tokens_per_s_per_card']:,.0f} prompt tokens/s per {settings['prefill_card']} card on "
        f"{prefill['cards']} cards, {prefill['prompts_per_batch']} prompts of {prefill['prompt_tokens']:,} tokens "
        f"per batch ({prefill['cached_tokens']:,} cached), batch {prefill['batch_s']:.2f} s, imbalance "
        f"{prefill['imbalance']:.3f} (noise floor {prefill['noise_floor']:.3f}); bound by {prefill['binding']}",
    ])


CURVE_TPOT_MS = (10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 70.0, 100.0, 150.0)  # the curve's targets unless given


def decode_curve(config: SimConfig, targets_ms: tuple[float, ...] = CURVE_TPOT_MS) -> list[dict]:
    """The latency-throughput curve of one decode unit: `decode_capacity` at each TPOT target (ms), in rising
    order. The imbalance against load is measured once for the unit's shape, so a looser target never gives less."""
    rows = []
    for target in sorted(set(targets_ms)):
        at = config.model_copy(update={"capacity": config.capacity.model_copy(update={"tpot_slo_ms": target})})
        rows.append({"tpot_slo_ms": target, **decode_capacity(at)})
    return rows


def curve_text(rows: list[dict], card: str) -> str:
    """The curve as a table: target, TPOT met, tokens/s per card, batch per card, step, imbalance, what binds."""
    lines = [f"decode latency-throughput curve ({card}):",
             "  TPOT target ms | TPOT ms | tokens/s per card | sequences per card | step ms | imbalance | bound by"]
    for row in rows:
        lines.append(f"  {row['tpot_slo_ms']:14g} | {row['tpot_ms']:7.1f} | {row['tokens_per_s_per_card']:17,.0f} | "
                     f"{row['batch_per_card']:18.1f} | {row['step_ms']:7.1f} | {row['imbalance']:9.3f} | "
                     f"{row['binding']}")
    return "\n".join(lines)


def write_curve_plot(rows: list[dict], path, title: str) -> None:
    """A PNG of the curve at `path` (written atomically): TPOT met against tokens/s per card, each point labelled
    with its sequences per card."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from traces.atomic_file import write_atomically

    figure, axes = plt.subplots(figsize=(7, 4.5))
    rates = [row["tokens_per_s_per_card"] for row in rows]
    tpots = [row["tpot_ms"] for row in rows]
    axes.plot(rates, tpots, marker="o")
    for rate, tpot, row in zip(rates, tpots, rows):
        axes.annotate(f"{row['batch_per_card']:.0f}", (rate, tpot), textcoords="offset points", xytext=(4, -10),
                      fontsize=8)
    axes.set_xlabel("decode tokens/s per card")
    axes.set_ylabel("TPOT, ms")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    try:
        write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)
