"""One room per serving engine, each owning its policy or plugin, what the project writes for the engine and how it
scores like the engine: `vllm`, `sglang`, `trtllm`, `deepseek`, `transformers` (each with a README.md); `arguments`
checks the arguments the engines pass. What the engines record is read in `traces/` (`sglang_dump`,
`trtllm_statistics`), since replay and the simulator read those files too.

The drop-in policies are exported here: DeepSeek's `rebalance_experts` function (`deepseek.policy`) and vLLM's EPLB
policy classes (`vllm.policy`: `CpsatEplbPolicy` for vLLM 0.23 and later, `LegacyCpsatEplbPolicy` for the 3-tuple of
vLLM 0.14 to 0.18). Each name is imported on first access, so `rebalance_experts` never imports vLLM."""

from traces.lazy_exports import lazy_getattr

# Public names -> the module that defines them (PEP 562).
_LAZY = {
    "rebalance_experts": "eplb.engines.deepseek.policy",
    "CpsatEplbPolicy": "eplb.engines.vllm.policy",
    "LegacyCpsatEplbPolicy": "eplb.engines.vllm.policy",
    "register_in_vllm": "eplb.engines.vllm.policy",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
