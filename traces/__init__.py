"""Routing traces: counts per expert, step and layer; readers, writers, validation and synthetic generators."""

from traces.atomic_file import write_atomically, write_text_atomically
from traces.errors import EplbError, TraceFormatError
from traces.routing_trace import RoutingTrace, TraceHeader, validate_counts
from traces.topk_log import counts_from_topk_ids
from traces.trace_io import load_trace, save_trace

__all__ = [
    "EplbError",
    "RoutingTrace",
    "TraceFormatError",
    "TraceHeader",
    "counts_from_topk_ids",
    "load_trace",
    "save_trace",
    "validate_counts",
    "write_atomically",
    "write_text_atomically",
]
