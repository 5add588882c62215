"""Drop-in policies for other engines: DeepSeek's `rebalance_experts` function (`deepseek_policy`) and vLLM's EPLB
policy classes (`vllm_policy`: `CpsatEplbPolicy` for vLLM 0.23 and later, `LegacyCpsatEplbPolicy` for the 3-tuple of
vLLM 0.14 to 0.18). Each name is imported on first access, so `rebalance_experts` never imports vLLM."""

import importlib

# Public names -> the module that defines them (PEP 562).
_LAZY = {
    "rebalance_experts": "eplb.adapters.deepseek_policy",
    "CpsatEplbPolicy": "eplb.adapters.vllm_policy",
    "LegacyCpsatEplbPolicy": "eplb.adapters.vllm_policy",
    "register_in_vllm": "eplb.adapters.vllm_policy",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eplb.adapters' has no attribute {name!r}")
