"""Fixed-shape gathers and index tables shared by the routers: no padded copies, no data-dependent shapes.

Legend: R values (the entries a table holds or a gather reads), W the width of a grouped table (the most values
of one key).
"""

import numpy as np
import torch


def take(values_R: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values_R[index], 0 where index >= R (a sink): a gather without building a padded copy of values_R."""
    size = values_R.shape[0]
    if size == 0:
        return torch.zeros(index.shape, dtype=values_R.dtype, device=values_R.device)
    return torch.where(index < size, values_R[index.clamp_max(size - 1)], torch.zeros_like(values_R[:1]))


UNROLL_MAX = 8  # scans over at most this many entries unroll, when compiled, into elementwise code


def prefix_sums(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive prefix sums along `dim`, as `cumsum`. Compiled, over a few entries, unrolled into additions that
    the compiler fuses with the code around them (a scan is a separate kernel). Integers give the same values;
    floats may differ from an eager `cumsum` in the last bits (it may accumulate in higher precision)."""
    if values.shape[dim] > UNROLL_MAX or not torch.compiler.is_compiling():
        return values.cumsum(dim)
    parts = list(values.unbind(dim))
    for index in range(1, len(parts)):
        parts[index] = parts[index - 1] + parts[index]
    return torch.stack(parts, dim)


def prefix_minima(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive prefix minima along `dim`, as `cummin(dim).values`, unrolled when compiled as `prefix_sums`."""
    if values.shape[dim] > UNROLL_MAX or not torch.compiler.is_compiling():
        return values.cummin(dim).values
    parts = list(values.unbind(dim))
    for index in range(1, len(parts)):
        parts[index] = torch.minimum(parts[index - 1], parts[index])
    return torch.stack(parts, dim)


def grouped(key_R: np.ndarray, value_R: np.ndarray, num_keys: int, pad: int) -> np.ndarray:
    """[num_keys, W] int64: row k holds the values whose key is k, in their order, padded with `pad` (W >= 1).

    The keys index whatever the table's rows are (GPUs, span classes), so their count is `num_keys`, not a letter.
    """
    order = np.argsort(key_R, kind="stable")
    key, value = key_R[order], value_R[order]
    width = max(1, int(np.bincount(key, minlength=num_keys).max(initial=0)))
    table = np.full((num_keys, width), pad, dtype=np.int64)
    table[key, np.arange(len(key)) - np.searchsorted(key, key)] = value
    return table
