"""What a decode worker runs each step: the MoE decode layer, its config, gate and experts, the choice of replica for
each token pick, and the load recorder.

The names are imported on first access (PEP 562), so that importing one module of the package does not import torch
for all of them.
"""

from traces.lazy_exports import lazy_getattr

_NAMES = {  # name -> the module that defines it
    "ExpertWeights": "eplb.live.experts",
    "LoadRecorder": "eplb.live.load_recorder",
    "count_picks_E": "eplb.live.load_recorder",
    "MoELayerConfig": "eplb.live.moe_config",
    "MoEDecodeLayer": "eplb.live.moe_layer",
    "ROUTING_MODES": "eplb.live.replica_assignment",
}

__all__ = sorted(_NAMES)


__getattr__ = lazy_getattr(__name__, _NAMES)
