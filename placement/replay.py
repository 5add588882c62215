"""Rolling replay: re-fit every `every` steps from the last `window` steps, score the steps that follow.

This is what a live system does: it can only fit on traffic it has already seen. The first fit happens after
`window` steps; steps [0, window + lag) are never scored. Beside the held-out score, each fit is also scored on
its own window (the "fitted" score), so the gap between the two shows how much a policy over-fits.

Refit on drift (`drift_ratio`, off by default): a fixed cadence (a refit every N steps, as the engines run it) serves a
placement fitted on old traffic until the next refit, so after an abrupt change (a new tenant or task) every policy
serves the wrong placement for up to `every` steps. With `drift_ratio` R, a served
step whose imbalance (mean over layers, under the routing scored) exceeds R times the placement's imbalance on its
own window marks the start of new traffic: the policy refits at once, on the steps since that start only (the
window's older steps belong to the old traffic), and later refits use those steps until the window is full of them.
A second trigger within `window` steps of the start refits again on the steps since the start (a placement fitted
on one or two steps is noisy; that is not a new change). R is chosen high enough that the step-to-step noise of
a few tokens per GPU never fires it within one task, and low enough that it still catches a change of task
(figures: docs/rebalancing.md, 'Refit on drift').

Lag (`lag`, 0 by default): a live group cannot serve a placement on the step after its fit window ends. Solving
(`cpsat` takes up to its `time_limit_s`) and moving the weights last many decode steps, and meanwhile the old
placement keeps serving (figures: docs/rebalancing.md, 'Lag'). With lag L, the placement fitted at step f (on steps
ending at f) serves [f + L, f' + L), f' being the next fit; the held-out steps are [window + L, T). A drifted step d
found while a placement serves starts a fit at d + 1 whose placement serves from d + 1 + L; until then the
placement serving keeps serving, and the steps served in between (its fit is in flight) trigger nothing. When d
falls after scheduled fits have started (possible only with L > 0), they still land, each serving from its own
f' + L, and the refit on drift follows them, serving from d + 1 + L. Lag 0 is the replay without lag, step for
step.

Patches (`patches`, off by default): between refits, every `patches.every` steps the serving placement is patched
from the steps seen `pace.lag` steps earlier, and the patch serves until the next one, planned by the planner the
live rebalancer runs (`placement.patch_planner.PatchPlanner`): drift swaps toward the last `patches.drift_window`
steps, kept until the next refit, and burst moves for the last `patches.window` steps on top, taken afresh each time.
The pace (`PatchPace`) says how a live group meets the clock: a patch serves `pace.lag` steps after the last step it
saw, its layers whose burst moves come or go `pace.burst_lag` steps after (they switch as their weights land), and
with `pace.refit_blocks` no patch starts while a refit is in flight (from the next fit's step until its placement
serves), as a live group runs them; the last patch then serves on until the refit lands. Patches overlap as a live
group's do (the next one's job starts while one moves). `patch_moves` counts the slots that changed between
consecutive served placements within a fit's service (the weights a live group would copy for them).
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import PlacementInfeasibleError
from placement.forecast import hedged_window
from placement.patch_planner import PatchPace, PatchPlan, PatchPlanner, PatchSettings, burst_layers_L, plan_patch
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
        fit_cpu_seconds: CPU time of each fit, every thread of the process counted (what the fit costs on a machine
            of its own, where the wall time on a busy one would say more).
        held_out_also: the held-out steps scored under each routing of `also_routings` as well (same placements).
        last: the placement of the last fit (the one a live system would be serving at the end).
        fit_windows: the trace steps [first, stop) each placement was fitted on; its fit starts at step stop.
        drift_steps: the served steps whose imbalance triggered a refit on drift, in trace order.
        lag: steps from the end of each fit window until its placement serves.
        patch_moves: with burst patches, the slots whose expert changed between consecutive served placements
            within each fit's service (None without patches).
        held_out_served: the held-out steps of each trace of `also_served`, served by the same placements.
        placements: each fit's placement, in fit order (what a switch moves: `placement.migration.plan_migration`
            between consecutive ones).
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
    patch_moves: int | None = None
    held_out_served: dict[str, StepScores] = field(default_factory=dict)
    placements: list[Placement] = field(default_factory=list)
    fit_cpu_seconds: list[float] = field(default_factory=list)

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
        if self.patch_moves is not None:
            result["patch_moves"] = self.patch_moves
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
    forecast: bool = False,
    patches: PatchSettings | None = None,
    pace: PatchPace = PatchPace(),
    also_served: dict[str, np.ndarray] | None = None,
) -> ReplayResult:
    """Replay `counts_TLE` [T, L, E] with a re-fit every `every` steps on the last `window` steps.

    `on_refit(done, total)` is called after each fit has served its steps (progress bars). `also_routings` scores the
    held-out steps under further routings. `drift_ratio` > 1 also refits early on drift (None: the cadence). `lag`
    >= 0 delays each placement's first served step. `forecast` fits each placement on its window moved along each
    expert's trend to the period it serves (`placement.forecast.hedged_window`). `patches` patches the serving
    placement between refits at `pace` (see the module docstring). `also_served` maps names to further [T, L, E]
    traces the same placements serve, scored under `routing` into `held_out_served` (the same traffic at another load).

    Raises:
        PlacementInfeasibleError: `every` or `window` below 1, `lag` negative, `window + lag` leaving no step of
            the trace to score, or `drift_ratio` not above 1.
        ValueError: `pace` out of range (`PatchPace.problems`).
    """
    num_steps = counts_TLE.shape[0]
    first_scored = _check_replay_args(num_steps, every, window, lag, drift_ratio, patches, pace)
    schedule = _Schedule(fit_step=window)
    parts = _ReplayParts(also={name: [] for name in also_routings}, routing=routing,
                         also_served={name: (trace, []) for name, trace in (also_served or {}).items()})
    hedge = (lag, every) if forecast else None
    while schedule.fit_step + lag < num_steps:
        first = max(schedule.regime_start, schedule.fit_step - window)
        placement = parts.fit(policy, counts_TLE, first, schedule.fit_step, cluster, policy_options or {}, routing,
                              hedge)
        serve_from = schedule.fit_step + lag
        parts.serve_starts.append(serve_from)
        check_drift = drift_ratio is not None and not schedule.upcoming  # else a refit on drift is in flight
        next_fit = schedule.next_fit(every)
        chunks = _served_placements(placement, counts_TLE, serve_from, min(next_fit + lag, num_steps), patches,
                                    pace, next_fit)
        served = _score_chunks(chunks, counts_TLE, routing)
        if check_drift:
            drifted = _first_drift(served, parts.fitted[-1], drift_ratio, serve_from, num_steps)
            if drifted + 1 + lag < num_steps:
                parts.drifts.append(drifted)
                next_fit = schedule.refit_on_drift(drifted, next_fit, every, window)
        stop = min(next_fit + lag, num_steps) - serve_from
        parts.serve(chunks, served, counts_TLE, serve_from + stop)
        schedule.fit_step = next_fit
        if on_refit is not None:
            on_refit(serve_from + stop - first_scored, num_steps - first_scored)
    return parts.result(placement, lag, patches is not None)


def _served_placements(placement: Placement, counts_TLE: np.ndarray, start: int, stop: int,
                       patches: PatchSettings | None, pace: PatchPace,
                       next_fit: int | None = None) -> list[tuple[int, int, Placement]]:
    """(first step, stop step, placement) of each stretch of steps [start, stop) that one placement serves: the
    fitted one throughout, or with `patches` the fitted one patched every `patches.every` steps by a
    `PatchPlanner` from the steps before t - `pace.lag` (unpatched while no step before it has been seen);
    consecutive steps that one placement serves form one stretch. With `pace.refit_blocks`, a patch starts only in
    [start, next_fit): not while a refit is in flight."""
    if patches is None:
        return [(start, stop, placement)]
    open_from, open_until = (start, next_fit) if pace.refit_blocks and next_fit is not None else (0, stop)
    planner = PatchPlanner(patches, placement)
    chunks: list[tuple[int, int, Placement]] = []
    served = placement
    for first in range(start, stop, patches.every):
        seen = first - pace.lag  # the patch's job starts here
        if seen > 0 and open_from <= seen < open_until:
            start_followed, last_served = planner.followed, served
            plan = plan_patch(planner.job(*_patch_loads(counts_TLE, seen, patches)))
            planner.landed(plan.followed)
            served = plan.target
            if pace.burst_lag is not None and pace.burst_lag < pace.lag and chunks:
                early = first - (pace.lag - pace.burst_lag)
                _land_burst_layers_early(chunks, early, plan, start_followed.placement, last_served)
        _serve(chunks, first, min(first + patches.every, stop), served)
    return chunks


def _patch_loads(counts_TLE: np.ndarray, seen: int, patches: PatchSettings) -> tuple[np.ndarray, np.ndarray | None]:
    """The mean loads [L, E] of a patch that sees the steps before `seen`: the burst moves' window and the drift
    swaps' (None without drift swaps)."""
    recent_LE = counts_TLE[max(0, seen - patches.window):seen].mean(axis=0)
    if not patches.drift_swaps:
        return recent_LE, None
    return recent_LE, counts_TLE[max(0, seen - patches.drift_window):seen].mean(axis=0)


def _land_burst_layers_early(chunks: list[tuple[int, int, Placement]], early: int, plan: PatchPlan,
                             last_followed: Placement, last_served: Placement) -> None:
    """With `PatchPace.burst_lag`: the layers of the patch `plan` whose burst moves come or go
    (`placement.patch_planner.burst_layers_L`), and which it changes, serve from `early` on: the last stretch, which
    ends where the patch lands, is split there."""
    changed_L = (plan.target.phy2log_LP != last_served.phy2log_LP).any(axis=1)
    layers = np.flatnonzero(changed_L & burst_layers_L(plan, last_followed, last_served)).tolist()
    if not layers:
        return
    begin, stop, placement = chunks[-1]
    mixed = placement.with_layers_of(plan.target, layers)
    if early > begin:
        chunks[-1] = (begin, early, placement)
        chunks.append((early, stop, mixed))
    else:
        chunks[-1] = (begin, stop, mixed)


def _serve(chunks: list[tuple[int, int, Placement]], first: int, stop: int, placement: Placement) -> None:
    """Append steps [first, stop) served by `placement` to `chunks`: to the last stretch if the same placement
    serves on (one stretch, scored at once), else as a stretch of their own."""
    if chunks and chunks[-1][2] is placement:
        chunks[-1] = (chunks[-1][0], stop, placement)
    else:
        chunks.append((first, stop, placement))


def _score_chunks(chunks: list[tuple[int, int, Placement]], counts_TLE: np.ndarray, routing: Routing) -> StepScores:
    """The steps of every chunk scored under `routing` with the chunk's placement, in step order."""
    return StepScores.concatenate([score_placement(placement, counts_TLE[first:stop], routing)
                                   for first, stop, placement in chunks])


def _moved_slots(chunks: list[tuple[int, int, Placement]]) -> int:
    """Slots whose expert changes between the placements of consecutive chunks."""
    served = [placement for _, _, placement in chunks]
    return sum(int((after.phy2log_LP != before.phy2log_LP).sum()) for before, after in zip(served, served[1:]))


def _check_replay_args(num_steps: int, every: int, window: int, lag: int, drift_ratio: float | None,
                       patches: PatchSettings | None, pace: PatchPace) -> int:
    """The first scored step, `window + lag`, or `PlacementInfeasibleError` naming the argument out of range
    (`ValueError` for the patches' pace)."""
    problems = [] if patches is None else pace.problems(patches.every)
    if problems:
        raise ValueError("; ".join(f"pace.{name} {text}" for name, text in problems))
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
    return first_scored


@dataclass
class _Schedule:
    """When the fits still to come happen and from which step their windows may start: the state that crosses fits.

    Attributes:
        fit_step: the step of the fit about to run (its window ends there).
        regime_start: the first step of the traffic now served; no fit window starts before it (a drift moves it).
        upcoming: fits started or decided while the placement serving now still serves, as (fit step, regime start
            that fit uses), in order. Filled when a drift is found after scheduled fits have started (lag > 0).
    """

    fit_step: int
    regime_start: int = 0
    upcoming: list[tuple[int, int]] = field(default_factory=list)

    def next_fit(self, every: int) -> int:
        """The step of the fit after the one at `fit_step`: the first upcoming one (its regime start then holds),
        else `every` steps on."""
        if self.upcoming:
            step, self.regime_start = self.upcoming.pop(0)
            return step
        return self.fit_step + every

    def refit_on_drift(self, drifted: int, next_fit: int, every: int, window: int) -> int:
        """Schedules the refit that a drift at step `drifted` triggers and returns the step of the next fit.

        The refit uses the steps from `drifted` on, unless the traffic now served began less than `window` steps
        before it (then the drift is noise of a young fit, not a new change). Scheduled fits that started by step
        `drifted` still land; the refit on drift comes after them.
        """
        new_regime = drifted if drifted - self.regime_start >= window else self.regime_start
        started = list(range(next_fit, drifted + 1, every))
        if started:
            self.upcoming = [(step, self.regime_start) for step in started[1:]] + [(drifted + 1, new_regime)]
            return next_fit
        self.regime_start = new_regime
        return drifted + 1


def _first_drift(served: StepScores, fitted: StepScores, drift_ratio: float, serve_from: int, num_steps: int) -> int:
    """The trace step of the first served step that `drifted_steps` flags, `num_steps` if none."""
    over = np.flatnonzero(drifted_steps(served.imbalance_TL.mean(axis=1), fitted.imbalance_TL.mean(), drift_ratio))
    return serve_from + int(over[0]) if over.size else num_steps


@dataclass
class _ReplayParts:
    """What each fit of a rolling replay adds to its result, in fit order (see `ReplayResult`)."""

    also: dict[str, list[StepScores]]
    routing: Routing = "static"
    also_served: dict[str, tuple[np.ndarray, list[StepScores]]] = field(default_factory=dict)
    held: list[StepScores] = field(default_factory=list)
    fitted: list[StepScores] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)
    serve_starts: list[int] = field(default_factory=list)
    drifts: list[int] = field(default_factory=list)
    moved: int = 0
    placements: list[Placement] = field(default_factory=list)

    def fit(self, policy: str, counts_TLE: np.ndarray, first: int, stop: int, cluster: ClusterSpec, options: dict,
            routing: Routing, hedge: tuple[int, int] | None = None) -> Placement:
        """Fits `policy` on steps [first, stop) of `counts_TLE` [T, L, E] (moved by `hedged_window` to the steps a
        placement serves `hedge` = (lag, every) after them, unless None), timing the fit (the forecast included)
        and scoring it on those steps."""
        history_TLE = counts_TLE[first:stop]
        began, began_cpu = time.perf_counter(), time.process_time()
        fit_TLE = history_TLE if hedge is None else hedged_window(history_TLE, *hedge)
        placement = fit_placement(policy, fit_TLE, cluster, **options)
        self.seconds.append(time.perf_counter() - began)
        self.cpu_seconds.append(time.process_time() - began_cpu)
        self.windows.append((first, stop))
        self.placements.append(placement)
        self.fitted.append(score_placement(placement, history_TLE, routing))
        return placement

    def serve(self, chunks: list[tuple[int, int, Placement]], served: StepScores, counts_TLE: np.ndarray,
              stop: int) -> None:
        """Keeps the scores of the steps the `chunks` served before step `stop` of `counts_TLE` [T, L, E] (the
        first of `served`), scores them under each of the further routings, and counts the slots patches moved."""
        kept = [(first, min(last, stop), placement) for first, last, placement in chunks if first < stop]
        self.held.append(served.take_steps(kept[-1][1] - kept[0][0]))
        for name, scores in self.also.items():
            scores.append(_score_chunks(kept, counts_TLE, name))
        for trace_TLE, scores in self.also_served.values():
            scores.append(_score_chunks(kept, trace_TLE, self.routing))
        self.moved += _moved_slots(kept)

    def result(self, last: Placement, lag: int, patched: bool) -> ReplayResult:
        return ReplayResult(StepScores.concatenate(self.held), StepScores.concatenate(self.fitted), self.serve_starts,
                            self.seconds, {name: StepScores.concatenate(parts) for name, parts in self.also.items()},
                            last, self.windows, self.drifts, lag, self.moved if patched else None,
                            {name: StepScores.concatenate(parts) for name, (_, parts) in self.also_served.items()},
                            self.placements, self.cpu_seconds)
