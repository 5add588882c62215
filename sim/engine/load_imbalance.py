"""The expert imbalance of a group as a function of its load, from the project's placement code, with common random
numbers: the curve that capacity mode and the prefill batches read.

At a load of n tokens per card per step the busiest card carries `floor + noise / sqrt(n)` times the mean: `floor` is
what the placement leaves at any load (replica granularity, the forecast's error), `noise / sqrt(n)` the sampling
noise of a step's few tokens, which the router's per-step split can only partly even out. Both come from one synthetic
routing trace per group shape (`CURVE_LOADS[-1]` tokens per card per step), replayed through `balance.policy` as `eplb
replay` does; the placements it fits also serve the lower `CURVE_LOADS`, each a binomial thinning of the trace above
it (the same popular experts, the same steps, fewer tokens), since a deployment fits on a window of many steps, which
holds far more tokens than one step at any batch. The curve is a least-squares fit of the served means at the three
loads. One trace for every load level, rather than a fresh draw per level, makes the imbalance a smooth,
non-increasing function of the load, so that a larger batch or a looser latency target never buys less throughput
through noise in the imbalance.
"""

import math
from dataclasses import dataclass

import numpy as np

from sim.config import SimConfig
from sim.engine.decode_balance import served_imbalance_T, synthetic_counts

CURVE_LOADS = (4, 64, 1024)  # tokens per card per step the imbalance is measured at: decode's few to prefill's many


@dataclass(frozen=True)
class LoadImbalance:
    """Imbalance against load of one group shape: `at(n) = floor + noise / sqrt(n)`, n tokens per card per step.

    Attributes:
        floor: imbalance at an unbounded load, >= 1.
        noise: the sampling-noise coefficient, >= 0.
        loads, measured: the loads (tokens per card per step) replayed and the mean served imbalance at each.
    """

    floor: float
    noise: float
    loads: tuple[int, ...]
    measured: tuple[float, ...]

    def at(self, tokens_per_card: float) -> float:
        """Imbalance at `tokens_per_card` tokens per card per step (at least one token)."""
        return self.floor + self.noise / math.sqrt(max(1.0, tokens_per_card))


def fit_load_imbalance(loads: tuple[int, ...], measured: tuple[float, ...]) -> LoadImbalance:
    """Least-squares `floor + noise / sqrt(load)` through the measured points, with noise >= 0 and floor >= 1."""
    x = 1.0 / np.sqrt(np.asarray(loads, dtype=float))
    y = np.asarray(measured, dtype=float)
    noise, floor = np.polyfit(x, y, 1) if len(set(loads)) > 1 else (0.0, float(y.mean()))
    if noise < 0:  # more tokens looked worse: noise within the replay's own, taken as flat
        noise, floor = 0.0, float(y.mean())
    if floor < 1.0:
        floor = 1.0
        noise = max(0.0, float(np.dot(x, y - 1.0) / np.dot(x, x)))
    return LoadImbalance(float(floor), float(noise), tuple(loads), tuple(float(v) for v in measured))


def load_imbalance(config: SimConfig, cards: int, slots: int) -> LoadImbalance:
    """The curve of a group of `cards` cards with `slots` expert slots each under `config.balance` (cached per shape
    and balance settings)."""
    model = config.model
    key = (config.balance.model_dump_json(), model.num_routed_experts, model.top_k, config.seed, cards, slots)
    if key not in _CURVES:
        _CURVES[key] = _measure(config, cards, slots)
    return _CURVES[key]


def _measure(config: SimConfig, cards: int, slots: int) -> LoadImbalance:
    counts_TLE = synthetic_counts(config, cards, CURVE_LOADS[-1])
    thinning = np.random.default_rng([config.seed, cards, slots])
    thinner, above = [], counts_TLE
    for load, denser in zip(CURVE_LOADS[-2::-1], CURVE_LOADS[:0:-1]):
        above = thinning.binomial(above, load / denser)
        thinner.append(above)
    served_T = served_imbalance_T(config, cards, slots, counts_TLE, tuple(thinner))  # top load first, then falling
    return fit_load_imbalance(CURVE_LOADS, tuple(float(steps.mean()) for steps in reversed(served_T)))


_CURVES: dict[tuple, LoadImbalance] = {}  # (balance settings, E, K, seed, cards, slots) -> curve
