"""Follow a drifting expert mix between refits: a few experts of a ring layout trade replica sets.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, O arcs of the ring (G starts x
lengths 1..G), H hot and C cold candidates, K tight arcs, N arcs around an expert's, A arcs scored, B pairs scored.

Why: a refit lands `lag` steps after its window and then serves for an interval, so the placement serving a step was
fitted on traffic 100-200 steps older. Bursts aside, what it costs is the mix that moved meanwhile: an arc of GPUs
whose experts gained load can no longer shed it, and the live router's exact split on a chain layout then leaves its
GPUs above the mean on most steps (figures: docs/placement.md, 'Drift swaps'). A swap of two experts' replica sets
changes a few slots (two experts' weights per replica) and keeps the layout a ring layout, so the live router's
exact chain split still applies; a handful per layer and patch (`placement.patch_planner.PatchSettings.drift_swaps`),
kept from patch to patch, follows the mix until the next refit.

Method, per layer whose experts all lie on consecutive GPUs of the ring (`ring_spans`; `cpsat`'s chain layouts do,
other layers are left as they are), with GPUs equally fast (as the live rebalancer's and `eplb replay`'s): on the mean
load of the recent steps, the busiest GPU under the best split is the busiest arc's load over its length
(`placement.policies.ring_search`). Each arc's load gets `NOISE_MARGIN` standard deviations of a step's sampling noise
added (an arc of n tokens a step varies by about sqrt(n)), so that the swaps leave room for the steps' own variation
rather than balancing the mean to the last token, which leaves every step above it. A swap of expert a, inside the
tightest arc, with a colder expert b outside it moves c_a - c_b off every arc that holds a but not b and onto every
arc that holds b but not a. It pays in two ways: a cold b takes little load into the arc, and a b that spans more GPUs
gives a its longer arc (a hot or bursting one-GPU expert then spreads over several). So the `HOT` hottest experts
inside the tightest arc are tried against the `COLD` coldest outside it and every expert outside it that spans two or
more GPUs, and the pair whose swap lowers the objective most, scored exactly on every arc, is applied if it lowers it
by `MIN_GAIN`; up to `max_swaps` swaps.

Scoring every pair on every arc costs H x C x G^2 (about 40 million arc values a swap at 128 GPUs), so most pairs are
never scored: each gets a lower bound on its objective after the swap from arcs whose new loads are cheap to find, the
max of (1) the arcs that do not hold a (their loads stay or grow, so their values now bound the new max; per start GPU
they are a prefix of the lengths, read from prefix maxima), (2) the `TIGHT_ARCS` tightest arcs and (3) the arcs around
a's own arc and around b's (starting up to `AROUND` GPUs before it, ending up to `AROUND` after), (2) and (3) scored
exactly. Pairs whose bound does not clear `MIN_GAIN` are dropped; the rest are scored exactly in the order of their
bounds, `BATCH` at a time, until the next bound is no lower than the best score found, which is then the best of every
pair. An exact score needs only the arcs whose value could reach the batch's lowest bound: the margin is concave in
the load, so an arc's value grows by at most the gain times its slope (`_Ring._reach`), and an arc below the bound by
more stays below it. The result is the pair an exhaustive scoring picks, at a small share of its cost (figures:
docs/placement.md, 'Drift swaps'). The static weights stay with the slots: an expert takes the other's replica set
with its weights, which still sum to one per expert (the live router splits a ring layout exactly, without them).
"""

from collections.abc import Callable

import numpy as np

from placement.placement_model import Placement

NOISE_MARGIN = 3.0  # standard deviations of an arc's per-step noise (sqrt of its tokens) added to its load
MIN_GAIN = 5e-4  # a swap is applied only if it lowers the layer's objective by this much
HOT = 16  # experts inside the tightest arc tried per swap: the hottest
COLD = 64  # experts outside it tried per swap: the coldest (and every one spanning two or more GPUs)
TIGHT_ARCS = 32  # the tightest arcs each candidate pair's bound scores exactly
AROUND = 3  # ... and the arcs around each expert's own arc, up to this many GPUs longer at either end
BATCH = 8  # pairs scored exactly at a time, in the order of their bounds


def drift_swaps(placement: Placement, recent_LE: np.ndarray, max_swaps: int = 4,
                layers: np.ndarray | None = None, ring_order_LG: np.ndarray | None = None) -> tuple[Placement, int]:
    """The placement with up to `max_swaps` replica-set swaps per layer toward the recent load.

    Args:
        placement: the placement to start from (L layers, E experts, P slots).
        recent_LE: [L, E] non-negative mean tokens per expert over the last steps seen.
        max_swaps: >= 0, the most swaps per layer.
        layers: the layers to swap in (indices below L; None: every layer); the others stay as they are.
        ring_order_LG: [L, G] per layer, the GPUs in the order the layer is a ring layout in (a fit whose GPU j was
            realised on GPU `gpu_map_G[j]` by `placement.migration.plan_migration` is one in the order
            `gpu_map_G`), so that layers relabelled by different maps can all be swapped; None: 0, 1, ..., G-1 in
            every layer.

    Returns:
        (placement, number of slots whose expert changed); the placement itself (0) when nothing changed.

    Raises:
        ValueError: `recent_LE` not [L, E] of the placement, not finite or negative, `max_swaps` below 0,
            `layers` not layer indices, or `ring_order_LG` not one permutation of the GPUs per layer.
    """
    recent = np.asarray(recent_LE, dtype=np.float64)
    num_layers, num_experts = placement.phy2log_LP.shape[0], placement.num_experts
    if recent.shape != (num_layers, num_experts) or not np.isfinite(recent).all() or (recent < 0).any():
        raise ValueError(f"recent_LE must be [layers, experts] = [{num_layers}, {num_experts}] of finite, "
                         f"non-negative loads to match the placement; got shape {recent.shape}")
    if max_swaps < 0:
        raise ValueError(f"max_swaps must be >= 0; got {max_swaps}")
    chosen = np.arange(num_layers) if layers is None else np.asarray(layers, dtype=np.int64).reshape(-1)
    if chosen.size and (chosen.min() < 0 or chosen.max() >= num_layers):
        raise ValueError(f"layers must be layer indices in [0, {num_layers}); got {chosen.tolist()}")
    num_gpus, slots_per_gpu = placement.cluster.num_gpus, placement.cluster.slots_per_gpu
    order_LG = None if ring_order_LG is None else check_ring_order(ring_order_LG, num_layers, num_gpus)
    phy2log_LP = placement.phy2log_LP.copy()
    moved = 0
    for layer in (chosen if max_swaps else ()):
        if order_LG is None:
            swapped = swap_layer(phy2log_LP[layer], recent[layer], num_gpus, slots_per_gpu, max_swaps)
        else:  # swapped in ring order: ring position j holds GPU order[j]'s slots, and goes back there
            order = order_LG[layer]
            in_ring = swap_layer(phy2log_LP[layer].reshape(num_gpus, slots_per_gpu)[order].ravel(), recent[layer],
                                 num_gpus, slots_per_gpu, max_swaps)
            swapped = np.empty((num_gpus, slots_per_gpu), dtype=in_ring.dtype)
            swapped[order] = in_ring.reshape(num_gpus, slots_per_gpu)
            swapped = swapped.ravel()
        changed = int((swapped != phy2log_LP[layer]).sum())
        if changed:
            moved += changed
            phy2log_LP[layer] = swapped
    if not moved:
        return placement, 0
    info = {**placement.info, "drift_swapped_slots": moved}
    swapped = Placement(phy2log_LP, placement.weights_LP.copy(), placement.cluster, num_experts, placement.policy, info)
    return swapped, moved



def check_ring_order(ring_order_LG: np.ndarray, num_layers: int, num_gpus: int) -> np.ndarray:
    """`ring_order_LG` as [L, G] int64, or ValueError unless each row is a permutation of the G GPUs."""
    order_LG = np.asarray(ring_order_LG)
    if order_LG.shape != (num_layers, num_gpus) or not (np.sort(order_LG, axis=1) == np.arange(num_gpus)).all():
        raise ValueError(f"ring_order_LG must be [layers, GPUs] = [{num_layers}, {num_gpus}], each row a permutation "
                         f"of the GPUs 0..{num_gpus - 1}; got shape {order_LG.shape}")
    return order_LG.astype(np.int64)

def layers_in_turn(num_layers: int, stride: int, turn: int) -> np.ndarray:
    """The layers that get drift swaps in patch number `turn` when each layer gets them every `stride`-th patch:
    layer l when (l + turn) % stride == 0, so the layers take turns and a patch swaps in about L / stride of them
    (its job and weight moves shrink with them, so it lands sooner; figures: docs/benchmarks.md, 'Patches at a
    live group's pace')."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1; got {stride}")
    return np.flatnonzero((np.arange(num_layers) + turn) % stride == 0)


def ring_spans(phy2log_P: np.ndarray, num_experts: int, num_gpus: int, slots_per_gpu: int
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """(start_E, length_E): each expert's GPUs as the arc start, start + 1, ..., start + length - 1 (mod G), start 0
    for an expert on every GPU; None when some expert's GPUs are not consecutive on the ring or it has no slot."""
    present_EG = np.zeros((num_experts, num_gpus), dtype=bool)
    present_EG[phy2log_P, np.arange(len(phy2log_P)) // slots_per_gpu] = True
    length_E = present_EG.sum(axis=1)
    first_EG = present_EG & ~np.roll(present_EG, 1, axis=1)  # GPUs whose ring predecessor lacks the expert
    whole_E = length_E == num_gpus
    if (length_E == 0).any() or ((first_EG.sum(axis=1) != 1) & ~whole_E).any():
        return None
    return np.where(whole_E, 0, first_EG.argmax(axis=1)), length_E


def ring_imbalance(phy2log_P: np.ndarray, load_E: np.ndarray, num_gpus: int, slots_per_gpu: int) -> float | None:
    """The busiest GPU under the best split of `load_E` [E] over the mean GPU load, when one layer's slot map
    `phy2log_P` [P] is a ring layout (the live router's exact chain split then serves it), else None. 1.0 for no
    load. `placement.policies.ring_search.ring_objective` gives the same over many steps from an [E, arcs]
    containment; one load vector needs only `_Ring`'s arc loads, a bincount, as a patch's per-layer check does."""
    load = np.asarray(load_E, dtype=np.float64)
    spans = ring_spans(np.asarray(phy2log_P, dtype=np.int64), len(load), num_gpus, slots_per_gpu)
    if spans is None:
        return None
    if load.sum() <= 0:
        return 1.0
    ring = _Ring(spans[0], spans[1], load, num_gpus)
    return float((ring.loads_GO / ring.lengths_1[None]).max() / ring.mean)


def swap_layer(phy2log_P: np.ndarray, load_E: np.ndarray, num_gpus: int, slots_per_gpu: int,
               max_swaps: int, choose: Callable[["_Ring"], tuple[int, int] | None] | None = None) -> np.ndarray:
    """One layer's slot map after the swaps that pay (see the module docstring); unchanged if not a ring layout.
    `choose` picks each swap from the ring (None: `_Ring.best_swap`; a benchmark's baseline may pass another)."""
    current = np.array(phy2log_P, dtype=np.int64)
    load = np.asarray(load_E, dtype=np.float64)
    spans = ring_spans(current, len(load), num_gpus, slots_per_gpu)
    if spans is None or load.sum() <= 0 or max_swaps == 0:
        return current
    ring = _Ring(spans[0], spans[1], load, num_gpus)
    for _ in range(max_swaps):
        pair = ring.best_swap() if choose is None else choose(ring)
        if pair is None:
            break
        a, b = pair
        is_a, is_b = current == a, current == b
        current[is_a], current[is_b] = b, a
        ring.swap(a, b)
    return current


class _Ring:
    """One layer's ring layout (each expert's arc) and the loads of all arcs under one load vector."""

    def __init__(self, start_E: np.ndarray, length_E: np.ndarray, load_E: np.ndarray, num_gpus: int) -> None:
        self.start_E, self.length_E, self.load_E, self.num_gpus = start_E.copy(), length_E.copy(), load_E, num_gpus
        self.lengths_1 = np.arange(1, num_gpus + 1, dtype=np.float64)
        self.mean = load_E.sum() / num_gpus
        self.ends_EG = self._ends(np.arange(len(load_E)))
        self.loads_GO = self._arc_loads()

    def _ends(self, experts: np.ndarray) -> np.ndarray:
        """[len(experts), G] how long an arc starting at each GPU must be to hold each expert (G: the whole ring)."""
        starts = np.arange(self.num_gpus)
        ends = (self.start_E[experts][:, None] - starts[None]) % self.num_gpus + self.length_E[experts][:, None]
        return np.minimum(ends, self.num_gpus)

    def _arc_loads(self) -> np.ndarray:
        """[G, G] load inside the arc starting at GPU s of length l + 1."""
        num_gpus = self.num_gpus
        flat = (np.arange(num_gpus)[None] * (num_gpus + 1) + self.ends_EG).ravel()
        inside = np.bincount(flat, np.repeat(self.load_E, num_gpus), minlength=num_gpus * (num_gpus + 1))
        return np.cumsum(inside.reshape(num_gpus, num_gpus + 1), axis=1)[:, 1:]

    def _relative(self, loads: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Each arc's load plus its noise margin, over its length, over the mean GPU load."""
        loads = np.maximum(loads, 0.0)
        return (loads + NOISE_MARGIN * np.sqrt(loads)) / lengths / self.mean

    def values(self) -> np.ndarray:
        """[G, G] each arc's value (`_relative`); the layer's objective is their max."""
        return self._relative(self.loads_GO, self.lengths_1[None])

    def candidates(self, value_GO: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hot_H, cold_C): the experts a swap may take from the tightest arc (its `HOT` hottest) and those it may
        give it (the `COLD` coldest outside it and every one outside it spanning two or more GPUs)."""
        tight_start, tight_length = np.unravel_index(int(value_GO.argmax()), value_GO.shape)
        inside_E = self.ends_EG[:, tight_start] <= tight_length + 1
        hot, cold = np.flatnonzero(inside_E), np.flatnonzero(~inside_E)
        hot = hot[np.argsort(-self.load_E[hot], kind="stable")[:HOT]]
        coldest = np.zeros(len(self.load_E), dtype=bool)
        coldest[cold[np.argsort(self.load_E[cold], kind="stable")[:COLD]]] = True
        return hot, np.flatnonzero(coldest | (~inside_E & (self.length_E >= 2)))

    def best_swap(self) -> tuple[int, int] | None:
        """The swap (a, b) lowering the layer's objective most, if by at least `MIN_GAIN`; else None. Of the pairs
        `candidates` offers, the best by the exact score (`_exact_scores`); see the module docstring for the
        bounds that leave most pairs unscored."""
        value_GO = self.values()
        objective = float(value_GO.max())
        hot, cold = self.candidates(value_GO)
        if not len(hot) or not len(cold):
            return None
        bound_HC = self._bounds(hot, cold, value_GO, ceiling=objective - MIN_GAIN)
        bound_HC[self.load_E[hot][:, None] <= self.load_E[cold][None]] = np.inf  # b must be colder than a
        flat = bound_HC.ravel()
        order = np.flatnonzero(flat <= objective - MIN_GAIN)
        if not len(order):
            return None  # no pair can clear MIN_GAIN: most calls end here, before the arcs' reach is needed
        order = order[np.argsort(flat[order], kind="stable")]
        reach_GO = self._reach()
        # Every batch's floor is at least the first's and its gains at most the largest: the arcs that could reach
        # the first floor at the largest gain hold every arc a batch's exact scores need.
        largest = max(float((self.load_E[hot[order // len(cold)]] - self.load_E[cold[order % len(cold)]]).max()), 0.0)
        arcs = np.flatnonzero((value_GO + largest * reach_GO >= flat[order[0]]).ravel())
        best, pair = objective - MIN_GAIN, None
        for first in range(0, len(order), BATCH):
            batch = order[first:first + BATCH]
            if flat[batch[0]] > best or (pair is not None and flat[batch[0]] >= best):
                break  # no pair left can beat the best found
            a_B, b_B = hot[batch // len(cold)], cold[batch % len(cold)]
            scores_B = self._exact_scores(a_B, b_B, value_GO, reach_GO, flat[batch[0]], arcs)
            pick = int(np.argmin(scores_B))
            if scores_B[pick] < best or (pair is None and scores_B[pick] <= best):
                best, pair = float(scores_B[pick]), (int(a_B[pick]), int(b_B[pick]))
        return pair

    def _bounds(self, hot: np.ndarray, cold: np.ndarray, value_GO: np.ndarray, ceiling: float = np.inf
                ) -> np.ndarray:
        """[H, C] a lower bound on the objective once hot h and cold c trade arcs: the max of the arcs that do not
        hold h (their loads stay or grow), and of the exact new values of the `TIGHT_ARCS` tightest arcs and of
        the arcs around h's and c's own (starting up to `AROUND` GPUs before, ending up to `AROUND` after).
        Computed in that order, cheapest first: a pair whose bound already exceeds `ceiling` (a pair no better
        than that is of no use), or whose h is no hotter than c, skips the later terms, so its bound is the max
        of those computed, still below its exact score."""
        num_gpus = self.num_gpus
        gain_HC = self.load_E[hot][:, None] - self.load_E[cold][None]
        ends_hot = self.ends_EG[hot]
        # Arcs without h: those starting at s shorter than h's end from s, a prefix of each row.
        prefix_GO = np.concatenate([np.full((num_gpus, 1), -np.inf), np.maximum.accumulate(value_GO, axis=1)], axis=1)
        bound_HC = np.repeat(prefix_GO[np.arange(num_gpus)[None], ends_hot - 1].max(axis=1)[:, None], len(cold), axis=1)
        rows = np.flatnonzero(bound_HC[:, 0] <= ceiling)
        if not len(rows):
            return bound_HC
        # The tightest arcs, in the rows left: [H', C, K].
        tight = np.argpartition(-value_GO.ravel(), TIGHT_ARCS - 1)[:TIGHT_ARCS] if value_GO.size > TIGHT_ARCS \
            else np.arange(value_GO.size)
        start_K, column_K = np.unravel_index(tight, value_GO.shape)
        hot_in_HK = (ends_hot[rows][:, start_K] <= column_K + 1).astype(np.float64)
        cold_in_CK = (self.ends_EG[cold][:, start_K] <= column_K + 1).astype(np.float64)
        tight_HC = self._relative(self.loads_GO[start_K, column_K]
                                  - gain_HC[rows][..., None] * (hot_in_HK[:, None] - cold_in_CK[None]),
                                  column_K + 1.0).max(axis=2)
        bound_HC[rows] = np.maximum(bound_HC[rows], tight_HC)
        # The pairs left (Q of them, a hotter than b), around h's own arc and around c's: [Q, N] each.
        pair_h, pair_c = np.nonzero((bound_HC <= ceiling) & (gain_HC > 0))
        if not len(pair_h):
            return bound_HC
        gain_Q1 = gain_HC[pair_h, pair_c][:, None]
        start_HN, column_HN = self._around(hot)
        start_QN, column_QN = start_HN[pair_h], column_HN[pair_h]  # arcs holding h; c loses it unless it holds c
        cold_in_QN = self.ends_EG[cold[pair_c][:, None], start_QN] <= column_QN + 1
        around_h_Q = self._relative(self.loads_GO[start_QN, column_QN] - gain_Q1 * ~cold_in_QN,
                                    column_QN + 1.0).max(axis=1)
        start_CN, column_CN = self._around(cold)
        start_QN, column_QN = start_CN[pair_c], column_CN[pair_c]  # arcs holding c; it gains unless they hold h
        hot_in_QN = self.ends_EG[hot[pair_h][:, None], start_QN] <= column_QN + 1
        around_c_Q = self._relative(self.loads_GO[start_QN, column_QN] + gain_Q1 * ~hot_in_QN,
                                    column_QN + 1.0).max(axis=1)
        bound_HC[pair_h, pair_c] = np.maximum(bound_HC[pair_h, pair_c], np.maximum(around_h_Q, around_c_Q))
        return bound_HC

    def _around(self, experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([X, N], [X, N]) start and column (length - 1) of the arcs holding each expert's own arc that start up to
        `AROUND` GPUs before it and end up to `AROUND` after, N = (AROUND + 1)^2 (capped at the whole ring)."""
        before = np.repeat(np.arange(AROUND + 1), AROUND + 1)
        after = np.tile(np.arange(AROUND + 1), AROUND + 1)
        start = (self.start_E[experts][:, None] - before[None]) % self.num_gpus
        return start, np.minimum(self.length_E[experts][:, None] + before + after, self.num_gpus) - 1

    def _reach(self) -> np.ndarray:
        """[G, G] how much each arc's value can grow per token a swap adds to it, at most: f'(L) / (l * mean) for the
        margin's f(L) = L + NOISE_MARGIN * sqrt(L), concave, so f(L + g) <= f(L) + g f'(L); inf below one token."""
        loads_GO = self.loads_GO
        slope_GO = 1.0 + 0.5 * NOISE_MARGIN / np.sqrt(np.maximum(loads_GO, 1.0))
        return np.where(loads_GO >= 1.0, slope_GO / self.lengths_1[None] / self.mean, np.inf)

    def _exact_scores(self, a_B: np.ndarray, b_B: np.ndarray, value_GO: np.ndarray | None = None,
                      reach_GO: np.ndarray | None = None, floor: float = -np.inf,
                      arcs: np.ndarray | None = None) -> np.ndarray:
        """[B] the layer's objective once a_B[i] and b_B[i] trade arcs: each arc holding a but not b loses
        c_a - c_b, each holding b but not a gains it. Scored on the arcs whose value could reach `floor` (a lower
        bound on every pair's score; -inf: every arc): those at or above it, and those a pair's gain could lift
        to it (they hold b but not a); the others stay below it, so the max is the same. `arcs`: flat indices of
        arcs that hold all of those (None: every arc), to look among."""
        gain_B = self.load_E[a_B] - self.load_E[b_B]
        arcs = np.arange(self.num_gpus * self.num_gpus) if arcs is None else arcs
        if np.isfinite(floor):
            # Only arcs at the floor or within the batch's largest gain of it can be kept: the containment below
            # is needed on those alone (most of `arcs` are far below the floor).
            value_A, reach_A = value_GO.ravel()[arcs], reach_GO.ravel()[arcs]
            rising_B1 = np.maximum(gain_B, 0.0)[:, None]
            near = np.flatnonzero((value_A >= floor) | (value_A + float(rising_B1.max(initial=0.0)) * reach_A >= floor))
            arcs, value_A, reach_A = arcs[near], value_A[near], reach_A[near]
        start_A, column_A = np.unravel_index(arcs, (self.num_gpus, self.num_gpus))
        in_a = self.ends_EG[a_B][:, start_A] <= column_A + 1  # [B, A]
        in_b = self.ends_EG[b_B][:, start_A] <= column_A + 1
        if np.isfinite(floor):
            rising_BA = in_b & ~in_a & (value_A[None] + rising_B1 * reach_A[None] >= floor)
            kept = np.flatnonzero((value_A >= floor) | rising_BA.any(axis=0))
            arcs, column_A, in_a, in_b = arcs[kept], column_A[kept], in_a[:, kept], in_b[:, kept]
        loads_BA = self.loads_GO.ravel()[arcs][None] - gain_B[:, None] * (in_a.astype(np.float64) - in_b)
        return self._relative(loads_BA, column_A + 1.0).max(axis=1)

    def swap(self, a: int, b: int) -> None:
        """a and b trade arcs; the arc loads follow."""
        self.start_E[[a, b]] = self.start_E[[b, a]]
        self.length_E[[a, b]] = self.length_E[[b, a]]
        self.ends_EG[[a, b]] = self.ends_EG[[b, a]]
        self.loads_GO = self._arc_loads()
