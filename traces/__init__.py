"""Routing traces (counts per expert, step and layer: readers, writers, validation, synthetic generators) and
request traces for the simulator (Mooncake JSONL, Azure CSV)."""

from traces.atomic_file import write_atomically, write_text_atomically
from traces.errors import EplbError, TraceFormatError
from traces.request_trace import Request, load_request_trace
from traces.routing_trace import RoutingTrace, TraceHeader, validate_counts
from traces.topk_log import counts_from_topk_ids
from traces.trace_io import load_trace, save_trace

__all__ = [
    "EplbError",
    "Request",
    "RoutingTrace",
    "TraceFormatError",
    "TraceHeader",
    "counts_from_topk_ids",
    "load_request_trace",
    "load_trace",
    "save_trace",
    "validate_counts",
    "write_atomically",
    "write_text_atomically",
]
