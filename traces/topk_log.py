"""Top-k id logs: which experts each token picked, grouped into decode steps of a fixed number of tokens.

Legend: L layers, N tokens, K top-k, T steps, E logical experts.
The layout read is the ESFT routing logs' (DeepSeek-V2-Lite): an `.npz` holding `<task>_topk_ids` [L, N, K] per
task (docs/formats.md, 'Top-k id logs').
"""

import numpy as np

from traces.errors import TraceFormatError
from traces.routing_trace import check_read_shape

_CHUNK_IDS = 1 << 22  # picks counted at once


def counts_from_topk_ids(topk_ids_LNK: np.ndarray, num_experts: int, tokens_per_step: int) -> np.ndarray:
    """Group tokens into steps and count picks per expert.

    Args:
        topk_ids_LNK: [L, N, K] integer, the expert ids each token picked at each layer; -1 marks no pick.
        num_experts: E, the number of logical experts per layer.
        tokens_per_step: consecutive tokens that form one step; a last partial step is dropped.

    Returns:
        counts_TLE: [T, L, E] int64 with T = N // tokens_per_step.
    """
    ids = np.asarray(topk_ids_LNK)
    if ids.ndim != 3:
        raise TraceFormatError(f"top-k ids must have shape [layers, tokens, top_k]; found {tuple(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise TraceFormatError(f"top-k ids must be integers; found dtype {ids.dtype}")
    if tokens_per_step < 1:
        raise TraceFormatError(f"tokens_per_step must be >= 1; got {tokens_per_step}")
    num_layers, num_tokens, _ = ids.shape
    num_steps = num_tokens // tokens_per_step
    if num_steps == 0:
        raise TraceFormatError(
            f"the log has {num_tokens} tokens, fewer than one step of {tokens_per_step}; lower tokens_per_step"
        )
    if ids.size and ids.max() >= num_experts:
        raise TraceFormatError(f"top-k ids reach {ids.max()} but the model has {num_experts} experts")
    if ids.size and ids.min() < -1:
        raise TraceFormatError(f"top-k ids contain {ids.min()}; expected ids in [0, {num_experts}) or -1")
    check_read_shape((num_steps, num_layers, num_experts), "the top-k log's counts (steps x layers x experts)")
    counts = np.zeros((num_steps, num_layers, num_experts), dtype=np.int64)
    # Steps a chunk at a time, so that the temporaries stay a few MiB whatever the log's size.
    chunk = max(1, _CHUNK_IDS // max(1, num_layers * tokens_per_step * ids.shape[2]))
    for first in range(0, num_steps, chunk):
        last = min(num_steps, first + chunk)
        part = ids[:, first * tokens_per_step: last * tokens_per_step].astype(np.int64)
        # Flat bin of each pick: ((step * L) + layer) * E + expert; -1 picks go to a spill bin that is dropped.
        step_N = np.arange((last - first) * tokens_per_step) // tokens_per_step
        layer_L = np.arange(num_layers)
        bins = (step_N[None, :, None] * num_layers + layer_L[:, None, None]) * num_experts + part
        size = (last - first) * num_layers * num_experts
        bins = np.where(part < 0, size, bins)
        counts[first:last] = np.bincount(bins.ravel(), minlength=size + 1)[:size].reshape(last - first, num_layers,
                                                                                          num_experts)
    return counts

def topk_tasks(keys: list[str]) -> list[str]:
    """The task names of the `<task>_topk_ids` arrays among `keys`, in file order."""
    suffix = "_topk_ids"
    return [k[: -len(suffix)] for k in keys if k.endswith(suffix)]
