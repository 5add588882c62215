"""Rolling replay: re-fit every `every` steps from the last `window` steps, score the steps that follow.

This is what a live system does: it can only fit on traffic it has already seen. The first fit happens after
`window` steps; steps [0, window) are never scored. Beside the held-out score, each fit is also scored on its own
window (the "fitted" score), so the gap between the two shows how much a policy over-fits.
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
    """

    held_out: StepScores
    fitted: StepScores
    refit_steps: list[int]
    fit_seconds: list[float]
    held_out_also: dict[str, StepScores] = field(default_factory=dict)
    last: Placement | None = None

    def summary(self) -> dict:
        """Held-out summary (the contract keys) plus the fitted summary and fit timing."""
        result = self.held_out.summary()
        fitted = self.fitted.summary()
        result.update(
            {
                "fitted_imbalance_mean": fitted["imbalance_mean"],
                "fitted_lower_bound": fitted["lower_bound"],
                "refits": len(self.refit_steps),
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
) -> ReplayResult:
    """Replay `counts_TLE` [T, L, E] with a re-fit every `every` steps on the last `window` steps.

    `on_refit(done, total)` is called after each fit (for progress bars). `also_routings` scores the held-out steps
    under further routings too (for example "live" beside "dynamic": the router that runs against the best split).
    """
    num_steps = counts_TLE.shape[0]
    if every < 1 or window < 1:
        raise PlacementInfeasibleError(f"--every and --window must be >= 1; got every={every}, window={window}")
    if window >= num_steps:
        raise PlacementInfeasibleError(
            f"--window {window} leaves no step to score in a trace of {num_steps} steps; use --window < {num_steps}"
        )
    starts = list(range(window, num_steps, every))
    held, fitted, seconds = [], [], []
    also: dict[str, list[StepScores]] = {name: [] for name in also_routings}
    for done, start in enumerate(starts, 1):
        history = counts_TLE[start - window : start]
        began = time.perf_counter()
        placement: Placement = fit_placement(policy, history, cluster, **(policy_options or {}))
        seconds.append(time.perf_counter() - began)
        held.append(score_placement(placement, counts_TLE[start : start + every], routing))
        fitted.append(score_placement(placement, history, routing))
        for name in also_routings:
            also[name].append(score_placement(placement, counts_TLE[start : start + every], name))
        if on_refit is not None:
            on_refit(done, len(starts))
    return ReplayResult(StepScores.concatenate(held), StepScores.concatenate(fitted), starts, seconds,
                        {name: StepScores.concatenate(parts) for name, parts in also.items()}, placement)
