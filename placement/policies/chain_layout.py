"""A connected layout of replicas: the construction the `cpsat` policy starts from.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, M experts with two or more replicas.

Why: under dynamic routing tokens can only move between GPUs that share a replicated expert. DeepSeek's greedy
packs replicas by expected load alone, so the GPUs fall into many small groups linked by shared experts, and the
load of one group cannot reach another. Here the replicated experts are laid along a ring
of GPUs: each expert's replicas sit on consecutive GPUs, and the next expert starts on the last GPU of the one
before, so the experts link all GPUs into one chain and every GPU holds movable tokens. Experts with one
replica then fill the free slots, heaviest first. Their tokens cannot move, so what matters is a GPU's load on
each step, not on average: given the window's steps, an expert goes to the free GPU whose per-step load so far
(each movable replica counted with its equal share) is lowest on the steps where this expert is busy, i.e. the
GPU minimising sum_t load_tg * c_te, the growth of the sum of squared per-step loads. With one "step" (the mean)
this is the greedy's least-loaded rule. No GPU holds two replicas of one expert. Placing by per-step load fits
the window better than the least-mean-load rule, and serves later steps no worse (figures: docs/placement.md,
'Chain layout').

The order of the replicated experts along the ring matters: heaviest first crowds the hot experts onto one arc
of GPUs, whose load then has far to travel; "interleave" (hot, cold, next hot, ...) spreads them, and a random
order spreads them best, all three well ahead of DeepSeek's greedy (figures: docs/placement.md, 'Chain layout').
The policy tries several orders and keeps the best fit.
"""

ORDERS = ("desc", "interleave", "random")

import numpy as np

from placement.errors import PlacementInfeasibleError


def chain_layout(
    load_E: np.ndarray,
    replicas_E: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    order: str = "random",
    seed: int = 0,
    steps_TE: np.ndarray | None = None,
) -> np.ndarray:
    """Lay out one layer.

    Args:
        load_E: [E] expected tokens per expert.
        replicas_E: [E] int >= 1, replicas per expert; sums to P; each at most G.
        num_gpus: G.
        slots_per_gpu: S.
        order: order of the replicated experts along the ring: "desc" (heaviest first), "interleave" (heaviest,
            lightest, second heaviest, ...) or "random" (a permutation drawn from `seed`).
        seed: seed of the "random" order.
        steps_TE: [T, E] tokens per expert on each step of the window, for placing the one-replica experts
            (default: `load_E` as a single step).

    Returns:
        phy2log_P: [P] int64, the expert of each slot; slot p lives on GPU p // S.
    """
    num_experts = len(load_E)
    if replicas_E.max() > num_gpus:
        raise PlacementInfeasibleError(
            f"an expert needs {replicas_E.max()} replicas but there are only {num_gpus} GPUs to hold them apart"
        )
    steps = np.asarray(load_E if steps_TE is None else steps_TE, dtype=np.float64).reshape(-1, num_experts)
    # A tiny constant keeps the least-loaded rule for experts with no tokens in the window.
    steps = steps + 1e-6 * max(1.0, float(steps.mean()))
    slots: list[list[int]] = [[] for _ in range(num_gpus)]
    load_TG = np.zeros((len(steps), num_gpus))
    movable = _ring_order(np.flatnonzero(replicas_E >= 2), load_E, order, seed)
    position = 0
    for expert in movable:
        count = int(replicas_E[expert])
        wanted = [position + j for j in range(count)]
        chosen = [_free_gpu_from(slots, expert, start % num_gpus, slots_per_gpu) for start in wanted]
        for gpu in chosen:
            slots[gpu].append(int(expert))
            load_TG[:, gpu] += steps[:, expert] / count
        position = chosen[-1]
    singles = np.flatnonzero(replicas_E == 1)
    singles = singles[np.argsort(-load_E[singles], kind="stable")]
    free_G = np.array([slots_per_gpu - len(s) for s in slots])
    for expert in singles:
        growth_G = steps[:, expert] @ load_TG
        gpu = int(np.argmin(np.where(free_G > 0, growth_G, np.inf)))
        slots[gpu].append(int(expert))
        load_TG[:, gpu] += steps[:, expert]
        free_G[gpu] -= 1
    phy2log = np.array([e for s in slots for e in s], dtype=np.int64)
    if len(phy2log) != num_gpus * slots_per_gpu or np.bincount(phy2log, minlength=num_experts).min() == 0:
        raise PlacementInfeasibleError("replica counts do not fill the slots exactly; they must sum to G * S")
    return phy2log


def _ring_order(movable: np.ndarray, load_E: np.ndarray, order: str, seed: int) -> np.ndarray:
    heaviest_first = movable[np.argsort(-load_E[movable], kind="stable")]
    if order == "desc":
        return heaviest_first
    if order == "interleave":
        result = np.empty_like(heaviest_first)
        half = (len(heaviest_first) + 1) // 2
        result[0::2] = heaviest_first[:half]
        result[1::2] = heaviest_first[half:][::-1]
        return result
    if order == "random":
        return np.random.default_rng(seed).permutation(heaviest_first)
    raise ValueError(f"order must be one of {ORDERS}; got {order!r}")


def _free_gpu_from(slots: list[list[int]], expert: int, start: int, slots_per_gpu: int) -> int:
    """The first GPU at or after `start` (around the ring) with a free slot and no replica of `expert`."""
    num_gpus = len(slots)
    for offset in range(num_gpus):
        gpu = (start + offset) % num_gpus
        if len(slots[gpu]) < slots_per_gpu and expert not in slots[gpu]:
            return gpu
    raise PlacementInfeasibleError(f"no GPU has a free slot for another replica of expert {expert}")
