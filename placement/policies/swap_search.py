"""Local search over which slot holds which expert, scored on the window's steps under equal split.

Legend: T window steps, E logical experts, G GPUs, S slots per GPU, P = G * S slots.

Why: at two to four slots per GPU (DeepSeek-V3's EP144 x 2, EP72 x 4, or no redundant expert at all), a GPU's load is
the sum of a few experts' loads, and DeepSeek's greedy (heaviest replica first onto the lightest GPU with a free slot)
leaves the sums uneven: with four experts a GPU and no spare slot, the last ones packed cannot even out what the first
ones left. A GPU whose experts' tokens cannot move (one replica each) is as busy as that sum on every step, so the sums
must be even step by step, not only on average.

Objective: the mean over the window's steps of the busiest GPU's load (each expert's tokens split equally over its
replicas, a GPU's load divided by its speed), over the mean GPU load: exact for equal split and for placements
without replicas; under the per-step split a proxy, which the `cpsat` policy re-scores with the router.

Moves, each kept only if it lowers the objective:
- swap: two slots on two GPUs trade experts (never putting two replicas of one expert on one GPU; under node
  limits, only within a node). Candidates: every slot of one of the busiest GPUs against every slot elsewhere,
  scored at once by broadcasting (the others' busiest load per step comes from each step's three busiest GPUs);
- recount (with `recount`, one-step windows only): a replica moves from one expert (which keeps at least one) to
  another, as equal split then re-divides both experts' tokens: a slot of the busiest GPU to an expert it does not
  hold, or a slot elsewhere to one of the busiest GPU's experts.

With `min_z` > 0 (and two or more steps) a swap is kept only if its gain is also larger than `min_z` standard errors
of its per-step gains: a pairing that wins on the window by a few of its noisy or bursty steps is the window's luck,
not a gain the steps after it keep (where this matters: `cpsat_layer.swaps_only`, two slots a GPU). With
`holdout_share` > 0 as well, the search first runs on the window's older steps alone, and its layout must beat the
start on the newest steps, which took no part in it; only then does the search run on the whole window, else the
start is kept. The gate asks whether the search, on this layer's traffic, finds gains that carry forward in time:
the best of thousands of candidate swaps gains more on the steps it was chosen on than anywhere else (the best of
many noisy draws), and under drift the steps after a window are unlike it; the newest steps are the closest to those
the placement will serve. The gate judges the search's whole layout, not swap by swap: a sequence of swaps cut where
one fails a check is a layout neither search would choose, and served traffic of other domains finds that out.

The search is deterministic: the same input gives the same moves, and it stops after `max_evaluations` candidate
evaluations (element-steps), when no move improves, or at the first GPU that no move relieves.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Busiest GPUs tried for an improving move before the search stops.
GPUS_TRIED = 3
# A move must lower the objective by this much (relative) to count.
IMPROVEMENT = 1e-9


@dataclass
class _State:
    """The slot map being searched and what scoring it needs (arrays as named in the module legend)."""

    counts_TE: np.ndarray  # float64
    slots_GS: np.ndarray  # int64, expert of each slot
    replicas_E: np.ndarray  # int64
    speed_G: np.ndarray
    mean_T: np.ndarray
    loads_TG: np.ndarray | None = None

    def refresh(self) -> None:
        items_TGS = self.counts_TE[:, self.slots_GS] / self.replicas_E[self.slots_GS]
        self.loads_TG = items_TGS.sum(axis=2) / self.speed_G

    def objective(self) -> float:
        return float((self.loads_TG.max(axis=1) / self.mean_T).mean())


def swap_search(
    counts_TE: np.ndarray,
    phy2log_P: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    speed_G: np.ndarray | None = None,
    max_evaluations: float = 5e7,
    recount: bool = False,
    node_of_G: np.ndarray | None = None,
    min_z: float = 0.0,
    stop: Callable[[], None] | None = None,
    holdout_share: float = 0.0,
) -> tuple[np.ndarray, float, float]:
    """Improve one layer's slot map by swaps (and with `recount`, replica moves) under equal split.

    Args:
        counts_TE: [T, E] tokens per expert on each step of the window (T >= 1).
        phy2log_P: [P] int, the starting slot map; slot p lives on GPU p // S.
        num_gpus, slots_per_gpu: G, S.
        speed_G: [G] relative GPU speeds (default all 1).
        max_evaluations: the most candidate-step evaluations (T times the candidates scored), the search's budget.
        recount: also move replicas between experts (only where T == 1).
        node_of_G: [G] node of each GPU: swaps only within a node and no recount (keeps node limits), or None.
        min_z: >= 0; a swap's mean gain over the steps must exceed this many standard errors of its per-step gains
            (0: any improvement; not applied to one-step windows).
        stop: called before each move; it raises to end the search at once (a fit being stopped), else changes
            nothing.
        holdout_share: in [0, 1); > 0 (with `min_z` > 0): the search on the window's older steps must beat the start
            on its newest H = max(2, round(holdout_share * T)) steps (mean over them of the busiest load over the
            mean) before the search on the whole window is run; else the start is returned (where T >= 2 H + 2;
            else unused). Each of the two searches gets half of `max_evaluations`.

    Returns:
        (phy2log_P [P] int64, each GPU's experts in ascending order; its objective on the window; the evaluations
        spent). Never worse than the start on the window.
    """
    counts = np.asarray(counts_TE, dtype=np.float64)
    speed = np.ones(num_gpus) if speed_G is None else np.asarray(speed_G, dtype=np.float64)
    older, newest = _split_held_out(counts, holdout_share if min_z > 0 else 0.0)
    search = (num_gpus, slots_per_gpu, speed, recount, node_of_G, min_z, stop)
    if newest is None:
        return _search(counts, phy2log_P, max_evaluations, *search)
    trial, _, spent = _search(older, phy2log_P, max_evaluations / 2, *search)
    start = np.array(phy2log_P, dtype=np.int64)
    if not _beats(newest, trial, start, num_gpus, speed):
        whole = _state(counts, start.reshape(num_gpus, slots_per_gpu), _replicas(start, counts.shape[1]), speed)
        return np.sort(start.reshape(num_gpus, -1), axis=1).reshape(-1), whole.objective(), spent
    phy2log, best, more = _search(counts, phy2log_P, max_evaluations / 2, *search)
    return phy2log, best, spent + more


def _search(counts: np.ndarray, phy2log_P: np.ndarray, max_evaluations: float, num_gpus: int, slots_per_gpu: int,
            speed: np.ndarray, recount: bool, node_of_G: np.ndarray | None, min_z: float,
            stop: Callable[[], None] | None) -> tuple[np.ndarray, float, float]:
    """The search itself on the steps `counts` [T, E] (float64), from `phy2log_P`: `swap_search`'s return."""
    num_steps, num_experts = counts.shape
    slots = np.array(phy2log_P, dtype=np.int64).reshape(num_gpus, slots_per_gpu)
    state = _state(counts, slots, _replicas(slots, num_experts), speed)
    best = state.objective()
    spent = 0.0
    swap_cost = num_steps * slots_per_gpu * num_gpus * slots_per_gpu
    recount_cost = slots_per_gpu * (num_gpus * num_experts + num_gpus * num_gpus * slots_per_gpu)
    use_recount = recount and num_steps == 1 and node_of_G is None
    while spent < max_evaluations:
        if stop is not None:
            stop()
        moved, spent = _one_move(state, slots, best, spent, max_evaluations, (swap_cost, recount_cost),
                                 use_recount, node_of_G, min_z if num_steps > 1 else 0.0)
        if not moved:
            break
        state.refresh()
        best = state.objective()
    return np.sort(slots, axis=1).reshape(-1), best, spent


def _replicas(phy2log: np.ndarray, num_experts: int) -> np.ndarray:
    """[E] int64 replicas of each expert in the slot map `phy2log` (any shape)."""
    return np.bincount(np.ravel(phy2log), minlength=num_experts).astype(np.int64)


def _beats(counts_TE: np.ndarray, challenger_P: np.ndarray, start_P: np.ndarray, num_gpus: int,
           speed_G: np.ndarray) -> bool:
    """Whether the slot map `challenger_P` has a lower mean busiest-over-mean load than `start_P` on `counts_TE`
    (the same experts replicated as often: swaps keep the replica counts)."""
    replicas_E = _replicas(start_P, counts_TE.shape[1])
    objectives = [_state(counts_TE, np.asarray(slots_P).reshape(num_gpus, -1), replicas_E, speed_G).objective()
                  for slots_P in (challenger_P, start_P)]
    return objectives[0] < objectives[1] * (1 - IMPROVEMENT)


def _split_held_out(counts_TE: np.ndarray, holdout_share: float) -> tuple[np.ndarray, np.ndarray | None]:
    """(the window's older steps, its newest H = max(2, round(holdout_share * T)) steps held out of their search; or
    (the window, None) when `holdout_share` is 0 or T < 2 H + 2)."""
    held = max(2, round(holdout_share * len(counts_TE)))
    if holdout_share <= 0 or len(counts_TE) < 2 * held + 2:
        return counts_TE, None
    return counts_TE[:-held], counts_TE[-held:]


def _state(counts_TE: np.ndarray, slots_GS: np.ndarray, replicas_E: np.ndarray, speed_G: np.ndarray) -> "_State":
    """The search state of these steps, loads computed (the slot map and replica counts are shared, not copied)."""
    state = _State(counts_TE, slots_GS, replicas_E, speed_G, np.maximum(counts_TE.sum(axis=1) / speed_G.sum(), 1e-12))
    state.refresh()
    return state


def _one_move(state: "_State", slots: np.ndarray, best: float, spent: float, max_evaluations: float,
              costs: tuple[float, float], use_recount: bool, node_of_G: np.ndarray | None,
              min_z: float) -> tuple[bool, float]:
    """Apply to `slots` [G, S] the first improving move found from the busiest GPUs on (a swap, with `min_z` one
    whose gain clears the steps' noise, else with `use_recount` a replica moved between experts); return (whether one
    was applied, evaluations spent so far)."""
    swap_cost, recount_cost = costs
    for gpu in _busiest(state.loads_TG, GPUS_TRIED):
        spent += swap_cost
        found = _best_swap(state, int(gpu), node_of_G)
        if (found is not None and found[0] < best * (1 - IMPROVEMENT)
                and _clears_noise(state, int(gpu), found, min_z)):
            _, slot, other, other_slot = found
            slots[gpu, slot], slots[other, other_slot] = slots[other, other_slot], slots[gpu, slot]
            return True, spent
        if use_recount:
            spent += recount_cost
            found = _best_recount(state, int(gpu))
            if found is not None and found[0] < best * (1 - IMPROVEMENT):
                _, flat, expert = found
                flat_slots = slots.reshape(-1)  # a view: the move lands in `slots`
                state.replicas_E[flat_slots[flat]] -= 1
                state.replicas_E[expert] += 1
                flat_slots[flat] = expert
                return True, spent
        if spent >= max_evaluations:
            break
    return False, spent


def _clears_noise(state: _State, gpu: int, found: tuple, min_z: float) -> bool:
    """Whether the swap `found` (from `_best_swap`) of a slot of `gpu` gains more than `min_z` standard errors of its
    per-step gains in the objective (always with `min_z` 0)."""
    if min_z <= 0:
        return True
    gain_T = _swap_gain_T(state, gpu, found)
    return bool(gain_T.mean() > min_z * gain_T.std(ddof=1) / np.sqrt(len(gain_T)))


def _swap_gain_T(state: _State, gpu: int, found: tuple) -> np.ndarray:
    """[T] each step's fall of the busiest load over the mean under the swap `found` (from `_best_swap`) of a slot of
    `gpu`, on the steps of `state`."""
    _, slot, other, other_slot = found
    mine_T = state.counts_TE[:, state.slots_GS[gpu, slot]] / state.replicas_E[state.slots_GS[gpu, slot]]
    theirs_T = (state.counts_TE[:, state.slots_GS[other, other_slot]]
                / state.replicas_E[state.slots_GS[other, other_slot]])
    loads_TG = state.loads_TG.copy()
    loads_TG[:, gpu] += (theirs_T - mine_T) / state.speed_G[gpu]
    loads_TG[:, other] += (mine_T - theirs_T) / state.speed_G[other]
    return (state.loads_TG.max(axis=1) - loads_TG.max(axis=1)) / state.mean_T


def _busiest(loads_TG: np.ndarray, count: int) -> np.ndarray:
    """The `count` GPUs whose load most exceeds each step's runner-up, summed over the steps they top, busiest
    first (ties by GPU index)."""
    num_steps, num_gpus = loads_TG.shape
    if num_gpus == 1:
        return np.zeros(1, dtype=np.int64)
    top2 = np.argpartition(-loads_TG, 1, axis=1)[:, :2]
    values = np.take_along_axis(loads_TG, top2, axis=1)
    first = np.where(values[:, 0] >= values[:, 1], top2[:, 0], top2[:, 1])
    excess = np.abs(values[:, 0] - values[:, 1]) + 1e-12
    score_G = np.bincount(first, weights=excess, minlength=num_gpus) + 1e-9 * loads_TG.sum(axis=0)
    return np.argsort(-score_G, kind="stable")[:count]


def _others_max(loads_TG: np.ndarray, gpu: int) -> np.ndarray:
    """[T, G] for each step and each GPU h, the busiest load among the GPUs other than `gpu` and h."""
    num_steps, num_gpus = loads_TG.shape
    keep = min(3, num_gpus)
    top = np.argsort(-loads_TG, axis=1, kind="stable")[:, :keep]  # [T, 3]
    values = np.take_along_axis(loads_TG, top, axis=1)
    result = np.zeros((num_steps, num_gpus))
    filled = np.zeros((num_steps, num_gpus), dtype=bool)
    others = np.arange(num_gpus)
    for rank in range(keep):
        ok = (top[:, rank:rank + 1] != gpu) & (top[:, rank:rank + 1] != others[None]) & ~filled
        result = np.where(ok, values[:, rank:rank + 1], result)
        filled |= ok
    return result


def _best_swap(state: _State, gpu: int, node_of_G: np.ndarray | None) -> tuple | None:
    """(objective, slot, other GPU, other slot) of the best swap of a slot of `gpu` with a slot elsewhere, or None."""
    slots, speed = state.slots_GS, state.speed_G
    items_TGS = state.counts_TE[:, slots] / state.replicas_E[slots]
    mine_TS = items_TGS[:, gpu]
    delta_TSGR = items_TGS[:, None] - mine_TS[:, :, None, None]  # [T, S (mine), G (other), S (theirs)]
    loads_TG = state.loads_TG
    new_mine = loads_TG[:, gpu, None, None, None] + delta_TSGR / speed[gpu]
    new_other = loads_TG[:, None, :, None] - delta_TSGR / speed[None, None, :, None]
    rest = _others_max(loads_TG, gpu)[:, None, :, None]
    scores = (np.maximum(np.maximum(new_mine, new_other), rest) / state.mean_T[:, None, None, None]).mean(axis=0)
    # Not with itself, not making two replicas of one expert share a GPU, under node limits within the node.
    scores[:, gpu, :] = np.inf
    on_mine = np.isin(slots, slots[gpu])  # [G, S]: slot holds an expert that `gpu` holds too
    scores[:, on_mine] = np.inf
    for slot in range(slots.shape[1]):
        scores[slot, (slots == slots[gpu, slot]).any(axis=1), :] = np.inf
    if node_of_G is not None:
        scores[:, node_of_G != node_of_G[gpu], :] = np.inf
    pick = int(np.argmin(scores))
    if not np.isfinite(scores.flat[pick]):
        return None
    slot, other, other_slot = np.unravel_index(pick, scores.shape)
    return float(scores.flat[pick]), int(slot), int(other), int(other_slot)


def _best_recount(state: _State, gpu: int) -> tuple | None:
    """(objective, slot, new expert) of the best replica move that relieves `gpu` (one-step windows: loads are the
    step's), or None. Two kinds: a slot of `gpu` changes to another expert (its expert keeps a replica elsewhere),
    or any slot elsewhere changes to one of `gpu`'s experts, which then sheds a share on `gpu` (the slot's expert
    keeps a replica elsewhere). `slot` is a flat index into the slot map."""
    slots, replicas, speed = state.slots_GS, state.replicas_E, state.speed_G
    counts_E = state.counts_TE[0]
    num_gpus, num_slots = slots.shape
    num_experts = len(counts_E)
    holds_GE = np.zeros((num_gpus, num_experts))
    np.add.at(holds_GE, (np.repeat(np.arange(num_gpus), num_slots), slots.ravel()), 1.0)
    loads_G = state.loads_TG[0] * speed
    mean = state.mean_T[0]
    share_E = counts_E / replicas
    grow_E = np.where(replicas > 1, counts_E / np.maximum(replicas - 1, 1) - share_E, np.inf)  # one replica less
    shed_E = share_E - counts_E / (replicas + 1)  # one replica more
    best = None
    # A slot of `gpu` changes from its expert to any expert `gpu` does not hold.
    for slot in range(num_slots):
        expert = slots[gpu, slot]
        if replicas[expert] < 2:
            continue
        base_G = loads_G + holds_GE[:, expert] * grow_E[expert]
        base_G[gpu] -= share_E[expert] + grow_E[expert]
        new_GE = base_G[:, None] - holds_GE * shed_E[None]
        new_GE[gpu] += counts_E / (replicas + 1)
        scores = (new_GE / speed[:, None]).max(axis=0) / mean
        scores[holds_GE[gpu] > 0] = np.inf
        pick = int(np.argmin(scores))
        if np.isfinite(scores[pick]) and (best is None or scores[pick] < best[0]):
            best = (float(scores[pick]), gpu * num_slots + slot, pick)
    # Any slot elsewhere changes to one of `gpu`'s experts.
    expert_P = slots.ravel()
    gpu_P = np.repeat(np.arange(num_gpus), num_slots)
    movable_P = (replicas[expert_P] > 1) & (gpu_P != gpu)
    for target in np.unique(slots[gpu]):
        base_G = loads_G - holds_GE[:, target] * shed_E[target]
        new_PG = np.repeat(base_G[None], len(expert_P), axis=0)
        new_PG += holds_GE.T[expert_P] * np.where(np.isfinite(grow_E[expert_P]), grow_E[expert_P], 0.0)[:, None]
        rows = np.arange(len(expert_P))
        new_PG[rows, gpu_P] += -share_E[expert_P] - np.where(np.isfinite(grow_E[expert_P]), grow_E[expert_P], 0.0) \
            + counts_E[target] / (replicas[target] + 1)
        scores = (new_PG / speed[None]).max(axis=1) / mean
        ok = movable_P & (expert_P != target) & (holds_GE[gpu_P, target] == 0)
        scores[~ok] = np.inf
        pick = int(np.argmin(scores))
        if np.isfinite(scores[pick]) and (best is None or scores[pick] < best[0]):
            best = (float(scores[pick]), pick, int(target))
    return best
