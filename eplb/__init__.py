"""The public face of the balancer: the `eplb` command line (and, as it grows, the live decode-worker library)."""

from placement import ClusterSpec, Placement, fit_placement, load_placement, save_placement, score_placement
from traces import EplbError, RoutingTrace, load_trace, save_trace

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
]
