"""Rolling replay: re-fit every `every` steps from the last `window` steps, score the steps that follow.

This is what a live system does: it can only fit on traffic it has already seen. The first fit happens after
`window` steps; steps [0, window + lag) are never scored. Beside the held-out score, each fit is also scored on
its own window (the "fitted" score), so the gap between the two shows how much a policy over-fits.

Refit on drift (`drift_ratio`, off by default): a fixed cadence (vLLM's `step_interval`, SGLang's rebalance every
N iterations) serves a placement fitted on old traffic until the next refit, so after an abrupt change (a new
tenant or task) every policy serves the wrong placement for up to `every` steps. With `drift_ratio` R, a served
step whose imbalance (mean over layers, under the routing scored) exceeds R times the placement's imbalance on its
own window marks the start of new traffic: the policy refits at once, on the steps since that start only (the
window's older steps belong to the old traffic), and later refits use those steps until the window is full of them.
A second trigger within `window` steps of the start refits again on the steps since the start (a placement fitted
on one or two steps is noisy; that is not a new change). Measured on the ESFT logs replayed task after task
(`scripts/bench_placement.py`, 8-step windows, dynamic routing, R = 1.4): see the README, "Benchmarks". At
R = 1.3 noise alone fired it within ESFT tasks at 32 GPUs x 3 slots (48 tokens per GPU per step); 1.4 never did there
and caught the same task switches.

Lag (`lag`, 0 by default): a live group cannot serve a placement on the step after its fit window ends. Solving
takes time (10 s for `cpsat` at its default budget) and so does moving the weights, while a decode step takes about
50 ms, so the old placement serves a few hundred steps more. With lag L, the placement fitted at step f (on steps
ending at f) serves [f + L, f' + L), f' being the next fit; the held-out steps are [window + L, T). A drifted step d
found while a placement serves starts a fit at d + 1 whose placement serves from d + 1 + L; until then the
placement serving keeps serving, and the steps served in between (its fit is in flight) trigger nothing. When d
falls after scheduled fits have started (possible only with L > 0), they still land, each serving from its own
f' + L, and the refit on drift follows them, serving from d + 1 + L. Lag 0 is the replay without lag, step for
step.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import PlacementInfeasibleError
from placement.placement_model import Placement
from placement.policies import fit_placement
from placement.scoring import Routing, StepScores, score_placement


@dataclass(frozen=True)
class ReplayResult:
    """What a rolling replay measured.

    Attributes:
        held_out: scores of the steps each placement served, [T - window - lag, L] in trace order (steps
            [window + lag, T)).
        fitted: scores of each placement on the window it was fitted on, stacked.
        refit_steps: the trace step at which each placement started serving: the end of its fit window + lag.
        fit_seconds: wall time of each fit.
        held_out_also: the held-out steps scored under each routing of `also_routings` as well (same placements).
        last: the placement of the last fit (the one a live system would be serving at the end).
        fit_windows: the trace steps [first, stop) each placement was fitted on; its fit starts at step stop.
        drift_steps: the served steps whose imbalance triggered a refit on drift, in trace order.
        lag: steps from the end of each fit window until its placement serves.
    """

    held_out: StepScores
    fitted: StepScores
    refit_steps: list[int]
    fit_seconds: list[float]
    held_out_also: dict[str, StepScores] = field(default_factory=dict)
    last: Placement | None = None
    fit_windows: list[tuple[int, int]] = field(default_factory=list)
    drift_steps: list[int] = field(default_factory=list)
    lag: int = 0

    def summary(self) -> dict:
        """Held-out summary (the contract keys) plus the fitted summary, fit timing and the lag."""
        result = self.held_out.summary()
        fitted = self.fitted.summary()
        result.update(
            {
                "fitted_imbalance_mean": fitted["imbalance_mean"],
                "fitted_lower_bound": fitted["lower_bound"],
                "refits": len(self.refit_steps),
                "drift_refits": len(self.drift_steps),
                "fit_seconds_mean": float(np.mean(self.fit_seconds)),
                "fit_seconds_max": float(np.max(self.fit_seconds)),
                "lag": self.lag,
            }
        )
        return result


def drifted_steps(served_imbalance_T: np.ndarray, fitted_imbalance: float, drift_ratio: float) -> np.ndarray:
    """[T] bool: the served steps whose imbalance (mean over layers) exceeds `drift_ratio` times the placement's
    fitted imbalance (mean over its fit window): the refit-on-drift trigger, shared by the replay and the live
    rebalancer."""
    return np.asarray(served_imbalance_T, dtype=float) > drift_ratio * float(fitted_imbalance)


def rolling_replay(
    counts_TLE: np.ndarray,
    cluster: ClusterSpec,
    policy: str,
    every: int,
    window: int,
    routing: Routing = "static",
    policy_options: dict | None = None,
    on_refit: Callable[[int, int], None] | None = None,
    also_routings: tuple[Routing, ...] = (),
    drift_ratio: float | None = None,
    lag: int = 0,
) -> ReplayResult:
    """Replay `counts_TLE` [T, L, E] with a re-fit every `every` steps on the last `window` steps.

    `on_refit(done, total)` is called after each fit has served its steps: `done` of the `total` steps to score
    (for progress bars). `also_routings` scores the held-out steps under further routings too
    (for example "live" beside "dynamic": the router that runs against the best split). `drift_ratio` > 1 also
    refits early when traffic drifts (see the module docstring); None keeps the fixed cadence. `lag` >= 0 delays
    each placement's first served step by that many steps after its fit window (see the module docstring).

    Raises:
        PlacementInfeasibleError: `every` or `window` below 1, `lag` negative, `window + lag` leaving no step of
            the trace to score, or `drift_ratio` not above 1.
    """
    num_steps = counts_TLE.shape[0]
    if every < 1 or window < 1:
        raise PlacementInfeasibleError(f"every and window must be >= 1; got every={every}, window={window}")
    if lag < 0:
        raise PlacementInfeasibleError(
            f"lag counts the steps from the end of a fit window until its placement serves and must be >= 0; "
            f"got lag={lag}"
        )
    first_scored = window + lag
    if first_scored >= num_steps:
        raise PlacementInfeasibleError(
            f"window={window} and lag={lag} leave no step to score in a trace of {num_steps} steps (the first "
            f"scored step is window + lag = {first_scored}); use window + lag < {num_steps}"
        )
    if drift_ratio is not None and not 1.0 < drift_ratio < math.inf:
        raise PlacementInfeasibleError(
            f"drift_ratio compares a served step's imbalance with the fitted one and must be finite and > 1 (for "
            f"example 1.4); got drift_ratio={drift_ratio}"
        )
    held, fitted, seconds, windows, serve_starts, drifts = [], [], [], [], [], []
    also: dict[str, list[StepScores]] = {name: [] for name in also_routings}
    fit_step, regime_start = window, 0
    # Fits started or decided while the placement serving now still serves: (fit step, regime start that fit uses).
    # Filled when a drift is found after scheduled fits have started (lag > 0).
    upcoming: list[tuple[int, int]] = []
    while fit_step + lag < num_steps:
        first = max(regime_start, fit_step - window)
        history = counts_TLE[first:fit_step]
        began = time.perf_counter()
        placement: Placement = fit_placement(policy, history, cluster, **(policy_options or {}))
        seconds.append(time.perf_counter() - began)
        windows.append((first, fit_step))
        serve_from = fit_step + lag
        serve_starts.append(serve_from)
        fitted.append(score_placement(placement, history, routing))
        check_drift = drift_ratio is not None and not upcoming  # else a refit on drift is in flight
        next_fit, regime_start = upcoming.pop(0) if upcoming else (fit_step + every, regime_start)
        served = score_placement(placement, counts_TLE[serve_from : next_fit + lag], routing)
        if check_drift:
            over = np.flatnonzero(drifted_steps(served.imbalance_TL.mean(axis=1), fitted[-1].imbalance_TL.mean(),
                                                drift_ratio))
            drifted = serve_from + int(over[0]) if over.size else num_steps
            if drifted + 1 + lag < num_steps:
                drifts.append(drifted)
                new_regime = drifted if drifted - regime_start >= window else regime_start
                # Scheduled fits that started by step `drifted` still land; the refit on drift comes after them.
                started = list(range(next_fit, drifted + 1, every))
                if started:
                    upcoming = [(step, regime_start) for step in started[1:]] + [(drifted + 1, new_regime)]
                else:
                    next_fit, regime_start = drifted + 1, new_regime
        stop = min(next_fit + lag, num_steps) - serve_from
        held.append(served.take_steps(stop))
        for name in also_routings:
            also[name].append(score_placement(placement, counts_TLE[serve_from : serve_from + stop], name))
        fit_step = next_fit
        if on_refit is not None:
            on_refit(serve_from + stop - first_scored, num_steps - first_scored)
    return ReplayResult(StepScores.concatenate(held), StepScores.concatenate(fitted), serve_starts, seconds,
                        {name: StepScores.concatenate(parts) for name, parts in also.items()}, placement,
                        windows, drifts, lag)
