"""Patches between refits, planned once for the live rebalancer and the replay.

Legend: L layers, E experts, G GPUs.

A refit lands `lag` steps after its window, so the traffic that comes meanwhile (a drifting mix, a burst) is served
by a placement that never saw it. Between refits the serving placement is patched from the last steps seen: a few
replica-set swaps per layer follow the drifting mix (`placement.drift_swaps`) and stay until the next refit, and on
top of them a few replica slots per layer go to the experts the last steps overload (`placement.burst_patch`), taken
afresh each time so that a layer goes back once its burst has passed.

`PatchPlanner` keeps what crosses patches: the placement they follow (the last refit's with the drift swaps of the
patches landed since, and the order of the GPUs each layer is a ring in, `Followed`), whose turn it is for drift
swaps (`layers_in_turn`) and the stride of the turns. `PatchPlanner.job` makes the next patch's job; `plan_patch`
computes it (pure: rank 0's helper process runs it live, the replay inline); `landed` and `refit` say what serves.
The live rebalancer calls it on rank 0 with the decode steps as its clock; `placement.replay.rolling_replay` calls
it with the trace's steps and a pace (`PatchPace`: how many steps a patch takes to serve, as a live group measures).
"""

import math
import time
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from placement.burst_patch import THRESHOLD, patch_for_bursts
from placement.drift_swaps import check_ring_order, drift_swaps, layers_in_turn
from placement.placement_model import Placement


class PatchSettings(BaseModel):
    """How often and how much the serving placement is patched between refits; the same for the live rebalancer
    (`RebalanceConfig.patches`) and the replay. Defaults need no tuning: docs/rebalancing.md, 'Burst patches'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: int = Field(5, ge=1, description="Steps between the starts of two patches.")
    window: int = Field(2, ge=1, description="Last steps whose mean load the burst moves fit: a burst shows at "
                                             "nearly its height in 2 steps' mean.")
    max_moves: int = Field(2, ge=0, description="Most slots one layer may change for bursts in one patch.")
    threshold: float = Field(THRESHOLD, ge=1, description="Layers whose recent load the live router serves at or "
                                                          "below this imbalance get no burst moves.")
    drift_swaps: int = Field(4, ge=0, description="Most replica-set swaps per layer and patch toward the drifting mix "
                                                  "(ring layouts only; 0: none); they stay until the next refit.")
    drift_window: int = Field(30, ge=1, description="Last steps whose mean load the drift swaps fit.")
    drift_stride: int = Field(1, ge=1, description="A layer gets drift swaps in every drift_stride-th patch since "
                                                   "the refit, the layers taking turns; the least stride, which "
                                                   "swap_budget_s may widen.")
    swap_budget_s: float | None = Field(
        0.13, gt=0, description="Live only: seconds one patch's drift swaps may take; from the last patch's seconds "
                                "per layer the stride widens so that they take about this long (a patch lands only "
                                "when its job is done). None: the fixed stride.")

    @property
    def steps_seen(self) -> int:
        """The most recent steps a patch reads: the longer of its two windows."""
        return max(self.window, self.drift_window) if self.drift_swaps else self.window


@dataclass(frozen=True)
class PatchPace:
    """How a replay's patches meet the clock: what a live group takes (docs/rebalancing.md, 'The pace a live group
    keeps').

    Attributes:
        lag: steps from the last step a patch sees until it serves (its job, the broadcast, its weight rounds, the
            switch).
        burst_lag: steps until its layers whose burst moves come or go serve (a live patch plans their weights first
            and switches each layer as its weights land); None: every layer at `lag`. Within (lag - every, lag]:
            they land after the last patch's layers.
        refit_blocks: no patch starts while a refit is in flight (from its fit until it serves), as a live group
            runs them (a refit's moves read and keep the slots a patch would change). False: patches go on, as the
            yardstick's back-to-back refits need.
    """

    lag: int = 8
    burst_lag: int | None = None
    refit_blocks: bool = False

    def problems(self, every: int) -> list[tuple[str, str]]:
        """(parameter, what is wrong) for each setting out of range with patches `every` steps apart."""
        found = []
        if self.lag < 0:
            found.append(("lag", f"must be >= 0; got {self.lag}"))
        if self.burst_lag is not None and not self.lag - every < self.burst_lag <= self.lag:
            found.append(("burst_lag", f"must lie in (lag - every, lag] = ({self.lag - every}, {self.lag}] (a patch's "
                                       f"early layers land after the last patch's); got {self.burst_lag}"))
        return found


@dataclass(frozen=True)
class Followed:
    """The placement patches start from, and [L, G] the order of the GPUs each of its layers is a ring layout in
    (a refit relabelled to move the fewest experts is a ring in the order of its GPU map)."""

    placement: Placement
    ring_order_LG: np.ndarray

    @classmethod
    def of(cls, placement: Placement, ring_order_LG: np.ndarray | None = None) -> "Followed":
        """`placement` with `ring_order_LG` (None: 0, 1, ..., G-1 in every layer)."""
        num_layers, num_gpus = placement.num_layers, placement.cluster.num_gpus
        if ring_order_LG is None:
            return cls(placement, np.tile(np.arange(num_gpus), (num_layers, 1)))
        return cls(placement, check_ring_order(ring_order_LG, num_layers, num_gpus))

    def with_layers_of(self, other: "Followed", layers) -> "Followed":
        """This one with `layers` of `other`, their ring orders with them."""
        order_LG = self.ring_order_LG.copy()
        order_LG[layers] = other.ring_order_LG[layers]
        return Followed(self.placement.with_layers_of(other.placement, layers), order_LG)


@dataclass(frozen=True)
class PatchJob:
    """One patch's input (sent to rank 0's helper process live).

    Attributes:
        start: what the patch starts from.
        recent_LE: [L, E] mean tokens per expert over the burst moves' window.
        drift_LE: [L, E] mean over the drift swaps' window; None: no drift swaps.
        drift_layers: the layers whose turn it is for drift swaps.
        max_moves, threshold, max_swaps: `PatchSettings.max_moves`, `threshold`, `drift_swaps`.
    """

    start: Followed
    recent_LE: np.ndarray
    drift_LE: np.ndarray | None
    drift_layers: np.ndarray
    max_moves: int
    threshold: float
    max_swaps: int


@dataclass(frozen=True)
class PatchPlan:
    """A patch: `followed` (the start with its drift swaps, what the next patches start from once it lands) and
    `target` (that with the burst moves: what serves); `swap_seconds_per_layer` the drift swaps' cost (None: none
    ran)."""

    followed: Followed
    target: Placement
    swap_seconds_per_layer: float | None = None


def plan_patch(job: PatchJob) -> PatchPlan:
    """The drift swaps in the layers whose turn it is, then the burst moves on top, each in the layers' ring order."""
    followed, per_layer = job.start, None
    if job.drift_LE is not None and job.max_swaps > 0 and len(job.drift_layers):
        began = time.perf_counter()
        swapped, _ = drift_swaps(followed.placement, job.drift_LE, job.max_swaps, job.drift_layers,
                                 followed.ring_order_LG)
        per_layer = (time.perf_counter() - began) / len(job.drift_layers)
        followed = Followed(swapped, followed.ring_order_LG)
    target, _ = patch_for_bursts(followed.placement, job.recent_LE, job.max_moves, job.threshold,
                                 followed.ring_order_LG)
    return PatchPlan(followed, target, per_layer)


def burst_layers_L(plan: PatchPlan, start: Placement, serving: Placement) -> np.ndarray:
    """[L] bool: the layers whose burst moves come (the plan's target against its followed placement) or go (the
    placement `serving` against the `start` it was patched from): they serve first (`PatchPace.burst_lag`)."""
    return _gpus_differ_L(plan.target, plan.followed.placement) | _gpus_differ_L(serving, start)


def _gpus_differ_L(first: Placement, second: Placement) -> np.ndarray:
    """[L] bool: the layers where some GPU holds other experts in `first` than in `second` (the order of the slots
    within a GPU aside)."""
    shape = (first.num_layers, first.cluster.num_gpus, first.cluster.slots_per_gpu)
    return (np.sort(first.phy2log_LP.reshape(shape), axis=2) != np.sort(second.phy2log_LP.reshape(shape), axis=2)
            ).any(axis=(1, 2))


class PatchPlanner:
    """What crosses patches: the placement they follow, the layers' turns at drift swaps and their stride.

    Args:
        settings: the patch settings.
        placement: the placement serving now (a refit's, or one loaded), which the first patches start from.
        ring_order_LG: [L, G] the order of its GPUs each layer is a ring in (None: 0, 1, ..., G-1).
    """

    def __init__(self, settings: PatchSettings, placement: Placement, ring_order_LG: np.ndarray | None = None):
        self.settings = settings
        self.followed = Followed.of(placement, ring_order_LG)
        self.turn = 0  # patches since the refit: the layers take turns at drift swaps
        self.stride = settings.drift_stride

    def refit(self, followed: Followed) -> None:
        """A refit (or a placement loaded, or one the survivors of a failure serve) serves: patches start from it."""
        self.followed, self.turn = followed, 0

    def job(self, recent_LE: np.ndarray, drift_LE: np.ndarray | None, start: Followed | None = None) -> PatchJob:
        """The next patch's job on the mean loads of its two windows (`drift_LE` None: no drift swaps), from `start`
        (a patch still moving, whose target the next one is planned from) or else the placement followed."""
        settings = self.settings
        layers = layers_in_turn(self.followed.placement.num_layers, self.stride, self.turn)
        self.turn += 1
        swaps = settings.drift_swaps if drift_LE is not None else 0
        return PatchJob(self.followed if start is None else start, np.asarray(recent_LE, dtype=np.float64),
                        None if drift_LE is None else np.asarray(drift_LE, dtype=np.float64), layers,
                        settings.max_moves, settings.threshold, swaps)

    def landed(self, followed: Followed, layers=None) -> None:
        """A patch whose drift swaps made `followed` (`PatchPlan.followed`) serves, in `layers` only when given:
        the drift swaps stay for the next patches."""
        self.followed = followed if layers is None else self.followed.with_layers_of(followed, layers)

    def measured(self, swap_seconds_per_layer: float | None) -> None:
        """The last patch's drift swaps took this long per layer: the next patches swap in every k-th layer so that
        one patch's swaps take about `swap_budget_s` (k at least `drift_stride`)."""
        settings, num_layers = self.settings, self.followed.placement.num_layers
        if swap_seconds_per_layer is None or settings.swap_budget_s is None:
            return
        needed = math.ceil(swap_seconds_per_layer * num_layers / settings.swap_budget_s)
        self.stride = max(settings.drift_stride, min(num_layers, needed))
