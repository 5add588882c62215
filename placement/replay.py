"""Rolling replay: re-fit every `every` steps from the last `window` steps, score the steps that follow.

This is what a live system does: it can only fit on traffic it has already seen. The first fit happens after
`window` steps; steps [0, window) are never scored. Beside the held-out score, each fit is also scored on its own
window (the "fitted" score), so the gap between the two shows how much a policy over-fits.

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
"""

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
        held_out: scores of the steps after each fit, [T - window, L] in trace order.
        fitted: scores of each placement on the window it was fitted on, stacked.
        refit_steps: the trace step at which each placement started serving.
        fit_seconds: wall time of each fit.
        held_out_also: the held-out steps scored under each routing of `also_routings` as well (same placements).
        last: the placement of the last fit (the one a live system would be serving at the end).
        fit_windows: the trace steps [first, stop) each placement was fitted on (stop is its refit step).
        drift_steps: the served steps whose imbalance triggered a refit on drift, in trace order.
    """

    held_out: StepScores
    fitted: StepScores
    refit_steps: list[int]
    fit_seconds: list[float]
    held_out_also: dict[str, StepScores] = field(default_factory=dict)
    last: Placement | None = None
    fit_windows: list[tuple[int, int]] = field(default_factory=list)
    drift_steps: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        """Held-out summary (the contract keys) plus the fitted summary and fit timing."""
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
            }
        )
        return result


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
) -> ReplayResult:
    """Replay `counts_TLE` [T, L, E] with a re-fit every `every` steps on the last `window` steps.

    `on_refit(done, total)` is called after each fit has served its steps: `done` of the `total` steps to score
    (for progress bars). `also_routings` scores the held-out steps under further routings too
    (for example "live" beside "dynamic": the router that runs against the best split). `drift_ratio` > 1 also
    refits early when traffic drifts (see the module docstring); None keeps the fixed cadence.
    """
    num_steps = counts_TLE.shape[0]
    if every < 1 or window < 1:
        raise PlacementInfeasibleError(f"--every and --window must be >= 1; got every={every}, window={window}")
    if window >= num_steps:
        raise PlacementInfeasibleError(
            f"--window {window} leaves no step to score in a trace of {num_steps} steps; use --window < {num_steps}"
        )
    if drift_ratio is not None and not drift_ratio > 1.0:
        raise PlacementInfeasibleError(
            f"--refit-on-drift compares a served step's imbalance with the fitted one and must be > 1 (for example "
            f"1.4); got {drift_ratio}"
        )
    held, fitted, seconds, windows, drifts = [], [], [], [], []
    also: dict[str, list[StepScores]] = {name: [] for name in also_routings}
    start, regime_start = window, 0
    while start < num_steps:
        first = max(regime_start, start - window)
        history = counts_TLE[first:start]
        began = time.perf_counter()
        placement: Placement = fit_placement(policy, history, cluster, **(policy_options or {}))
        seconds.append(time.perf_counter() - began)
        windows.append((first, start))
        served = score_placement(placement, counts_TLE[start : start + every], routing)
        fitted.append(score_placement(placement, history, routing))
        stop = served.imbalance_TL.shape[0]
        if drift_ratio is not None:
            threshold = drift_ratio * float(fitted[-1].imbalance_TL.mean())
            over = np.flatnonzero(served.imbalance_TL.mean(axis=1) > threshold)
            drifted = start + int(over[0]) if over.size else num_steps
            if drifted + 1 < num_steps:
                stop = drifted + 1 - start
                drifts.append(drifted)
                if drifted - regime_start >= window:
                    regime_start = drifted
        held.append(served.take_steps(stop))
        for name in also_routings:
            also[name].append(score_placement(placement, counts_TLE[start : start + stop], name))
        start += stop
        if on_refit is not None:
            on_refit(start - window, num_steps - window)
    return ReplayResult(StepScores.concatenate(held), StepScores.concatenate(fitted), [w[1] for w in windows],
                        seconds, {name: StepScores.concatenate(parts) for name, parts in also.items()}, placement,
                        windows, drifts)
