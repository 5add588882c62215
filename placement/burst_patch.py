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
