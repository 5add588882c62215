"""The served model's shape: parameters, KV cache bytes and FLOPs per token, for the simulator's cost model.

Defaults are DeepSeek-V3/R1's published shape (sources: docs/simulator.md, 'Model profile'):
61 layers, the first 3 dense, 256 routed experts in 8 groups of which 8 are active (from 4 groups) plus 1 shared
expert, MLA attention with 128 heads. The multi-token-prediction module (one more layer) is left out, like the 671B
total it is not part of.

Glossary:
  full layer        attention over the whole context; MLA caches kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576
                    values per token, 1,152 bytes in BF16.
  sliding layer     attention over the last `sliding_window` tokens only; its cache never grows past the window.
  compressed layer  attention over one cached entry per `compression_ratio` tokens (a compressed or strided cache).
  linear FLOPs      matrix products with the weights (FP8 or INT8 on the cards this project models).
  attention core    the score and value products against the cache (BF16 on every card here).

All FLOPs are counted as 2 per multiply-add; bytes are plain bytes (not GiB).
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LayerKind = Literal["full", "sliding", "compressed"]


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of some work, split by where they land in the cost model.

    attention_core: score and value products against the cache (BF16).
    attention_linear: MLA projections (q down/up, kv down, kv up of cached latents, output).
    routed_linear: the routed experts' matrices (top_k per token), the part moe_imbalance scales.
    dense_linear: dense-layer FFNs, shared experts, router gates and, where counted, the output head.
    """

    attention_core: float
    attention_linear: float
    routed_linear: float
    dense_linear: float

    @property
    def linear(self) -> float:
        """All weight-matrix FLOPs (the FP8/INT8 part)."""
        return self.attention_linear + self.routed_linear + self.dense_linear

    @property
    def total(self) -> float:
        """All FLOPs."""
        return self.linear + self.attention_core

    def scaled(self, factor: float) -> "FlopCount":
        """This count times `factor` (e.g. per card)."""
        return FlopCount(self.attention_core * factor, self.attention_linear * factor,
                         self.routed_linear * factor, self.dense_linear * factor)

    def __add__(self, other: "FlopCount") -> "FlopCount":
        return FlopCount(self.attention_core + other.attention_core, self.attention_linear + other.attention_linear,
                         self.routed_linear + other.routed_linear, self.dense_linear + other.dense_linear)


ZERO_FLOPS = FlopCount(0.0, 0.0, 0.0, 0.0)


@lru_cache(maxsize=64)
def _layer_kinds(num_layers: int, sliding_share: float, sliding_layers: tuple[int, ...] | None,
                 compressed_layers: tuple[int, ...]) -> tuple[LayerKind, ...]:
    """Kind of each layer (cached: the cost model asks once per step)."""
    kinds: list[LayerKind] = ["full"] * num_layers
    for i in compressed_layers:
        kinds[i] = "compressed"
    if sliding_layers is not None:
        for i in sliding_layers:
            kinds[i] = "sliding"
    elif sliding_share > 0:
        free = [i for i, kind in enumerate(kinds) if kind == "full"]
        n = min(round(sliding_share * num_layers), len(free))
        # layer free[j] is sliding iff the running count floor((j + 1) * n / len) steps up at j
        for j, i in enumerate(free):
            if (j + 1) * n // len(free) > j * n // len(free):
                kinds[i] = "sliding"
    return tuple(kinds)


@lru_cache(maxsize=64)
def _kind_counts(kinds: tuple[LayerKind, ...]) -> dict[LayerKind, int]:
    return {kind: kinds.count(kind) for kind in ("full", "sliding", "compressed")}


class ModelProfile(BaseModel):
    """A DeepSeek-style MoE model with MLA attention and optional sliding-window and compressed layers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    name: str = Field("DeepSeek-V3", description="Label used in reports.")
    num_layers: int = Field(61, ge=1, le=512, description="Decoder layers (MTP module excluded).")
    num_dense_layers: int = Field(3, ge=0, le=512, description="Leading layers with a dense FFN instead of experts.")
    hidden_size: int = Field(7168, ge=1, le=131072, description="Model width D.")
    vocab_size: int = Field(129280, ge=1, le=1 << 24, description="Vocabulary; sizes the embedding and the output "
                                                                  "head.")
    num_routed_experts: int = Field(256, ge=1, le=4096, description="E: routed experts per MoE layer.")
    top_k: int = Field(8, ge=1, le=256, description="K: routed experts each token uses per MoE layer.")
    num_shared_experts: int = Field(1, ge=0, le=64, description="Experts every token uses per MoE layer.")
    expert_groups: int = Field(8, ge=1, le=4096, description="Groups of consecutive routed experts the router "
                               "picks among first (DeepSeek-V3's n_group; 1 for a router without groups, such as "
                               "Qwen3-MoE's); node limits keep each on one node.")
    groups_per_token: int = Field(4, ge=1, le=4096, description="Groups a token's experts come from (DeepSeek-V3's "
                                  "topk_group, 1 with expert_groups 1: with each group on one node, at most this "
                                  "many nodes a token).")
    moe_intermediate_size: int = Field(2048, ge=1, le=131072, description="Inner width of one expert (gate, up, down).")
    dense_intermediate_size: int = Field(18432, ge=1, le=1 << 20, description="Inner width of a dense layer's FFN.")
    num_heads: int = Field(128, ge=1, le=1024, description="Attention (query) heads.")
    q_lora_rank: int = Field(1536, ge=1, le=65536, description="MLA query down-projection rank.")
    kv_lora_rank: int = Field(512, ge=1, le=65536, description="MLA compressed KV latent per token (cached).")
    qk_nope_head_dim: int = Field(128, ge=1, le=4096, description="Per-head query/key dims without rotary embedding.")
    qk_rope_head_dim: int = Field(64, ge=0, le=4096, description="Rotary key dims, shared by heads and cached.")
    v_head_dim: int = Field(128, ge=1, le=4096, description="Per-head value dims.")
    weight_bytes: float = Field(1.0, gt=0, le=8, description="Bytes per linear weight (1: FP8 on H800, INT8 on "
                                                             "Ascend).")
    embedding_bytes: float = Field(2.0, gt=0, le=8, description="Bytes per embedding/output-head weight (BF16 in V3).")
    kv_cache_dtype: Literal["bf16", "fp8"] = Field("bf16", description="Dtype of cached KV values (BF16 in "
                                                                       "DeepSeek's Feb-2025 deployment).")
    dispatch_bytes: float = Field(1.0, gt=0, le=8, description="Bytes per hidden value sent to an expert (FP8).")
    combine_bytes: float = Field(2.0, gt=0, le=8, description="Bytes per hidden value returned by an expert (BF16).")
    sliding_window_share: float = Field(0.0, ge=0, le=1, description="Share of layers that use sliding-window "
                                                                     "attention, spread evenly over the depth.")
    sliding_window_layers: tuple[int, ...] | None = Field(None, description="Explicit sliding-window layer indices "
                                                                            "(overrides sliding_window_share).")
    sliding_window: int = Field(128, ge=1, le=1 << 24, description="Tokens a sliding layer sees and caches. The "
                                "default equals the tokens recomputed to rebuild a missing window state "
                                "(cache.window_recompute_tokens), which restores it only if the window is no longer.")
    compressed_layers: tuple[int, ...] = Field((), description="Layer indices with a compressed cache.")
    compression_ratio: int = Field(4, ge=1, le=1024, description="Tokens per cached entry in a compressed layer.")

    @field_validator("sliding_window_layers", "compressed_layers", mode="before")
    @classmethod
    def _indices_from_a_list(cls, value):
        return tuple(value) if isinstance(value, list) else value  # YAML and JSON write indices as a list

    @model_validator(mode="after")
    def _consistent(self) -> "ModelProfile":
        if self.num_dense_layers > self.num_layers:
            raise ValueError(f"num_dense_layers={self.num_dense_layers} exceeds num_layers={self.num_layers}")
        if self.top_k > self.num_routed_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_routed_experts={self.num_routed_experts}")
        if self.groups_per_token > self.expert_groups:
            raise ValueError(f"groups_per_token={self.groups_per_token} exceeds expert_groups={self.expert_groups}")
        for field, layers in (("sliding_window_layers", self.sliding_window_layers or ()),
                              ("compressed_layers", self.compressed_layers)):
            bad = [i for i in layers if not 0 <= i < self.num_layers]
            if bad or len(set(layers)) != len(layers):
                raise ValueError(f"{field}={list(layers)} must be distinct indices in [0, {self.num_layers}); "
                                 f"offending: {bad or 'duplicates'}")
        overlap = set(self.sliding_window_layers or ()) & set(self.compressed_layers)
        if overlap:
            raise ValueError(f"layers {sorted(overlap)} are both sliding and compressed; pick one kind per layer")
        if self.sliding_window_layers is not None and self.sliding_window_share > 0:
            raise ValueError("give sliding_window_layers or sliding_window_share, not both")
        return self

    # ---- layer layout -------------------------------------------------------------------------------------------

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Attention kind of each layer, [num_layers]. A share is spread evenly over the non-compressed layers."""
        return _layer_kinds(self.num_layers, self.sliding_window_share, self.sliding_window_layers,
                            self.compressed_layers)

    def layer_counts(self) -> dict[LayerKind, int]:
        """Layers of each attention kind."""
        return dict(self._layer_counts)

    @property
    def _layer_counts(self) -> dict[LayerKind, int]:
        return _kind_counts(self.layer_kinds)

    @property
    def num_moe_layers(self) -> int:
        """Layers with routed experts."""
        return self.num_layers - self.num_dense_layers

    # ---- parameters ---------------------------------------------------------------------------------------------

    @property
    def attention_params_per_layer(self) -> int:
        """MLA weights of one layer: q down/up, kv down (with rope key), kv up, output (187M in V3)."""
        d, h = self.hidden_size, self.num_heads
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        return (d * self.q_lora_rank + self.q_lora_rank * h * qk_head
                + d * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
                + h * self.v_head_dim * d)

    @property
    def expert_params(self) -> int:
        """Weights of one expert (gate, up, down): 44.0M in V3."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def dense_ffn_params(self) -> int:
        """Weights of one dense layer's FFN: 396M in V3."""
        return 3 * self.hidden_size * self.dense_intermediate_size

    @property
    def embedding_params(self) -> int:
        """Weights of the input embedding, and separately of the output head (untied): 927M each in V3."""
        return self.vocab_size * self.hidden_size

    def _dense_part_params(self) -> int:
        """Dense FFNs, shared experts and router gates over all layers (every token uses all of them)."""
        return (self.num_dense_layers * self.dense_ffn_params
                + self.num_moe_layers * (self.num_shared_experts * self.expert_params
                                         + self.num_routed_experts * self.hidden_size))

    def total_params(self) -> int:
        """All weights, embeddings included: 671B for V3."""
        return (self.num_layers * self.attention_params_per_layer + self._dense_part_params()
                + self.num_moe_layers * self.num_routed_experts * self.expert_params + 2 * self.embedding_params)

    def active_params_per_token(self) -> int:
        """Weights one token uses, embedding and head included: 37.5B for V3 (the report rounds to 37B)."""
        return (self.num_layers * self.attention_params_per_layer + self._dense_part_params()
                + self.num_moe_layers * self.top_k * self.expert_params + 2 * self.embedding_params)

    def replicated_weight_bytes(self) -> float:
        """Bytes every card of a DP-attention EP group holds: attention, dense part, embedding and head."""
        return ((self.num_layers * self.attention_params_per_layer + self._dense_part_params()) * self.weight_bytes
                + 2 * self.embedding_params * self.embedding_bytes)

    def expert_weight_bytes(self) -> float:
        """Bytes of one expert slot over all MoE layers (one replica of one expert in every layer)."""
        return self.num_moe_layers * self.expert_params * self.weight_bytes

    # ---- KV cache -----------------------------------------------------------------------------------------------

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        """Bytes one token adds to one layer's cache: 576 values x 2 B = 1,152 B in BF16 (FP8: 576 B, scales
        left out)."""
        per_value = 2.0 if self.kv_cache_dtype == "bf16" else 1.0
        return (self.kv_lora_rank + self.qk_rope_head_dim) * per_value

    def _cached_entries(self, context_tokens: float) -> float:
        """Cache entries over all layers for one sequence of `context_tokens` (sliding bounded by the window)."""
        counts = self._layer_counts
        return (counts["full"] * context_tokens + counts["sliding"] * min(context_tokens, self.sliding_window)
                + counts["compressed"] * math.ceil(context_tokens / self.compression_ratio))

    def kv_bytes(self, context_tokens: int) -> float:
        """Bytes of one sequence's cache at `context_tokens` tokens, all layers (V3, BF16: 70.3 kB per token)."""
        if context_tokens < 0:
            raise ValueError(f"context_tokens={context_tokens} must be >= 0")
        return self._cached_entries(context_tokens) * self.kv_bytes_per_token_per_layer

    def kv_bytes_per_token(self, context_tokens: int | None = None) -> float:
        """Cache bytes per token of context, all layers.

        With `context_tokens`, the average over a sequence of that length (sliding layers bounded by their window);
        without, the growth per extra token of a long sequence (sliding layers add nothing).
        """
        if context_tokens is None:
            counts = self._layer_counts
            return (counts["full"] + counts["compressed"] / self.compression_ratio) * self.kv_bytes_per_token_per_layer
        if context_tokens <= 0:
            raise ValueError(f"context_tokens={context_tokens} must be > 0 (or None for the per-token growth)")
        return self.kv_bytes(context_tokens) / context_tokens

    # ---- FLOPs --------------------------------------------------------------------------------------------------

    def _linear_flops_per_token(self, with_head: bool) -> FlopCount:
        """Weight-matrix FLOPs of one token through every layer (2 per weight used)."""
        return FlopCount(
            attention_core=0.0,
            attention_linear=2.0 * self.num_layers * self.attention_params_per_layer,
            routed_linear=2.0 * self.num_moe_layers * self.top_k * self.expert_params,
            dense_linear=2.0 * (self._dense_part_params() + (self.embedding_params if with_head else 0)),
        )

    def flops_per_token(self, context_tokens: int) -> FlopCount:
        """FLOPs to decode one token that attends to `context_tokens` cached tokens, output head included.

        Decode runs MLA in its absorbed form: per head and cached entry, scores over 576 values and a weighted sum
        over 512, so 2 x 128 x (576 + 512) = 278.5k FLOPs per entry and layer in V3; the absorbed up-projections
        cost as much as the plain ones, so the linear part is 2 x active weights either way.
        """
        if context_tokens < 0:
            raise ValueError(f"context_tokens={context_tokens} must be >= 0")
        per_entry = 2.0 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        core = per_entry * self._cached_entries(context_tokens)
        linear = self._linear_flops_per_token(with_head=True)
        return FlopCount(core, linear.attention_linear, linear.routed_linear, linear.dense_linear)

    def _causal_pairs(self, kind: LayerKind, new_tokens: int, cached_tokens: int) -> float:
        """(query, key) pairs of one layer when `new_tokens` follow `cached_tokens` (each query sees itself)."""
        n, c = new_tokens, cached_tokens
        if kind == "full":
            return n * c + n * (n + 1) / 2
        if kind == "compressed":
            return (n * c + n * (n + 1) / 2) / self.compression_ratio
        # sliding: query at position p (c < p <= c + n) sees min(p, window) keys
        w, first, last = self.sliding_window, c + 1, c + n
        if last <= w:
            return (first + last) * n / 2
        if first > w:
            return float(n * w)
        return (first + w) * (w - first + 1) / 2 + (last - w) * w

    def prefill_flops(self, new_tokens: int, cached_tokens: int = 0) -> FlopCount:
        """FLOPs in the decoder layers to prefill `new_tokens` after `cached_tokens` already cached (no head).

        Prefill runs MLA un-absorbed (per head, keys of 128 + 64 and values of 128 dims: 2 x 128 x (192 + 128) =
        81.9k FLOPs per query-key pair and layer), and first up-projects the cached latents it attends to
        (2 x 512 x 128 x 256 FLOPs per cached token and layer). Sliding layers see at most the window, so cached
        tokens beyond it cost nothing there.
        """
        if new_tokens < 0 or cached_tokens < 0:
            raise ValueError(f"new_tokens={new_tokens} and cached_tokens={cached_tokens} must be >= 0")
        if new_tokens == 0:
            return ZERO_FLOPS
        per_pair = 2.0 * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        up_per_cached = 2.0 * self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        core = 0.0
        up_projected = 0.0
        for kind, layers in self._layer_counts.items():
            if layers == 0:
                continue
            core += layers * per_pair * self._causal_pairs(kind, new_tokens, cached_tokens)
            seen = {"full": cached_tokens, "sliding": min(cached_tokens, self.sliding_window),
                    "compressed": cached_tokens / self.compression_ratio}[kind]
            up_projected += layers * up_per_cached * seen
        linear = self._linear_flops_per_token(with_head=False).scaled(new_tokens)
        return FlopCount(core, linear.attention_linear + up_projected, linear.routed_linear, linear.dense_linear)
