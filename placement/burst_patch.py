"""Patch a serving placement for the bursts of the last few steps: a few replica slots moved, no refit.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots.

Why: a refit lands `lag` steps after its window (the solve and the weight transfer of a whole model), so a burst
that begins after the window (one expert several times hotter for tens of steps) is served by a placement that
never saw it. What it costs depends on where the placement put that expert, and no placement fitted in advance
absorbs it well: a single-replica expert's burst stays on its GPU (figures: docs/placement.md, 'Forecasting the
load'). What does absorb it is a replica of the bursting expert, and giving one is cheap: one slot of an expert with
replicas to spare takes the bursting expert's weights, one expert per layer to copy instead of a model. So between
refits the serving placement is patched from the steps just seen, and the patch can land within a few steps.

Method, per layer, on the mean load of the recent steps: if the live router's split of that load leaves the busiest
GPU above `threshold` times the mean (on a ring layout its exact split, `placement.drift_swaps.ring_imbalance`, in
the layer's ring order, which a refit's GPU map sets: the water-filling below overstates a chain's imbalance, and a
move it would call a gain breaks the ring), try giving each
of the `CANDIDATES` experts with the most load per replica one more replica, taken from a slot of an expert that keeps
at least one replica after it, on a GPU that does not hold the bursting expert yet (the `DONORS` slots of the experts
with the least load per replica); keep the move that lowers the imbalance most (of moves equal but for rounding, the
first tried), if by at least `MIN_GAIN`; repeat up to `max_moves` moves. Each trial is scored as the live router would
split it (`placement.routing.dynamic_split`'s water-filling, `ROUTER_ROUNDS` rounds); a move's trials are scored
together, in one batched water-filling (`placement.routing.trial_split`). A patched layer's static weights are
refitted to the recent load; the other layers are untouched. A patch is taken from the fitted placement each time, not
from the last patch, so when the burst is over the layer goes back to the fit.
"""

from dataclasses import dataclass

import numpy as np

from placement.drift_swaps import check_ring_order, ring_imbalance
from placement.placement_model import Placement
from placement.routing.dynamic_split import MOMENTUM, ROUTER_ROUNDS
from placement.routing.static_weights import fitted_weights
from placement.routing.trial_split import trial_imbalances

THRESHOLD = 1.02  # a layer whose recent load is served above this imbalance is patched
MIN_GAIN = 0.005  # a move is kept only if it lowers the recent load's imbalance by this much
CANDIDATES = 2  # bursting experts tried per move: those with the most recent load per replica
DONORS = 8  # slots tried per bursting expert: those of the experts with the least recent load per replica
TIE = 1e-12  # trials whose imbalances differ by less than this are equally good (rounding, not balance)


def burst_lag_fits(burst_lag: int, lag: int, every: int) -> bool:
    """True when a patch's burst layers at `burst_lag` land after the last patch's layers (at `lag`, patches `every`
    steps apart) and no later than its own other layers: lag - every < burst_lag <= lag (`PatchConfig.burst_lag`)."""
    return lag - every < burst_lag <= lag


@dataclass(frozen=True)
class PatchConfig:
    """When and how much a replay (or a live group) patches its serving placement between refits.

    Attributes:
        lag: steps from the last step a patch sees until it serves (detecting, solving, copying a few experts; the
            default is about what a live group at the full shape takes, docs/rebalancing.md, 'Burst patches').
        window: recent steps whose mean load a patch is fitted to.
        every: steps between patches.
        max_moves: most slots one layer may change per patch.
        threshold: layers served at or below this imbalance of the recent load are left as fitted.
        drift_swaps: most replica-set swaps per layer and patch that follow the drifting mix
            (`placement.drift_swaps`); they stay until the next refit, and the burst moves are made on top of them.
            0: no drift swaps.
        drift_window: recent steps whose mean load the drift swaps are fitted to.
        drift_stride: a layer gets its drift swaps in every `drift_stride`-th patch since the fit, the layers
            taking turns (`placement.drift_swaps.layers_in_turn`); 1: every layer in every patch.
        sequential: one patch at a time, as the live `Rebalancer` runs them with `patch_overlap` off: a patch
            starts `every` steps after the last one started or when it has switched, whichever is later, so a patch
            that takes `lag` steps to switch also spaces them `lag` apart. False: a patch starts every `every` steps
            whatever the lag (pipelined, as the replay's refits are; with `patch_overlap` the live one solves the
            next patch while one moves, which a shorter `every` than `lag` models).
        refit_blocks: no patch starts while a refit is in flight (from its fit step until its placement serves), as
            the live `Rebalancer` runs them: a refit's weight moves read and keep the serving slots that a patch
            would change. False: patches go on while the next refit solves and moves (the yardstick's schedule,
            whose refits are always in flight).
        burst_lag: steps from the last step a patch sees until its layers whose burst moves come or go serve, ahead
            of its other layers at `lag` (a live patch plans those layers' weights first and switches each layer as
            its weights land); None: every layer at `lag`. Within lag - every < burst_lag <= lag, since a live
            patch's layers land after the last patch's.
        adopt_layers: refits adopted by the patches, as the live `Rebalancer` with `refit_adopt_layers` does: a
            refit, once solved (`lag` steps after its window), never serves whole; each patch replaces up to this
            many layers of the placement it follows with the refit's, the layers the refit gains most on (on its
            window) first, and layers it does not improve stay. None: each refit serves whole from its landing.
    """

    lag: int = 20
    window: int = 2  # a burst shows in 2 steps' mean sooner than in 5's (docs/benchmarks.md, 'The burst moves' window')
    every: int = 5
    max_moves: int = 2
    threshold: float = THRESHOLD
    drift_swaps: int = 4
    drift_window: int = 30
    drift_stride: int = 1
    sequential: bool = False
    refit_blocks: bool = False
    burst_lag: int | None = None
    adopt_layers: int | None = None

    def __post_init__(self) -> None:
        if self.burst_lag is not None and (self.sequential or not burst_lag_fits(self.burst_lag, self.lag, self.every)):
            raise ValueError(f"burst_lag must lie in (lag - every, lag] = ({self.lag - self.every}, {self.lag}] "
                             f"(a patch's early layers land after the last patch's), with sequential False; got "
                             f"burst_lag={self.burst_lag}, sequential={self.sequential}")
        if self.adopt_layers is not None and (self.adopt_layers < 1 or self.refit_blocks or self.sequential):
            raise ValueError(f"adopt_layers must be >= 1 (or None), with refit_blocks and sequential False (refits the "
                             f"patches adopt block none; one patch at a time is not modelled with them); got "
                             f"adopt_layers={self.adopt_layers}, refit_blocks={self.refit_blocks}, "
                             f"sequential={self.sequential}")
        if (self.lag < 0 or self.window < 1 or self.every < 1 or self.max_moves < 0 or not self.threshold >= 1
                or self.drift_swaps < 0 or self.drift_window < 1 or self.drift_stride < 1):
            raise ValueError(f"patches need lag >= 0, window >= 1, every >= 1, max_moves >= 0, threshold >= 1, "
                             f"drift_swaps >= 0, drift_window >= 1 and drift_stride >= 1; got lag={self.lag}, "
                             f"window={self.window}, every={self.every}, max_moves={self.max_moves}, "
                             f"threshold={self.threshold}, drift_swaps={self.drift_swaps}, "
                             f"drift_window={self.drift_window}, drift_stride={self.drift_stride}")


def patch_for_bursts(placement: Placement, recent_LE: np.ndarray, max_moves: int = 2,
                     threshold: float = THRESHOLD, ring_order_LG: np.ndarray | None = None) -> tuple[Placement, int]:
    """The placement with up to `max_moves` slots per layer moved to the experts the recent load overloads.

    Args:
        placement: the placement now serving (L layers, E experts, P slots).
        recent_LE: [L, E] non-negative mean tokens per expert over the last steps seen.
        max_moves: >= 0, the most slots one layer may change.
        threshold: >= 1, layers served at or below this imbalance of `recent_LE` are left as they are.
        ring_order_LG: [L, G] per layer, the GPUs in the order the layer may be a ring layout in
            (`placement.drift_swaps.drift_swaps` takes the same), so that a ring whose GPUs were relabelled is
            still checked by its exact split; None: 0, 1, ..., G-1 in every layer.

    Returns:
        (patched placement, number of slots that changed expert); the placement itself (0) when nothing moved.

    Raises:
        ValueError: `recent_LE` not [L, E] of the placement or negative, `max_moves` below 0, `threshold` below 1,
            or `ring_order_LG` not one permutation of the GPUs per layer.
    """
    recent = np.asarray(recent_LE, dtype=np.float64)
    num_layers, num_experts = placement.phy2log_LP.shape[0], placement.num_experts
    if recent.shape != (num_layers, num_experts) or not np.isfinite(recent).all() or (recent < 0).any():
        raise ValueError(f"recent_LE must be [layers, experts] = [{num_layers}, {num_experts}] of finite, "
                         f"non-negative loads to match the placement; got shape {recent.shape}")
    if max_moves < 0 or not threshold >= 1:
        raise ValueError(f"max_moves must be >= 0 and threshold >= 1; got max_moves={max_moves}, "
                         f"threshold={threshold}")
    num_gpus = placement.cluster.num_gpus
    order_LG = (np.tile(np.arange(num_gpus), (num_layers, 1)) if ring_order_LG is None
                else check_ring_order(ring_order_LG, num_layers, num_gpus))
    phy2log_LP, weights_LP = placement.phy2log_LP.copy(), placement.weights_LP.copy()
    moved = 0
    for layer in range(num_layers):
        patched = _patch_layer(phy2log_LP[layer], recent[layer], placement, max_moves, threshold, order_LG[layer])
        changed = int((patched != phy2log_LP[layer]).sum())
        if changed:
            moved += changed
            phy2log_LP[layer] = patched
            weights_LP[layer] = fitted_weights(patched, recent[layer], placement.cluster.num_gpus,
                                               placement.cluster.slots_per_gpu)
    if not moved:
        return placement, 0
    info = {**placement.info, "patched_slots": moved}
    return Placement(phy2log_LP, weights_LP, placement.cluster, num_experts, placement.policy, info), moved


def _patch_layer(phy2log_P: np.ndarray, load_E: np.ndarray, placement: Placement, max_moves: int,
                 threshold: float, ring_order_G: np.ndarray) -> np.ndarray:
    """One layer's slot map after the moves that pay (see the module docstring); `ring_order_G` [G] the order of
    the GPUs it may be a ring layout in."""
    current = phy2log_P.copy()
    if load_E.sum() <= 0:
        return current
    cluster = placement.cluster
    in_ring = current.reshape(cluster.num_gpus, cluster.slots_per_gpu)[ring_order_G].ravel()
    exact = ring_imbalance(in_ring, load_E, cluster.num_gpus, cluster.slots_per_gpu)
    if exact is not None and exact <= threshold:
        return current  # a ring layout the live router splits exactly, within the threshold
    gpu_of_slot = placement.gpu_of_slot_P
    imbalance = float(_split_imbalances(current[None], load_E, placement)[0])
    for _ in range(max_moves):
        if imbalance <= threshold:
            break
        replicas_E = np.bincount(current, minlength=len(load_E))
        per_replica_E = load_E / replicas_E
        trials = []  # candidates in order, each one's donors in order: the first of equally good trials wins
        for expert in np.argsort(-per_replica_E, kind="stable")[:CANDIDATES]:
            holding = np.isin(gpu_of_slot, gpu_of_slot[current == expert])
            donors = np.flatnonzero((replicas_E[current] >= 2) & (current != expert) & ~holding)
            for slot in donors[np.argsort(per_replica_E[current[donors]], kind="stable")[:DONORS]]:
                trial = current.copy()
                trial[slot] = expert
                trials.append(trial)
        if not trials:
            break
        values = _split_imbalances(np.stack(trials), load_E, placement)
        if values.min() >= imbalance - MIN_GAIN:
            break
        best = int(np.flatnonzero(values <= values.min() + TIE)[0])
        current, imbalance = trials[best], float(values[best])
    return current


def _split_imbalances(phy2log_BP: np.ndarray, load_E: np.ndarray, placement: Placement) -> np.ndarray:
    """[B] busiest GPU over the mean when the live router's water-filling (its `ROUTER_ROUNDS` rounds)
    splits `load_E` [E] on each slot map of `phy2log_BP` [B, P]: what the patched layer would serve."""
    return trial_imbalances(phy2log_BP, placement.gpu_of_slot_P, load_E, placement.cluster.num_gpus,
                            ROUTER_ROUNDS, MOMENTUM)
