"""Drop-in policies for other engines: DeepSeek's `rebalance_experts` function and vLLM's EPLB policy class."""

from eplb.adapters.policies import CpsatEplbPolicy, rebalance_experts

__all__ = ["CpsatEplbPolicy", "rebalance_experts"]
