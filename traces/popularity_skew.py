"""How skewed a layer's expert popularity is, measured on real routing, and the generator's skew that matches it.

Legend: L layers, E experts, Z traffic domains.

The spread of a load [L, E] is the standard deviation over experts of the log load, averaged over layers: for a
lognormal popularity of sigma s it is s. A generator that mixes Z domains (`traces.synthetic`: each domain its own
lognormal popularity of sigma `skew`, correlated by `domain_overlap`, mixed by a drifting share) has a pooled
popularity less spread than any one domain, so a spread measured on pooled real routing (tasks or domains served
together) is matched by a larger `skew`: `generator_skew_for` finds it on the generator's own pooled popularity.
"""

import functools

import numpy as np

from traces.synthetic import SyntheticConfig, _domain_popularity_ZLE, _streams, domain_mix_TZ

# Measured on ../shared/data by `log_load_spread` (tests/traces/test_popularity_skew.py checks both where the data
# is present): ESFT's four tasks pooled (DeepSeek-V2-Lite architecture, 26 layers x 64 experts, top-6) and OLMoE's
# five domains pooled (arxiv, book, c4, github, wikipedia; layers 0, 7, 15 x 64 experts, top-8).
ESFT_POOLED_SPREAD = 0.510
OLMOE_POOLED_SPREAD = 0.394
# The generator's pooled popularity is measured at the default shape over these seeds and steps.
_SEEDS, _STEPS, _LAYERS, _EXPERTS = (0, 1, 2, 3), 2000, 61, 256


def log_load_spread(load_LE: np.ndarray) -> float:
    """Mean over layers of the standard deviation over experts of log load [L, E] (an expert with no token counts as
    1e-9 of one, far below the rest)."""
    load = np.asarray(load_LE, dtype=np.float64)
    if load.ndim != 2 or load.shape[1] < 2:
        raise ValueError(f"load_LE must be [L, E] with E >= 2; got shape {load.shape}")
    return float(np.log(np.maximum(load, 1e-9)).std(axis=1).mean())


def generator_pooled_spread(skew: float) -> float:
    """The spread of `traces.synthetic`'s popularity pooled over a drifting mix (its default domains, overlap and
    drift; request-level traffic shares it), at lognormal sigma `skew`, averaged over a few seeds."""
    return _pooled_spread(round(float(skew), 6))


@functools.lru_cache(maxsize=256)
def _pooled_spread(skew: float) -> float:
    spreads = []
    for seed in _SEEDS:
        config = SyntheticConfig(num_steps=_STEPS, num_layers=_LAYERS, num_experts=_EXPERTS, seed=seed, skew=skew)
        popularity_rng, mix_rng, _, _ = _streams(config)
        popularity_ZLE = _domain_popularity_ZLE(config, popularity_rng)
        pooled_LE = np.tensordot(domain_mix_TZ(config, mix_rng).mean(axis=0), popularity_ZLE, axes=1)
        spreads.append(log_load_spread(pooled_LE))
    return float(np.mean(spreads))


def generator_skew_for(spread: float, tolerance: float = 1e-3) -> float:
    """The generator's lognormal sigma whose pooled popularity has the measured `spread` (bisection on
    `generator_pooled_spread`, which grows with the sigma)."""
    if not 0 < spread < 10:
        raise ValueError(f"spread must be a log-load standard deviation in (0, 10); got {spread}")
    low, high = 0.0, 20.0
    while high - low > tolerance:
        middle = 0.5 * (low + high)
        low, high = (middle, high) if generator_pooled_spread(middle) < spread else (low, middle)
    return round(0.5 * (low + high), 3)
