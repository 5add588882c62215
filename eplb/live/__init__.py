"""What a decode worker imports: the MoE decode layer, its config and gate, the load recorder, and the rebalancer
that changes the placement of a running group and survives a lost rank.

The names are imported on first access (PEP 562), so that a module of this package that needs no torch (the
rebalancer's helper process: `background_solver`, `move_plan`) starts without importing it.
"""

import importlib

_NAMES = {  # name -> the module that defines it
    "ExpertWeights": "eplb.live.experts",
    "LoadRecorder": "eplb.live.load_recorder",
    "count_picks_E": "eplb.live.load_recorder",
    "MoELayerConfig": "eplb.live.moe_config",
    "MoEDecodeLayer": "eplb.live.moe_layer",
    "RebalanceConfig": "eplb.live.rebalance_config",
    "Rebalancer": "eplb.live.rebalancer",
    "RecoveryReport": "eplb.live.rebalancer",
    "ROUTING_MODES": "eplb.live.replica_assignment",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
