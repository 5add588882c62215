"""Local search over which expert holds which replica set of a ring layout, scored exactly on the window's steps.

Legend: T window steps, E logical experts, G GPUs, S slots per GPU, P = G * S slots, O = G(G-1)+1 arcs of the
ring (every run of 1..G-1 consecutive GPUs, and the whole ring), B swaps scored per round (a batch of one layer).

Why: the chain layout (`chain_layout`) lays replica sets along a ring and fills them by a rule (ring order,
least-loaded GPU for one-replica experts). On small clusters with few tokens per GPU and step, the steps of the
window still differ from that rule: the best split leaves the busiest GPU above the mean on some fitted steps,
because on such a step two hot experts sit on one arc of the ring and their tokens cannot leave it. Trading the
replica sets of such experts with colder ones removes most of that excess (figures: docs/placement.md, 'Ring
search').

Exact score without the router: when every expert's replicas lie on consecutive GPUs (an arc; chain layouts are
built so), the busiest GPU under the best split of one step equals max over arcs H of c(experts inside H) / speed(H)
(`dynamic_split` gives the general form over GPU sets; the best set is a union of arcs, and a union of disjoint
arcs never beats its best arc, since an arc-shaped replica set inside the union lies inside one of them). So the
fitted objective, the mean over steps of that maximum over the mean GPU load, is one product of the [T, E] counts
with the [E, O] containment of experts in arcs. Swapping experts a and b changes every arc's load by
(c_b - c_a)(in_a - in_b), so B candidate swaps are scored at once by broadcasting. When some expert's replicas are
not consecutive the arc value is only a lower bound on the objective; the policy re-scores every candidate with
the router and keeps the best, so the search can never make a fit worse.

Moves: swap two experts' labels in the slot map. Each takes the other's replica set, so replica counts move with
the sets (a hot one-replica expert can trade with a cold two-replica one); slots per GPU and "no GPU holds two
replicas of one expert" are kept. Each round scores B random pairs and applies the best if it improves; the search
stops after `patience` rounds without improvement, after `max_rounds`, or at the deadline.

The policy runs the search only where a round scores enough swaps (`search_pays_off`); there it tightens the
`cpsat` fit of small clusters and leaves the held-out steps as they were (figures: docs/placement.md, 'Ring
search').
"""

import time
from collections.abc import Callable

import numpy as np

MAX_ROUNDS = 400
PATIENCE = 6
BATCH_ELEMENTS = 2_000_000  # T * O * B per round (16 MB of float64)
MIN_BATCH = 64  # fewer swaps per round than this: too slow to pay off, the policy skips the search


def search_pays_off(num_steps: int, num_gpus: int) -> bool:
    """Whether a round scores at least MIN_BATCH swaps: T * O * MIN_BATCH <= BATCH_ELEMENTS.

    True for the small clusters where the search matters (8 steps: up to 62 GPUs). On large clusters the chain
    layout already fits closely, and the search would spend most of the budget for no gain in the fitted objective
    (figures: docs/placement.md, 'Ring search').
    """
    return num_steps * (num_gpus * (num_gpus - 1) + 1) * MIN_BATCH <= BATCH_ELEMENTS


def arc_masks(num_gpus: int) -> np.ndarray:
    """[O, G] bool: arc a covers GPU g; arcs of lengths 1..G-1 from every start, then the whole ring."""
    lengths = np.repeat(np.arange(1, num_gpus), num_gpus)
    starts = np.tile(np.arange(num_gpus), num_gpus - 1)
    offset = (np.arange(num_gpus)[None, :] - starts[:, None]) % num_gpus
    masks = offset < lengths[:, None]
    return np.vstack([masks, np.ones((1, num_gpus), dtype=bool)])


def ring_objective(counts_TE: np.ndarray, phy2log_P: np.ndarray, num_gpus: int, slots_per_gpu: int,
                   speed_G: np.ndarray | None = None) -> float:
    """Mean over steps of the busiest GPU (load / speed) under the best split, over the mean GPU load.

    Exact when every expert's replicas lie on consecutive GPUs of the ring, a lower bound otherwise.
    """
    return _SearchState(counts_TE, phy2log_P, num_gpus, slots_per_gpu, speed_G).objective()


def ring_search(
    counts_TE: np.ndarray,
    phy2log_P: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    speed_G: np.ndarray | None = None,
    seed: int | tuple[int, ...] = 0,
    deadline: float | None = None,
    max_rounds: int = MAX_ROUNDS,
    patience: int = PATIENCE,
    stop: Callable[[], None] | None = None,
) -> tuple[np.ndarray, float, int]:
    """Improve one layer's ring layout on the window's steps by swapping experts' replica sets.

    Args:
        counts_TE: [T, E] tokens per expert on each step of the window.
        phy2log_P: [P] int, the starting layout; slot p lives on GPU p // S.
        num_gpus, slots_per_gpu: G, S.
        speed_G: [G] relative GPU speeds (default all 1).
        seed: seed of the random pairs.
        deadline: `time.perf_counter()` value to stop at (default none: stop on `patience` / `max_rounds`, the
            same rounds in any process).
        stop: called before each round; it raises to end the search at once (a fit being stopped), else changes
            nothing.

    Returns:
        (phy2log_P [P] int64, its `ring_objective`, never worse than the start's; the rounds it ran, what a
        deterministic budget charges).
    """
    state = _SearchState(counts_TE, phy2log_P, num_gpus, slots_per_gpu, speed_G)
    num_steps, num_arcs = state.loads_TO.shape
    num_experts = counts_TE.shape[1]
    batch = max(1, BATCH_ELEMENTS // (num_steps * num_arcs))
    rng = np.random.default_rng(seed)
    best = state.objective()
    idle = rounds = 0
    for rounds in range(max_rounds + 1):
        if rounds == max_rounds or idle >= patience or (deadline is not None and time.perf_counter() >= deadline):
            break
        if stop is not None:
            stop()
        a = rng.integers(0, num_experts, batch)
        b = rng.integers(0, num_experts, batch)
        # [T, O, B] arc loads after each swap.
        swapped = state.loads_TO[:, :, None] + ((state.counts_TE[:, b] - state.counts_TE[:, a])[:, None, :]
                                                * (state.inside_OE[:, a] - state.inside_OE[:, b])[None])
        scores = state.score(swapped)
        pick = int(np.argmin(scores))
        if scores[pick] < best - 1e-12:
            best = float(scores[pick])
            state.swap(int(a[pick]), int(b[pick]), swapped[:, :, pick])
            idle = 0
        else:
            idle += 1
    return state.phy2log_P, float(best), rounds


class _SearchState:
    """The layout being searched and its arc loads."""

    def __init__(self, counts_TE, phy2log_P, num_gpus, slots_per_gpu, speed_G) -> None:
        num_experts = counts_TE.shape[1]
        self.counts_TE = np.asarray(counts_TE, dtype=np.float64)
        self.phy2log_P = np.array(phy2log_P, dtype=np.int64)
        speed = np.ones(num_gpus) if speed_G is None else np.asarray(speed_G, dtype=np.float64)
        masks_OG = arc_masks(num_gpus)
        self.speed_O = masks_OG @ speed
        replicas_GE = np.zeros((num_gpus, num_experts))
        np.add.at(replicas_GE, (np.arange(len(self.phy2log_P)) // slots_per_gpu, self.phy2log_P), 1.0)
        # [O, E] 1 where all of an expert's replicas lie inside the arc.
        self.inside_OE = (masks_OG.astype(np.float64) @ replicas_GE == replicas_GE.sum(axis=0)).astype(np.float64)
        self.loads_TO = self.counts_TE @ self.inside_OE.T
        self.mean_T = np.maximum(self.counts_TE.sum(axis=1) / num_gpus, 1e-12)

    def objective(self) -> float:
        """The fitted objective of the layout as it stands."""
        return float(self.score(self.loads_TO[:, :, None])[0])

    def score(self, loads_TOB: np.ndarray) -> np.ndarray:
        """[B] fitted objective of each candidate's arc loads [T, O, B]."""
        busiest_TB = (loads_TOB / self.speed_O[None, :, None]).max(axis=1)
        return (busiest_TB / self.mean_T[:, None]).mean(axis=0)

    def swap(self, a: int, b: int, loads_TO: np.ndarray) -> None:
        is_a, is_b = self.phy2log_P == a, self.phy2log_P == b
        self.phy2log_P[is_a], self.phy2log_P[is_b] = b, a
        self.inside_OE[:, [a, b]] = self.inside_OE[:, [b, a]]
        self.loads_TO = loads_TO.copy()
