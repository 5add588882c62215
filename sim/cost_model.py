"""Roofline cost of prefill batches, decode steps, KV reads and vision encoding, in seconds.

The serving layout is DeepSeek's: attention and the dense parts data-parallel (every card holds their weights and
works on its own sequences), routed experts spread over the `cards` of the group (expert parallelism), tokens sent
to their experts and back by an all-to-all (dispatch, combine). Every pass is costed on one card:

  attention_s = max(compute, reads)  MLA projections (FP8/INT8) + attention core (BF16) | MLA weights + KV cache
  moe_s       = max(compute, reads)  routed experts of the BUSIEST card: mean tokens x moe_imbalance | its experts
  dense_s     = max(compute, reads)  dense FFNs, shared experts, gates, output head | their weights
  comm_s      = dispatch + combine of the busiest card: each a latency floor per MoE layer and micro-batch plus its
                bytes over scale-up and scale-out, the slower of the two (prefill: a token crosses scale-out once
                per remote domain its experts sit in, fewer under node limits)
  fixed_s     = a fixed time per layer and micro-batch that overlaps with nothing (launches, synchronisation, the
                small kernels' minimum durations): what a small batch pays and a large one hides nothing of either
  total_s     = max(attention_s + dense_s, dispatch_s) + max(moe_s, combine_s) + fixed_s with two micro-batches
                (DeepSeek, CloudMatrix, SGLang's two-batch overlap: one micro-batch's dispatch hides only under the
                other's attention and dense part, its combine only under the other's routed experts), or the sum
                without (one micro-batch: the floors and the fixed time once per layer).

with the weight matrices at `Efficiency.compute` x FP8/INT8 peak, the attention core at `.attention` x BF16 peak,
reads at `.memory` x HBM bandwidth, the all-to-all at `.network` x line rate
above `.all_to_all_floor_us`, and `.layer_overhead_us` per layer and micro-batch (`sim.hardware.active_efficiency()`,
the declared calibration, unless given). Tokens are assumed spread evenly over the cards' attention.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sim.hardware import Efficiency, HardwareProfile, active_efficiency
from sim.model_profile import ZERO_FLOPS, FlopCount, ModelProfile


MICRO_BATCHES = 2  # a pass with overlap runs as two micro-batches; each one's expert imbalance is at its own load
RESERVED_FRACTION = 0.1  # of a card's HBM kept for activations and buffers, beside the weights and the KV cache


@dataclass(frozen=True)
class StepCost:
    """Seconds of one pass (a prefill batch or a decode step) on the busiest card, by part.

    `float(cost)` is `total_s`. `moe_share` is moe_s / total_s: the part that removing expert imbalance shrinks
    (call again with moe_imbalance=1.0 for the exact gain; comm_s also scales with imbalance). `fixed_s` is the
    part no work changes (launches and synchronisation per layer and micro-batch).
    """

    attention_s: float
    moe_s: float
    dense_s: float
    comm_s: float
    total_s: float
    fixed_s: float = 0.0  # the fixed time per layer and micro-batch, summed (part of total_s)

    @property
    def compute_s(self) -> float:
        """Local (non-communication) seconds: attention, routed experts and dense parts back to back."""
        return self.attention_s + self.moe_s + self.dense_s

    @property
    def moe_share(self) -> float:
        """Share of the pass spent in the routed experts, in [0, 1]."""
        return self.moe_s / self.total_s if self.total_s > 0 else 0.0

    def __float__(self) -> float:
        return self.total_s


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name}={value} must be > 0")


def _part_seconds(linear_flops: float, core_flops: float, read_bytes: float, hardware: HardwareProfile,
                  efficiency: Efficiency) -> float:
    """max(compute, reads) of one part on one card: linear FLOPs at FP8/INT8 (the GEMMs' efficiency), core FLOPs at
    BF16 (the attention kernel's), bytes from HBM."""
    compute = linear_flops / (hardware.lowp_tflops * 1e12 * efficiency.compute) \
        + core_flops / (hardware.bf16_tflops * 1e12 * efficiency.attention)
    reads = read_bytes / (hardware.hbm_tb_s * 1e12 * efficiency.memory)
    return max(compute, reads)


@dataclass(frozen=True)
class _ModelConstants:
    """What the cost model reads off a model on every pass, computed once per model (a decode step is costed
    hundreds of thousands of times in an hour's run)."""

    attention_weights: float  # bytes of MLA weights, all layers
    dense_weights: float  # bytes of dense FFNs, shared experts, gates and output head
    expert_weight_bytes: float  # bytes of one expert slot over all MoE layers
    decode_linear: FlopCount  # weight-matrix FLOPs of one decoded token, output head included
    core_per_entry: float  # attention-core FLOPs of one decoded token per cached entry
    kv_per_entry: float  # cache bytes per entry
    full: int  # layers of each attention kind
    sliding: int
    compressed: int


_CONSTANTS: dict[int, tuple[ModelProfile, _ModelConstants]] = {}


def _constants(model: ModelProfile) -> _ModelConstants:
    """The model's constants, cached by identity (the same profile object is costed over and over)."""
    cached = _CONSTANTS.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    attention_weights = model.num_layers * model.attention_params_per_layer * model.weight_bytes
    counts = model.layer_counts()
    core = model.flops_per_token(0)
    constants = _ModelConstants(
        attention_weights=attention_weights,
        dense_weights=model.replicated_weight_bytes() - attention_weights
        - model.embedding_params * model.embedding_bytes,
        expert_weight_bytes=model.expert_weight_bytes(),
        decode_linear=FlopCount(0.0, core.attention_linear, core.routed_linear, core.dense_linear),
        core_per_entry=2.0 * model.num_heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim),
        kv_per_entry=model.kv_bytes_per_token_per_layer,
        full=counts["full"], sliding=counts["sliding"], compressed=counts["compressed"])
    if len(_CONSTANTS) > 256:
        _CONSTANTS.clear()
    _CONSTANTS[id(model)] = (model, constants)
    return constants


def _expert_slots_per_card(model: ModelProfile, cards: int, redundant_experts: int) -> int:
    """Expert slots on the fullest card: ceil((E + redundant) / cards)."""
    return math.ceil((model.num_routed_experts + redundant_experts) / cards)


def remote_domains_per_token(model: ModelProfile, domains: float, node_limited: bool = False) -> float:
    """Scale-up domains other than its own that a token's experts sit in, expected, over `domains` equal domains.

    Without node limits a placement scatters every group's experts, so the top_k copies land as if uniformly:
    (D - 1)(1 - (1 - 1/D)^top_k). Under node limits every one of the model's `expert_groups` sits on one domain
    (expert_groups / D a domain) and a token's experts come from `groups_per_token` of them (node-limited routing):
    a domain is reached when one of its groups is among the token's and one of the token's copies lands there,
    taken as each copy falling on one of the token's groups at random.

    Raises:
        ValueError: node_limited and `domains` is not a whole divisor of the model's expert_groups.
    """
    if domains <= 1:
        return 0.0
    k = model.top_k
    if not node_limited:
        return (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** k)
    groups, chosen = model.expert_groups, model.groups_per_token
    if domains != int(domains) or groups % int(domains):
        raise ValueError(f"domains={domains:g}: node limits need whole domains that divide the model's "
                         f"expert_groups={groups}")
    mine = groups // int(domains)  # groups on each domain
    reached = sum(math.comb(mine, j) * math.comb(groups - mine, chosen - j) / math.comb(groups, chosen)
                  * (1.0 - (1.0 - j / chosen) ** k) for j in range(1, min(mine, chosen) + 1))
    return (domains - 1) * reached


def _all_to_all_seconds(model: ModelProfile, hardware: HardwareProfile, cards: int, tokens_per_card: float,
                        moe_imbalance: float, efficiency: Efficiency, per_domain: bool = False,
                        node_limited: bool = False) -> float:
    """Dispatch + combine seconds of the busiest card over all MoE layers.

    Each token sends its hidden state to its top_k experts (dispatch_bytes per value) and gets top_k results back
    (combine_bytes), experts spread evenly over the cards. Without `per_domain` (DeepEP's low-latency kernels,
    decode) every copy travels on its own: 1/cards stay on the card, the rest of the scale-up domain goes over
    scale-up and the remainder over scale-out (node limits move no copy there: each domain still holds 1/D of a
    token's experts on average). With `per_domain` (DeepEP's normal kernels, prefill) a token crosses scale-out
    once per remote domain its experts sit in (`remote_domains_per_token`, fewer with `node_limited`) and is
    forwarded inside that domain over scale-up, so every copy but the local one crosses scale-up once.
    The busiest card moves moe_imbalance times the mean.
    """
    if cards <= 1:
        return 0.0
    per_value = model.hidden_size * (model.dispatch_bytes + model.combine_bytes) * model.num_moe_layers
    card_bytes = tokens_per_card * per_value * moe_imbalance
    domain = min(cards, hardware.scale_up_domain_cards)
    k = model.top_k
    if per_domain and cards > domain:
        out_copies = remote_domains_per_token(model, cards / domain, node_limited)
        up_copies = k * (cards - 1) / cards
    else:
        out_copies = k * (cards - domain) / cards
        up_copies = k * (domain - 1) / cards
    return max(card_bytes * up_copies / (hardware.scale_up_gb_s * 1e9),
               card_bytes * out_copies / (hardware.scale_out_gb_s * 1e9)) / efficiency.network


def all_to_all_latency_seconds(model: ModelProfile, hardware: HardwareProfile, cards: int, tokens_per_card: float,
                               efficiency: Efficiency | None = None) -> tuple[float, float]:
    """(dispatch, combine) seconds of one call each, one MoE layer, `tokens_per_card` tokens on every card of a group
    of `cards` with balanced routing: the latency floor plus the bytes (what DeepEP's and CloudMatrix's operator
    benchmarks time)."""
    _check_positive(cards=cards, tokens_per_card=tokens_per_card)
    efficiency = efficiency or active_efficiency()
    if cards <= 1:
        return 0.0, 0.0
    both = _all_to_all_seconds(model, hardware, cards, tokens_per_card, 1.0, efficiency) / model.num_moe_layers
    dispatch = both * model.dispatch_bytes / (model.dispatch_bytes + model.combine_bytes)
    floor = efficiency.all_to_all_floor_us * 1e-6
    return dispatch + floor, both - dispatch + floor


def _pass_cost(model: ModelProfile, hardware: HardwareProfile, cards: int, tokens: float, flops: FlopCount,
               kv_bytes: float, moe_imbalance: float, redundant_experts: int, efficiency: Efficiency,
               overlap: bool, per_domain: bool = False, node_limited: bool = False) -> StepCost:
    """Cost of one forward pass of `tokens` tokens over all `cards`, doing `flops` and reading or writing
    `kv_bytes` of KV cache (both totals over the cards, split evenly)."""
    per_card = flops.scaled(1.0 / cards)
    constants = _constants(model)
    attention_s = _part_seconds(per_card.attention_linear, per_card.attention_core,
                                constants.attention_weights + kv_bytes / cards, hardware, efficiency)
    # an expert slot's weights are read when a token reaches it: a share 1 - (1 - K/E)^tokens of slots, per layer
    touched = 1.0 - (1.0 - model.top_k / model.num_routed_experts) ** tokens
    expert_reads = _expert_slots_per_card(model, cards, redundant_experts) * constants.expert_weight_bytes * touched
    moe_s = _part_seconds(per_card.routed_linear * moe_imbalance, 0.0, expert_reads, hardware, efficiency)
    dense_s = _part_seconds(per_card.dense_linear, 0.0, constants.dense_weights, hardware, efficiency)
    comm_s = _all_to_all_seconds(model, hardware, cards, tokens / cards, moe_imbalance, efficiency, per_domain,
                                 node_limited)
    micro_batches = MICRO_BATCHES if overlap else 1
    floor_s = efficiency.all_to_all_floor_us * 1e-6 * model.num_moe_layers * micro_batches if cards > 1 else 0.0
    dispatch_bytes_s = comm_s * model.dispatch_bytes / (model.dispatch_bytes + model.combine_bytes)
    dispatch_s, combine_s = dispatch_bytes_s + floor_s, comm_s - dispatch_bytes_s + floor_s
    fixed_s = efficiency.layer_overhead_us * 1e-6 * model.num_layers * micro_batches
    if overlap:  # each micro-batch's dispatch runs under the other's attention, its combine under the other's experts
        total = max(attention_s + dense_s, dispatch_s) + max(moe_s, combine_s) + fixed_s
    else:
        total = attention_s + moe_s + dense_s + dispatch_s + combine_s + fixed_s
    return StepCost(attention_s=attention_s, moe_s=moe_s, dense_s=dense_s, comm_s=dispatch_s + combine_s,
                    total_s=total, fixed_s=fixed_s)


def draft_pass_fixed_seconds(model: ModelProfile, cards: int, efficiency: Efficiency | None = None, *,
                             draft_layers: int = 1, overlap: bool = True) -> float:
    """The fixed seconds of one draft pass of `draft_layers` MoE layers (DeepSeek's MTP module is one): each
    layer's fixed time and, over an EP group, its dispatch and combine floors, per micro-batch. What a draft token
    costs whatever the batch, beside its share of the work."""
    efficiency = efficiency or active_efficiency()
    floors = 2 * efficiency.all_to_all_floor_us if cards > 1 else 0.0
    return (efficiency.layer_overhead_us + floors) * 1e-6 * draft_layers * (MICRO_BATCHES if overlap else 1)


def prefill_seconds(model: ModelProfile, hardware: HardwareProfile, cards: int, new_tokens: int | Sequence[int],
                    cached_tokens: int | Sequence[int] = 0, efficiency: Efficiency | None = None, *,
                    moe_imbalance: float = 1.0, redundant_experts: int = 0, overlap: bool = True,
                    node_limited: bool = False) -> StepCost:
    """Cost of one prefill batch on an instance of `cards` cards (an 8-card node, or several).

    Args:
        new_tokens: tokens to compute, one int per prompt (or one int for a single prompt).
        cached_tokens: tokens of each prompt already cached (read from the KV cache, not recomputed); same
            length as `new_tokens`, or one int for all prompts.
        moe_imbalance: busiest card's routed tokens over the mean (1.0: perfect balance).
        redundant_experts: extra expert replicas in the instance.
        overlap: communication hidden under computation (two micro-batches), else added.
        node_limited: every expert group on one scale-up domain (node limits), so a token crosses scale-out to
            fewer domains (`remote_domains_per_token`).

    Returns:
        StepCost of the batch; float(result) is its seconds. Prompts are spread evenly over the cards' attention;
        each prompt's last token also goes through the output head.
    """
    news = [int(n) for n in new_tokens] if hasattr(new_tokens, "__iter__") else [int(new_tokens)]
    cached = [int(c) for c in cached_tokens] if hasattr(cached_tokens, "__iter__") else [int(cached_tokens)] * len(news)
    if len(cached) != len(news):
        raise ValueError(f"cached_tokens has {len(cached)} entries but new_tokens has {len(news)}; give one per "
                         f"prompt, or a single int for all")
    if any(n < 0 for n in news) or any(c < 0 for c in cached):
        raise ValueError("new_tokens and cached_tokens must be >= 0")
    _check_positive(cards=cards, moe_imbalance=moe_imbalance)
    if sum(news) == 0:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
    flops = ZERO_FLOPS
    kv_bytes = 0.0
    for n, c in zip(news, cached):
        if n == 0:
            continue
        flops = flops + model.prefill_flops(n, c)
        flops = flops + FlopCount(0.0, 0.0, 0.0, 2.0 * model.embedding_params)  # head on the last token
        kv_bytes += model.kv_bytes(c + n)  # read the cached part, write the new part
    return _pass_cost(model, hardware, cards, float(sum(news)), flops, kv_bytes, moe_imbalance,
                      redundant_experts, efficiency or active_efficiency(), overlap, per_domain=True,
                      node_limited=node_limited)


def decode_step_seconds(model: ModelProfile, hardware: HardwareProfile, cards: int, batch_size: int,
                        kv_tokens: int, moe_imbalance: float = 1.0, efficiency: Efficiency | None = None, *,
                        tokens_per_sequence: int = 1, redundant_experts: int = 0,
                        overlap: bool = True) -> StepCost:
    """Cost of one decode step of an EP unit of `cards` cards serving `batch_size` sequences.

    Args:
        kv_tokens: sum of the sequences' context lengths (tokens in their caches).
        moe_imbalance: busiest card's routed tokens over the mean, this step (1.0: perfect balance).
        tokens_per_sequence: tokens each sequence runs this step (1 + draft tokens under speculative decoding);
            they share one read of the cache and the weights.
        redundant_experts: extra expert replicas in the unit.
        overlap: communication hidden under computation (two micro-batches), else added.

    Returns:
        StepCost; float(result) is the step's seconds, result.moe_share the routed experts' share of it.
        Sliding layers are costed at the mean context, which overstates them slightly when some sequences are
        shorter than the window (exact for full and compressed layers).
    """
    _check_positive(cards=cards, moe_imbalance=moe_imbalance, tokens_per_sequence=tokens_per_sequence)
    if batch_size < 0 or kv_tokens < 0:
        raise ValueError(f"batch_size={batch_size} and kv_tokens={kv_tokens} must be >= 0")
    if batch_size == 0:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
    mean_context = kv_tokens / batch_size
    tokens = batch_size * tokens_per_sequence
    constants = _constants(model)
    # model.flops_per_token(mean_context) and model.kv_bytes(mean_context), from the cached constants
    entries = (constants.full * mean_context + constants.sliding * min(mean_context, model.sliding_window)
               + constants.compressed * math.ceil(mean_context / model.compression_ratio))
    linear = constants.decode_linear
    flops = FlopCount(constants.core_per_entry * entries * tokens, linear.attention_linear * tokens,
                      linear.routed_linear * tokens, linear.dense_linear * tokens)
    kv_bytes = batch_size * entries * constants.kv_per_entry
    return _pass_cost(model, hardware, cards, float(tokens), flops, kv_bytes, moe_imbalance, redundant_experts,
                      efficiency or active_efficiency(), overlap)


def kv_cache_read_seconds(num_bytes: float, read_gb_s: float) -> float:
    """Seconds to read `num_bytes` of KV cache at `read_gb_s` GB/s (e.g. from the SSD tier, per prefill node)."""
    _check_positive(read_gb_s=read_gb_s)
    if num_bytes < 0:
        raise ValueError(f"num_bytes={num_bytes} must be >= 0")
    return num_bytes / (read_gb_s * 1e9)


def vision_encode_seconds(hardware: HardwareProfile, images: int, tokens_per_image: int = 1024,
                          encoder_params: float = 0.67e9, efficiency: Efficiency | None = None, *,
                          encoder_layers: int = 32, encoder_width: int = 1280) -> float:
    """Seconds for one card to encode `images` images with a ViT-style encoder, in BF16.

    Defaults follow Qwen2.5-VL's vision tower and a 448 x 448 image (figures: docs/simulator.md, 'Vision
    encoder'). FLOPs: 2 x params per patch token, plus full
    attention within each image (4 x tokens^2 x width per layer); weights (2 bytes each) read once per batch.
    """
    if images < 0:
        raise ValueError(f"images={images} must be >= 0")
    _check_positive(tokens_per_image=tokens_per_image, encoder_params=encoder_params)
    if images == 0:
        return 0.0
    flops = images * (2.0 * encoder_params * tokens_per_image
                      + 4.0 * encoder_layers * tokens_per_image ** 2 * encoder_width)
    efficiency = efficiency or active_efficiency()
    compute = flops / (hardware.bf16_tflops * 1e12 * efficiency.compute)
    reads = 2.0 * encoder_params / (hardware.hbm_tb_s * 1e12 * efficiency.memory)
    return max(compute, reads)


def max_decode_batch(model: ModelProfile, hardware: HardwareProfile, cards: int, mean_context: int, *,
                     redundant_experts: int = 0, reserved_fraction: float = RESERVED_FRACTION) -> int:
    """Sequences of `mean_context` tokens whose caches fit in the unit's HBM after the weights (KV bound).

    Each card keeps `reserved_fraction` of its HBM for activations and buffers, a full copy of the replicated
    weights (attention, dense part, embedding, head) and its expert slots; the rest holds caches. Returns 0 when
    the weights alone do not fit (use more cards, or smaller weights).
    """
    _check_positive(cards=cards, mean_context=mean_context)
    if not 0 <= reserved_fraction < 1:
        raise ValueError(f"reserved_fraction={reserved_fraction} must be in [0, 1)")
    free = (hardware.hbm_gb * 1e9 * (1.0 - reserved_fraction) - model.replicated_weight_bytes()
            - _expert_slots_per_card(model, cards, redundant_experts) * model.expert_weight_bytes())
    if free <= 0:
        return 0
    return int(free // model.kv_bytes(mean_context)) * cards
