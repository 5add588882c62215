"""A background solve's answer as one int64 array, so that rank 0 hands it to every rank in one broadcast.

Legend: L layers, P slots, U fills, C chunks.

Layout: phy2log [L, P]; the static weights [L, P] and the fitted imbalance (NaN: none) as float64 bit patterns; the
fills [U, 8]; the chunks [C, 6]. The receivers know U and C from rank 0's per-step message, and L and P from the
placement serving, so they allocate the array before the broadcast.
"""

import numpy as np

from eplb.rebalance.background_solver import SolveResult
from placement import Placement


def packed_size(current: Placement, num_fills: int, num_chunks: int) -> int:
    """Length of `pack_answer`'s array for a placement of `current`'s shape."""
    return 2 * current.phy2log_LP.size + 1 + 8 * num_fills + 6 * num_chunks


def pack_answer(answer: SolveResult) -> np.ndarray:
    """The answer's placement, fitted level and weight moves as one int64 array (see the module's layout)."""
    placement = answer.placement
    floats = np.append(placement.weights_LP.reshape(-1).astype(np.float64),
                       np.nan if answer.fitted_imbalance is None else answer.fitted_imbalance)
    return np.concatenate([placement.phy2log_LP.reshape(-1).astype(np.int64), floats.view(np.int64),
                           answer.fills_U8.reshape(-1), answer.chunks_C6.reshape(-1)])


def unpack_answer(packed: np.ndarray, current: Placement, num_fills: int, num_chunks: int,
                  policy: str) -> tuple[Placement, float | None, np.ndarray, np.ndarray]:
    """The inverse of `pack_answer`: (placement, fitted level, fills_U8, chunks_C6), the placement checked
    (`PlacementFormatError` when it is not one for this group)."""
    cells = current.phy2log_LP.size
    phy2log = packed[:cells].reshape(current.phy2log_LP.shape)
    floats = packed[cells : 2 * cells + 1].view(np.float64)
    fills_U8 = packed[2 * cells + 1 : 2 * cells + 1 + 8 * num_fills].reshape(num_fills, 8)
    chunks_C6 = packed[2 * cells + 1 + 8 * num_fills :].reshape(num_chunks, 6)
    target = Placement(phy2log, floats[:-1].reshape(phy2log.shape), current.cluster, current.num_experts,
                       policy=policy)
    fitted = None if np.isnan(floats[-1]) else float(floats[-1])
    return target, fitted, fills_U8, chunks_C6
