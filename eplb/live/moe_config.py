"""The shape and gate of one MoE decode layer, as DeepSeek-V3, DeepSeek-V4 and Qwen3-MoE configure it."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MoELayerConfig(BaseModel):
    """One MoE layer: a gate picking top-k routed experts per token, SwiGLU experts, optional shared experts.

    Example (DeepSeek-V3): hidden_size 7168, intermediate_size 2048, num_experts 256, top_k 8, scoring "sigmoid",
    n_group 8, topk_group 4, routed_scaling_factor 2.5, norm_topk_prob True, num_shared_experts 1.
    DeepSeek-V4: scoring "sqrtsoftplus", norm_topk_prob True, routed_scaling_factor 1.5, swiglu_limit 10,
    num_shared_experts 1, and hash_routing True in its first layers (experts from a token-id table).
    Qwen3-MoE: scoring "softmax", norm_topk_prob as configured, no shared expert.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(ge=1, description="D: width of a token's hidden state.")
    intermediate_size: int = Field(ge=1, description="F: inner width of one routed SwiGLU expert.")
    num_experts: int = Field(ge=1, description="E: routed (logical) experts.")
    top_k: int = Field(ge=1, description="K: routed experts each token picks.")
    scoring: Literal["softmax", "sigmoid", "sqrtsoftplus"] = Field(
        "softmax", description="Gate scores from the router logits (sqrtsoftplus: sqrt(softplus(logit)), DeepSeek-V4)."
    )
    n_group: int = Field(1, ge=1, description="Expert groups for group-limited routing (1: off).")
    topk_group: int = Field(1, ge=1, description="Groups each token may pick its experts from (<= n_group).")
    use_correction_bias: bool = Field(
        False, description="Add a per-expert bias to the scores for choosing experts only (DeepSeek-V3's aux-free "
                           "balancing); the weights come from the unbiased scores."
    )
    norm_topk_prob: bool = Field(False, description="Renormalise the top-k weights of each token to sum to 1.")
    routed_scaling_factor: float = Field(1.0, gt=0, description="Factor on the routed experts' weighted sum.")
    num_shared_experts: int = Field(0, ge=0, description="Shared experts every token passes through (0: none).")
    hash_routing: bool = Field(
        False, description="Pick each token's experts from a frozen token-id table `tid2eid` [vocab, K] (DeepSeek-V4's "
                           "hash layers); the weights are still the gate's scores at those experts."
    )
    swiglu_limit: float | None = Field(
        None, gt=0, description="Clamp inside the SwiGLU experts, routed and shared (DeepSeek-V4): the gate "
                                "projection at most this, the up projection within +-this (None: no clamp)."
    )

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "MoELayerConfig":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if self.num_experts % self.n_group:
            raise ValueError(f"n_group={self.n_group} must divide num_experts={self.num_experts}")
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
        if self.topk_group * (self.num_experts // self.n_group) < self.top_k:
            raise ValueError(
                f"topk_group={self.topk_group} groups of {self.num_experts // self.n_group} experts hold fewer than "
                f"top_k={self.top_k} experts"
            )
        if self.hash_routing and (self.n_group > 1 or self.use_correction_bias):
            raise ValueError("hash_routing picks experts from a table: it takes no n_group > 1 and no correction bias")
        return self
