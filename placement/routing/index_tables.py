"""Fixed-shape gathers and index tables shared by the routers: no padded copies, no data-dependent shapes.

Legend: N values, K keys, W the most values of one key.
"""

import numpy as np
import torch


def take(values_N: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values_N[index], 0 where index >= N (a sink): a gather without building a padded copy of values_N."""
    size = values_N.shape[0]
    if size == 0:
        return torch.zeros(index.shape, dtype=values_N.dtype, device=values_N.device)
    return torch.where(index < size, values_N[index.clamp_max(size - 1)], torch.zeros_like(values_N[:1]))



def grouped(key_N: np.ndarray, value_N: np.ndarray, num_keys: int, pad: int) -> np.ndarray:
    """[num_keys, W] int64: row k holds the values whose key is k, in their order, padded with `pad` (W >= 1)."""
    order = np.argsort(key_N, kind="stable")
    key, value = key_N[order], value_N[order]
    width = max(1, int(np.bincount(key, minlength=num_keys).max(initial=0)))
    table = np.full((num_keys, width), pad, dtype=np.int64)
    table[key, np.arange(len(key)) - np.searchsorted(key, key)] = value
    return table
