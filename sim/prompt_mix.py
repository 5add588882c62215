"""Prompt lengths of a prefill batch drawn from a served mix rather than all at the mean.

A prefill's GEMMs cost the same per token whatever the prompt, but its attention grows with the square of the
prompt's length: with every other setting fixed, a batch's attention work follows E[P^2], not E[P]^2. A mix is
therefore summarised by its spread, E[P^2] / E[P]^2 (1 when every prompt has the mean length), which a request trace
gives directly (`length_spread`); a batch of n prompts takes n log-normal lengths with the mean and spread asked for
(`prompt_lengths`), the same n every time, so that capacity stays a deterministic, smooth function of the batch.
"""

from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist

import numpy as np


def length_spread(lengths: Sequence[int]) -> float:
    """E[P^2] / E[P]^2 of `lengths` (prompt lengths of a trace, say): 1 when all are equal."""
    values = np.asarray(lengths, dtype=float)
    if values.size == 0 or values.sum() <= 0:
        raise ValueError("lengths must hold at least one positive length")
    return float((values ** 2).mean() / values.mean() ** 2)


def prompt_lengths(mean: int, spread: float, count: int) -> list[int]:
    """`count` prompt lengths of mean `mean` and spread `spread` (E[P^2] / E[P]^2), both to rounding: the midpoint
    quantiles of a log-normal, its sigma chosen so that these `count` values have the spread (a few values cannot
    hold a long tail, so the sigma grows as `count` falls); all `mean` when `spread` is 1 or `count` is 1. The
    spread is capped at what `count` values can reach (`count` itself, one value holding all)."""
    if mean < 1 or count < 0:
        raise ValueError(f"mean={mean} must be >= 1 and count={count} >= 0")
    if spread < 1:
        raise ValueError(f"spread={spread} must be >= 1 (E[P^2] / E[P]^2 is never below 1)")
    if count <= 1 or spread == 1.0:
        return [mean] * count
    shape = _unit_shape(count, min(spread, 0.99 * count))
    scaled = shape * (mean / shape.mean())
    return [max(1, round(value)) for value in scaled]


@lru_cache(maxsize=4096)
def _unit_shape(count: int, spread: float) -> np.ndarray:
    """The `count` midpoint quantiles of exp(sigma Z) with the sigma that gives them `spread` (bisection)."""
    z = np.array([NormalDist().inv_cdf((index + 0.5) / count) for index in range(count)])
    low, high = 0.0, 1.0
    while length_spread(np.exp(high * z)) < spread:
        high *= 2.0
    for _ in range(60):
        sigma = (low + high) / 2.0
        low, high = (sigma, high) if length_spread(np.exp(sigma * z)) < spread else (low, sigma)
    values = np.exp(high * z)
    values.setflags(write=False)
    return values
