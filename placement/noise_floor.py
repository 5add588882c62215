"""The noise floor: the imbalance of a perfect expectation, sampled (`placement.yardsticks` says what it is for).

A step's tokens are a sample of the traffic's expected load. Spread a step's picks over cells (cards, nodes, routing
groups) whose expected loads are exactly equal, and the busiest cell still carries more than the mean: that excess
is the load's own noise, which no placement chosen before the step removes under a static split.
"""

import functools

import numpy as np

NOISE_SAMPLES = 4000  # draws of the Monte Carlo
NOISE_SEED = 0


def noise_floor(picks: float, cells: int, samples: int = NOISE_SAMPLES, seed: int = NOISE_SEED) -> float:
    """Mean max / mean over `samples` draws of `picks` picks (rounded to a whole number) spread uniformly at random
    over `cells` equal cells (cards, nodes or routing groups): the imbalance of a perfect expectation, sampled.

    1.0 for one cell or no pick. Deterministic (a fixed seed): the same arguments give the same float anywhere.
    """
    return _noise_floor(int(round(picks)), int(cells), int(samples), int(seed))


@functools.lru_cache(maxsize=4096)
def _noise_floor(picks: int, cells: int, samples: int, seed: int) -> float:
    if cells <= 1 or picks <= 0:
        return 1.0
    rng = np.random.default_rng([seed, picks % 2**32, cells])
    draws = rng.multinomial(picks, np.full(cells, 1.0 / cells), size=samples)
    return float((draws.max(axis=1) * cells / picks).mean())
