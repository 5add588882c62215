"""Follow a drifting expert mix between refits: a few experts of a ring layout trade replica sets.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, O arcs of the ring (G starts x
lengths 1..G), A screened arcs, B candidate swaps.

Why: a refit lands `lag` steps after its window and then serves for an interval, so the placement serving a step was
fitted on traffic 100-200 steps older. Bursts aside, what it costs is the mix that moved meanwhile: an arc of GPUs
whose experts gained load can no longer shed it, and the live router's exact split on a chain layout then leaves its
GPUs above the mean on most steps (figures: docs/placement.md, 'Drift swaps'). A swap of two experts' replica sets
changes a few slots (two experts' weights per replica) and keeps the layout a ring layout, so the live router's
exact chain split still applies; a handful per layer and patch (`placement.burst_patch.PatchConfig.drift_swaps`),
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
more GPUs; the pairs are screened on the arcs of length up to `SCREEN_LENGTH` and the `SCREEN_TOP` tightest arcs; the
`VERIFIED` best of them are scored on every arc, and the best is applied if it lowers the objective by `MIN_GAIN`; up
to `max_swaps` swaps. The screen scores each arc on its value's tangent in float32 (the margin curves by a few tokens
over a swap's load), the verification exactly. The static weights stay with the slots: an expert takes the other's
replica set with its weights, which still sum to one per expert (the live router splits a ring layout exactly, without
them).
"""

import numpy as np

from placement.placement_model import Placement

NOISE_MARGIN = 3.0  # standard deviations of an arc's per-step noise (sqrt of its tokens) added to its load
MIN_GAIN = 5e-4  # a swap is applied only if it lowers the layer's objective by this much
HOT = 16  # experts inside the tightest arc tried per swap: the hottest
COLD = 64  # experts outside it tried per swap: the coldest (and every one spanning two or more GPUs)
SCREEN_LENGTH = 8  # candidate swaps are screened on every arc up to this length ...
SCREEN_TOP = 256  # ... and on this many of the tightest arcs of any length
VERIFIED = 32  # the best screened swaps, scored on every arc


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
    order_LG = None if ring_order_LG is None else _check_ring_order(ring_order_LG, num_layers, num_gpus)
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



def _check_ring_order(ring_order_LG: np.ndarray, num_layers: int, num_gpus: int) -> np.ndarray:
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
               max_swaps: int) -> np.ndarray:
    """One layer's slot map after the swaps that pay (see the module docstring); unchanged if not a ring layout."""
    current = np.array(phy2log_P, dtype=np.int64)
    load = np.asarray(load_E, dtype=np.float64)
    spans = ring_spans(current, len(load), num_gpus, slots_per_gpu)
    if spans is None or load.sum() <= 0 or max_swaps == 0:
        return current
    ring = _Ring(spans[0], spans[1], load, num_gpus)
    for _ in range(max_swaps):
        pair = ring.best_swap()
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
        self.loads_GO = self._arc_loads()

    def _ends(self, experts: np.ndarray) -> np.ndarray:
        """[len(experts), G] how long an arc starting at each GPU must be to hold each expert (G: the whole ring)."""
        starts = np.arange(self.num_gpus)
        ends = (self.start_E[experts][:, None] - starts[None]) % self.num_gpus + self.length_E[experts][:, None]
        return np.minimum(ends, self.num_gpus)

    def _arc_loads(self) -> np.ndarray:
        """[G, G] load inside the arc starting at GPU s of length l + 1."""
        num_gpus = self.num_gpus
        ends_EG = self._ends(np.arange(len(self.load_E)))
        flat = (np.arange(num_gpus)[None] * (num_gpus + 1) + ends_EG).ravel()
        inside = np.bincount(flat, np.repeat(self.load_E, num_gpus), minlength=num_gpus * (num_gpus + 1))
        return np.cumsum(inside.reshape(num_gpus, num_gpus + 1), axis=1)[:, 1:]

    def _relative(self, loads: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Each arc's load plus its noise margin, over its length, over the mean GPU load."""
        loads = np.maximum(loads, 0.0)
        return (loads + NOISE_MARGIN * np.sqrt(loads)) / lengths / self.mean

    def best_swap(self) -> tuple[int, int] | None:
        """The swap (a, b) lowering the layer's objective most, if by at least `MIN_GAIN`; else None."""
        num_gpus = self.num_gpus
        value_GO = self._relative(self.loads_GO, self.lengths_1[None])
        objective = float(value_GO.max())
        tight_start, tight_length = np.unravel_index(int(value_GO.argmax()), value_GO.shape)
        ends_EG = self._ends(np.arange(len(self.load_E)))
        inside_E = ends_EG[:, tight_start] <= tight_length + 1
        hot, cold = np.flatnonzero(inside_E), np.flatnonzero(~inside_E)
        hot = hot[np.argsort(-self.load_E[hot], kind="stable")[:HOT]]
        cold = np.union1d(cold[np.argsort(self.load_E[cold], kind="stable")[:COLD]], cold[self.length_E[cold] >= 2])
        if not len(hot) or not len(cold):
            return None
        # Screened arcs: every arc up to SCREEN_LENGTH long and the SCREEN_TOP tightest of any length.
        short = np.ravel_multi_index(np.nonzero(np.ones((num_gpus, min(SCREEN_LENGTH, num_gpus)), dtype=bool)),
                                     (num_gpus, num_gpus))
        arcs = np.union1d(short, np.argsort(-value_GO.ravel(), kind="stable")[:SCREEN_TOP])
        start_A, column_A = np.unravel_index(arcs, (num_gpus, num_gpus))
        in_hot, in_cold = ((ends_EG[experts][:, start_A] <= column_A[None] + 1).astype(np.float32)
                           for experts in (hot, cold))
        gain_HC = self.load_E[hot][:, None] - self.load_E[cold][None]
        # Screened in float32 on the arc values' tangent, f(L + d) ~ f(L) + f'(L) d: [H, C, A] each arc's value once
        # hot h and cold c trade arcs (the arcs holding h lose the gain, those holding c win it).
        loads_A = np.maximum(self.loads_GO[start_A, column_A], 0.0)
        lengths_A = self.lengths_1[column_A]
        slope_A = ((1.0 + NOISE_MARGIN / (2.0 * np.sqrt(np.maximum(loads_A, 1.0)))) / lengths_A / self.mean)
        value_A = self._relative(loads_A, lengths_A).astype(np.float32)
        lose_HA, win_CA = in_hot * slope_A.astype(np.float32), in_cold * slope_A.astype(np.float32)
        screened_HC = (value_A - gain_HC[..., None].astype(np.float32) * (lose_HA[:, None] - win_CA[None])).max(axis=-1)
        screened_HC = screened_HC.astype(np.float64)
        screened_HC[gain_HC <= 0] = np.inf  # b must be colder than a
        order = np.argsort(screened_HC.ravel(), kind="stable")[:VERIFIED]
        order = order[np.isfinite(screened_HC.ravel()[order])]
        if not len(order):
            return None
        a_B, b_B = hot[order // len(cold)], cold[order % len(cold)]
        exact_B = self._exact_scores(a_B, b_B, ends_EG)
        pick = int(np.argmin(exact_B))
        if exact_B[pick] > objective - MIN_GAIN:
            return None
        return int(a_B[pick]), int(b_B[pick])

    def _exact_scores(self, a_B: np.ndarray, b_B: np.ndarray, ends_EG: np.ndarray) -> np.ndarray:
        """[B] the layer's objective, every arc scored, once a_B[i] and b_B[i] trade arcs: each arc holding a but
        not b loses c_a - c_b, each holding b but not a gains it."""
        lengths = np.arange(1, self.num_gpus + 1)
        in_a = ends_EG[a_B][:, :, None] <= lengths  # [B, G starts, G lengths]
        in_b = ends_EG[b_B][:, :, None] <= lengths
        gain_B = self.load_E[a_B] - self.load_E[b_B]
        loads_BGO = self.loads_GO[None] - gain_B[:, None, None] * (in_a.astype(np.float64) - in_b)
        return self._relative(loads_BGO, self.lengths_1).reshape(len(a_B), -1).max(axis=1)

    def swap(self, a: int, b: int) -> None:
        """a and b trade arcs; the arc loads follow."""
        self.start_E[[a, b]] = self.start_E[[b, a]]
        self.length_E[[a, b]] = self.length_E[[b, a]]
        self.loads_GO = self._arc_loads()
