"""The expert imbalance of a group as a function of its load, from the project's placement code, with common random
numbers: the curve that capacity mode and the prefill batches read.

At a load of n tokens per card per step the busiest card carries `floor + noise / sqrt(n)` times the mean: `floor` is
what the placement leaves at any load (replica granularity, the forecast's error), `noise / sqrt(n)` what a step's
few tokens or few requests add, which the router's per-step split can only partly even out. The curve is a
least-squares fit of the served means at three loads, each replayed through `balance.policy` as `eplb replay` does,
the placements fitted on the largest load serving the lower ones too (a deployment fits on a window of many steps,
which holds far more tokens than one step at any batch).

- Request-level traffic (`balance.traffic: requests`, the default): each stage has its own traffic
  (`sim.engine.decode_balance.traffic_config`: decode under continuous batching, prefill in chunked batches of whole
  prompts) at its own loads (`REQUEST_CURVE_LOADS`). A lower load holds fewer requests, not the same ones thinned, so
  each load is a trace of its own, drawn from the same seed (the same popularity, drift and bursts).
- Independent tokens (`balance.traffic: tokens`): one synthetic trace per group shape at `CURVE_LOADS[-1]`, each
  lower load a binomial thinning of the trace above it (the same popular experts, the same steps, fewer tokens), so
  that the imbalance is a smooth, non-increasing function of the load.
- A routing trace of the user's (`balance.routing_trace`, the decode stage): the trace's consecutive steps pooled up
  to the top decode load on the group, each lower load a binomial thinning of it (`trace_at_loads`), replayed the
  same way: the imbalance the group's shape leaves on the traffic the trace stands for.

The fit never rises with the load, so a larger batch or a looser latency target never buys less throughput through
noise in the imbalance.
"""

import math
from dataclasses import dataclass, field, replace

import numpy as np

from sim.config import SimConfig, SimConfigError
from sim.engine.decode_balance import read_routing_trace, replay_basis, served_imbalance_T, synthetic_counts

CURVE_LOADS = (4, 64, 1024)  # tokens per card per step the imbalance is measured at: decode's few to prefill's many
# Under request-level traffic each stage has its own traffic and loads: a decode card's batch, a prefill card's
# chunk of whole prompts.
REQUEST_CURVE_LOADS = {"decode": (4, 32, 256), "prefill": (1024, 4096, 16384)}


@dataclass(frozen=True)
class LoadImbalance:
    """Imbalance against load of one group shape: `at(n) = floor + noise / sqrt(n)`, n tokens per card per step.

    Attributes:
        floor: imbalance at an unbounded load, >= 1.
        noise: the sampling-noise coefficient, >= 0.
        loads, measured: the loads (tokens per card per step) replayed and the mean served imbalance at each.
        basis: what each load's replay rests on (`decode_balance.replay_basis`: steps, window, refits, scored
            steps); empty for a curve fitted by hand.
    """

    floor: float
    noise: float
    loads: tuple[int, ...]
    measured: tuple[float, ...]
    basis: dict = field(default_factory=dict)

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


def load_imbalance(config: SimConfig, cards: int, slots: int, stage: str = "decode") -> LoadImbalance:
    """The curve of a group of `cards` cards with `slots` expert slots each under `config.balance`, for `stage`'s
    traffic ("decode" or "prefill"; cached per shape, stage and settings)."""
    model = config.model
    # What the traffic depends on: the balance and speculative settings and the prompts' shape, never the latency
    # targets or batch caps (a curve over targets measures the imbalance once).
    settings = config.model_dump_json(include={"balance": True, "speculative": True, "capacity": CURVE_FIELDS})
    key = (settings, model.num_routed_experts, model.top_k, model.expert_groups, config.cluster.cards_per_node,
           config.seed, cards, slots, stage)
    if key not in _CURVES:
        _CURVES[key] = _measure(config, cards, slots, stage)
    return _CURVES[key]


def curve_loads(config: SimConfig, stage: str) -> tuple[int, ...]:
    """The loads (tokens per card per step) the curve of `stage` is measured at, ascending."""
    return REQUEST_CURVE_LOADS[stage] if config.balance.traffic == "requests" else CURVE_LOADS


def trace_at_loads(counts_TLE: np.ndarray, cards: int, loads: tuple[int, ...], top_k: int,
                   seed: int) -> list[np.ndarray]:
    """A routing trace [T, L, E] brought to each of `loads` (tokens per card per step on `cards` cards), the top load
    first, then falling: consecutive steps summed until a step holds the top load (pooling, when the trace's steps
    are smaller), then each load a binomial thinning of the load above it (the same steps and experts, fewer
    tokens), so that every load has the same steps and the placements fitted on the top one serve the others.

    Raises:
        SimConfigError: pooled to the top load, the trace has fewer than 4 steps (a replay fits on some and serves
            the rest).
    """
    steps, layers, experts = counts_TLE.shape
    per_step = float(counts_TLE.sum(axis=(1, 2)).mean()) / (layers * top_k)  # tokens a step
    pool = max(1, math.ceil(loads[-1] * cards / max(per_step, 1e-9)))
    if steps // pool < 4:
        raise SimConfigError(f"balance.routing_trace holds {steps} steps of {per_step:,.0f} tokens; at "
                             f"{loads[-1]} tokens per card on {cards} cards a step needs {pool} of them, which "
                             f"leaves {steps // pool} steps to replay (at least 4): give a longer trace")
    pooled = counts_TLE[: steps // pool * pool].reshape(steps // pool, pool, layers, experts).sum(axis=1)
    thinning = np.random.default_rng([seed, cards, 29])
    traces, above, above_load = [], pooled, per_step * pool / cards
    for load in reversed(loads):
        if load < above_load:
            above = thinning.binomial(above, load / above_load)
            above_load = float(load)
        traces.append(above)
    return traces


def _measure(config: SimConfig, cards: int, slots: int, stage: str) -> LoadImbalance:
    loads = curve_loads(config, stage)
    node_limited = config.balance.node_limits if stage == "decode" else config.capacity.prefill_node_limits
    trace_TLE = read_routing_trace(config) if stage == "decode" else None
    if trace_TLE is not None:  # the user's own decode traffic, pooled and thinned to each load
        top, *lower = trace_at_loads(trace_TLE, cards, loads, config.model.top_k, config.seed)
        served_T = served_imbalance_T(config, cards, slots, top, tuple(lower), node_limited)
        curve = fit_load_imbalance(loads, tuple(float(steps.mean()) for steps in reversed(served_T)))
        return replace(curve, basis=replay_basis(config, top.shape[0]))
    counts_TLE = synthetic_counts(config, cards, loads[-1], stage)
    if config.balance.traffic == "requests":
        # Fewer tokens are fewer requests, not the same requests thinned: a trace of its own per load.
        lower = tuple(synthetic_counts(config, cards, load, stage) for load in loads[-2::-1])
    else:
        thinning = np.random.default_rng([config.seed, cards, slots])
        lower, above = [], counts_TLE
        for load, denser in zip(loads[-2::-1], loads[:0:-1]):
            above = thinning.binomial(above, load / denser)
            lower.append(above)
        lower = tuple(lower)
    served_T = served_imbalance_T(config, cards, slots, counts_TLE, lower, node_limited)  # top load, then falling
    curve = fit_load_imbalance(loads, tuple(float(steps.mean()) for steps in reversed(served_T)))
    return replace(curve, basis=replay_basis(config, counts_TLE.shape[0]))


_CURVES: dict[tuple, LoadImbalance] = {}  # (settings, E, K, groups, cards a node, seed, cards, slots, stage) -> curve
# of `capacity`, what a curve depends on: the prefill traffic's shape, and node limits on a prefill instance
CURVE_FIELDS = {"prompt_tokens", "cached_share", "prompt_length_spread", "prefill_node_limits"}
