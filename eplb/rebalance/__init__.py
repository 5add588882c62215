"""Changing the placement of a running EP group without stopping decode: the rebalancer's per-step protocol, the
background solve and its answer, move planning and weight moves, host copies, the CPU pacer, and recovery when ranks
die (the survivors' placement and the regrouped communicator).

The names are imported on first access (PEP 562), so that the solver's helper process (`background_solver`,
`move_plan`) starts without importing torch.
"""

import importlib

_NAMES = {  # name -> the module that defines it
    "RebalanceConfig": "eplb.rebalance.config",
    "Rebalancer": "eplb.rebalance.rebalancer",
    "RecoveryReport": "eplb.rebalance.rebalancer",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
