"""The public face of the balancer: what a decode worker imports (`eplb.live`), the rebalancer that changes a running
group's placement (`eplb.rebalance`), one room per serving engine (`eplb.engines`: its policy, the files written for
it, its scoring), and the `eplb` command line (`eplb.cli`).

Offline: `load_trace`, `fit_placement`, `score_placement`, `load_placement`, `save_placement`.
Live (torch; imported on first use, so the command line starts without torch): `MoEDecodeLayer`,
`MoELayerConfig`, `LoadRecorder`, `Rebalancer` and `RebalanceConfig`, `init_communicator` and `CollectiveError`, and
the drop-in policies `rebalance_experts` (DeepSeek's interface) and `CpsatEplbPolicy` (vLLM's policy interface).
"""

from placement import ClusterSpec, Placement, fit_placement, load_placement, save_placement, score_placement
from traces import EplbError, RoutingTrace, load_trace, save_trace
from traces.lazy_exports import lazy_getattr

# Live names -> the module that defines them, imported on first access (PEP 562).
_LAZY = {
    "MoEDecodeLayer": "eplb.live",
    "MoELayerConfig": "eplb.live",
    "LoadRecorder": "eplb.live",
    "ExpertWeights": "eplb.live",
    "Rebalancer": "eplb.rebalance",
    "RebalanceConfig": "eplb.rebalance",
    "rebalance_experts": "eplb.engines.deepseek.policy",
    "CpsatEplbPolicy": "eplb.engines.vllm.policy",
    "LegacyCpsatEplbPolicy": "eplb.engines.vllm.policy",
    "init_communicator": "collectives",
    "Communicator": "collectives",
    "CollectiveError": "collectives",
}

__all__ = [
    "ClusterSpec",
    "EplbError",
    "Placement",
    "RoutingTrace",
    "fit_placement",
    "load_placement",
    "load_trace",
    "save_placement",
    "save_trace",
    "score_placement",
    *sorted(_LAZY),
]


__getattr__ = lazy_getattr(__name__, _LAZY)
