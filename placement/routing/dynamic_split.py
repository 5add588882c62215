"""The best per-step split of each expert's tokens over its replicas, with a certificate of optimality.

Legend: B steps of one layer, E logical experts, G GPUs, M experts with replicas on two or more GPUs, Y the most
GPUs one such expert spans.

Problem (per step): split expert e's c_e tokens over the GPUs holding its replicas to minimise the busiest GPU.
Its optimum equals max over GPU sets H of c(A_H) / |H|, where A_H are the experts whose replicas all lie in H: any
split puts at least c(A_H) tokens on H, and at the optimum the set of busiest GPUs attains it.

Method: damped Jacobi water-filling on the sum of squared GPU loads (whose minimiser also minimises the maximum
on this flow polytope), starting from the placement's static split. Each round, every movable expert re-spreads
its tokens to level the GPUs it spans, given the others' loads. Plain Jacobi is diffusion: on a ring-like replica
graph load moves about one GPU per round, so it needs many rounds. Nesterov momentum fixes most of that: each
round starts from the split extrapolated by MOMENTUM times the last change (projected back to a valid split:
no negative share, each expert's tokens conserved); with it a few rounds reach what plain Jacobi needs several
times as many rounds for (figures: docs/placement.md, 'Dynamic split'). Every few rounds the certificate is
evaluated on the prefixes of GPUs sorted by load; the loop stops when the achieved maximum is within `tolerance`
(relative) of the certified lower bound for every step, or after `max_rounds`. The result is therefore provably
close: `achieved / certified - 1` is returned per step.
Splits are fractional (tokens as reals); rounding to whole tokens adds at most one token per replica.
"""

from dataclasses import dataclass

import numpy as np

ROUTER_ROUNDS = 12  # water-filling rounds of the live router (`placement.routing.live_router`), which fits assume
MOMENTUM = 0.8  # Nesterov extrapolation of each round (0 = plain damped Jacobi): best for a few rounds
# For the scorer's long runs to a tight tolerance, where more momentum converges faster than MOMENTUM (figures:
# docs/placement.md, 'Dynamic split').
CERTIFY_MOMENTUM = 0.95


@dataclass(frozen=True)
class ReplicaGraph:
    """The distinct GPUs each expert of one layer lives on.

    Attributes:
        fixed_EG: [E, G] float, 1 where an expert that lives on one GPU only lives (its tokens cannot move).
        movable_M: [M] int64, the experts that span two or more GPUs.
        gpus_MY: [M, Y] int64, the GPUs each movable expert spans, padded with G (a sink column).
        weight_MY: [M, Y] float, the static share of movable expert m on GPU gpus_MY[m, y] (0 on padding);
            the starting split of the water-filling.
        num_gpus: G.
    """

    fixed_EG: np.ndarray
    movable_M: np.ndarray
    gpus_MY: np.ndarray
    weight_MY: np.ndarray
    num_gpus: int

    @classmethod
    def build(
        cls,
        phy2log_P: np.ndarray,
        gpu_of_slot_P: np.ndarray,
        num_experts: int,
        num_gpus: int,
        weights_P: np.ndarray | None = None,
    ):
        """From one layer's slot map: phy2log_P [P], gpu_of_slot_P [P] and optional static weights_P [P]
        (default: equal split over the GPUs an expert spans)."""
        pairs = np.unique(phy2log_P * num_gpus + gpu_of_slot_P)
        expert, gpu = pairs // num_gpus, pairs % num_gpus
        spans_E = np.bincount(expert, minlength=num_experts)
        single = spans_E[expert] == 1
        fixed = np.zeros((num_experts, num_gpus))
        fixed[expert[single], gpu[single]] = 1.0
        movable = np.flatnonzero(spans_E >= 2)
        width = int(spans_E.max()) if len(movable) else 1
        gpus = np.full((len(movable), width), num_gpus, dtype=np.int64)
        index_of = np.full(num_experts, -1)
        index_of[movable] = np.arange(len(movable))
        multi_expert, multi_gpu = expert[~single], gpu[~single]
        column = np.arange(len(multi_expert)) - np.searchsorted(multi_expert, multi_expert)
        gpus[index_of[multi_expert], column] = multi_gpu
        weight = np.zeros(gpus.shape)
        if weights_P is None:
            weight[index_of[multi_expert], column] = 1.0 / spans_E[multi_expert]
        else:
            pair_of_slot = np.searchsorted(pairs, phy2log_P * num_gpus + gpu_of_slot_P)
            pair_weight = np.bincount(pair_of_slot, weights_P, minlength=len(pairs))
            weight[index_of[multi_expert], column] = pair_weight[~single]
        return cls(fixed, movable, gpus, weight, num_gpus)

    def fixed_gpu_E(self, none: int) -> np.ndarray:
        """[E] int64: the GPU of each expert that lives on one GPU only, `none` for the movable ones."""
        return np.where(self.fixed_EG.any(axis=1), self.fixed_EG.argmax(axis=1), none)

    def damping_M1(self) -> np.ndarray:
        """[M, 1] step of each movable expert's Jacobi update: 1 / (most movable experts on any GPU it spans),
        which keeps simultaneous updates from overshooting."""
        valid_MY = self.gpus_MY < self.num_gpus
        degree_G1 = np.append(np.bincount(self.gpus_MY[valid_MY], minlength=self.num_gpus), 0)
        return 1.0 / np.maximum(1, degree_G1[self.gpus_MY].max(axis=1, keepdims=True))


def first_slot_EG(phy2log_P: np.ndarray, gpu_of_slot_P: np.ndarray, num_experts: int, num_gpus: int) -> np.ndarray:
    """[E, G] int64: the lowest slot holding expert e on GPU g, or -1; that slot takes the GPU's share of e."""
    first = np.full((num_experts, num_gpus), len(phy2log_P), dtype=np.int64)
    np.minimum.at(first, (phy2log_P, gpu_of_slot_P), np.arange(len(phy2log_P)))
    first[first == len(phy2log_P)] = -1
    return first


def extrapolate(share_BMY: np.ndarray, previous_BMY: np.ndarray, tokens_BM: np.ndarray, valid_MY: np.ndarray,
                momentum: float) -> np.ndarray:
    """Nesterov's look-ahead split: share + momentum * (share - previous), projected back to a valid split
    (shares >= 0, only on GPUs the expert spans, each expert's tokens conserved). Each row's extrapolation sums
    to its tokens, so a row with tokens keeps a positive entry after clamping; a row without stays all zero."""
    ahead = np.where(valid_MY, np.maximum(share_BMY + momentum * (share_BMY - previous_BMY), 0.0), 0.0)
    return ahead * (tokens_BM[..., None] / np.maximum(ahead.sum(axis=-1, keepdims=True), 1e-300))


def water_fill(tokens_BM: np.ndarray, base_BMY: np.ndarray) -> np.ndarray:
    """[B, M, Y] the spread of tokens_BM [B, M] over Y bins whose levels are base_BMY (inf = absent) that raises the
    lowest bins evenly (sorting the levels, not their indices: fewer and cheaper numpy calls).

    The bins below the water are a prefix of the sorted levels (the lowest one always), so the last of them is found
    from the first sorted level at or above its prefix's water level."""
    width = base_BMY.shape[-1]
    sorted_base = np.sort(base_BMY, axis=-1)
    prefix_sum = np.cumsum(np.where(sorted_base < np.inf, sorted_base, 0.0), axis=-1)
    level_k = (tokens_BM[..., None] + prefix_sum) / np.arange(1, width + 1)
    below = sorted_base < level_k
    below[..., 0] = True
    last = np.where(below[..., -1], width - 1, below.argmin(axis=-1) - 1)
    level = np.take_along_axis(level_k, last[..., None], axis=-1)
    return np.where(base_BMY < np.inf, np.maximum(level - base_BMY, 0.0), 0.0)


def certified_lower_bound(counts_BE: np.ndarray, loads_BG: np.ndarray, graph: ReplicaGraph) -> np.ndarray:
    """[B] the largest c(A_H) / |H| over the prefixes H of GPUs sorted by `loads_BG`, a lower bound on the optimum."""
    steps, num_gpus = loads_BG.shape
    position_BG = np.argsort(np.argsort(-loads_BG, axis=1, kind="stable"), axis=1)
    # An expert lies wholly in a prefix once the prefix reaches its last-ranked GPU.
    fixed_gpu_E = graph.fixed_gpu_E(none=-1)
    fixed_experts = np.flatnonzero(fixed_gpu_E >= 0)
    entry = [position_BG[:, fixed_gpu_E[fixed_experts]]]
    weights = [counts_BE[:, fixed_experts]]
    if len(graph.movable_M):
        padded = np.concatenate([position_BG, np.full((steps, 1), -1)], axis=1)
        entry.append(padded[np.arange(steps)[:, None, None], graph.gpus_MY[None]].max(axis=-1))
        weights.append(counts_BE[:, graph.movable_M])
    entry_all = np.concatenate(entry, axis=1)
    flat = (np.arange(steps)[:, None] * num_gpus + entry_all).ravel()
    inside = np.bincount(flat, np.concatenate(weights, axis=1).ravel(), minlength=steps * num_gpus)
    prefix = np.cumsum(inside.reshape(steps, num_gpus), axis=1)
    return (prefix / np.arange(1, num_gpus + 1)).max(axis=1)


def optimal_split_loads(
    counts_BE: np.ndarray, graph: ReplicaGraph, tolerance: float = 1e-3, max_rounds: int = 400,
    momentum: float = CERTIFY_MOMENTUM,
) -> tuple[np.ndarray, np.ndarray]:
    """GPU loads under the best per-step split, and each step's certified relative gap.

    Args:
        counts_BE: [B, E] tokens per expert in each step.
        graph: the layer's replica graph.
        tolerance: stop once every step's max load is within this relative gap of its certified bound
            (-inf: never stop early, every step runs exactly `max_rounds` rounds, as the live router does).
        max_rounds: cap on water-filling rounds.
        momentum: Nesterov momentum of the rounds.

    Returns:
        loads_BG: [B, G] float, GPU loads of an achievable split (the achieved maximum is an upper bound).
        gap_B: [B] float >= 0, achieved maximum / certified lower bound - 1.
    """
    _, loads, gap = optimal_split(counts_BE, graph, tolerance, max_rounds, momentum)
    return loads, gap


def optimal_split(
    counts_BE: np.ndarray, graph: ReplicaGraph, tolerance: float = 1e-3, max_rounds: int = 400,
    momentum: float = MOMENTUM,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As `optimal_split_loads`, also returning share_BMY [B, M, Y]: tokens of movable expert m on gpus_MY[m, y]."""
    counts = np.asarray(counts_BE, dtype=np.float64)
    steps = counts.shape[0]
    num_gpus = graph.num_gpus
    fixed_BG = counts @ graph.fixed_EG
    movable, gpus_MY = graph.movable_M, graph.gpus_MY
    if len(movable) == 0:
        return np.zeros((steps, 0, 1)), fixed_BG, np.zeros(steps)
    tokens_BM = counts[:, movable]
    share_BMY = tokens_BM[..., None] * graph.weight_MY[None]
    previous_BMY = share_BMY.copy()
    valid_MY = gpus_MY < num_gpus
    step_M1 = graph.damping_M1()

    # onehot [M * Y, G]: onehot[i, g] = 1 iff entry i of the flattened [M, Y] table is GPU g: loads are one matrix
    # product.
    onehot = np.zeros((gpus_MY.size, num_gpus + 1))
    onehot[np.arange(gpus_MY.size), gpus_MY.ravel()] = 1.0
    onehot = onehot[:, :num_gpus]

    def loads_of(share: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return fixed_BG[rows] + share.reshape(len(rows), -1) @ onehot

    # Rounds run on the steps not yet within tolerance; converged steps drop out of the batch.
    active = np.arange(steps)
    gap = np.full(steps, np.inf)
    for round_index in range(max_rounds):
        share, tokens = share_BMY[active], tokens_BM[active]
        ahead = extrapolate(share, previous_BMY[active], tokens, valid_MY, momentum)
        padded = np.concatenate([loads_of(ahead, active), np.full((len(active), 1), np.inf)], axis=1)
        base = padded[np.arange(len(active))[:, None, None], gpus_MY[None]] - ahead
        previous_BMY[active] = share
        share_BMY[active] = ahead + step_M1 * (water_fill(tokens, base) - ahead)
        if round_index % 8 == 7 or round_index == max_rounds - 1:
            loads = loads_of(share_BMY[active], active)
            bound = certified_lower_bound(counts[active], loads, graph)
            gap[active] = loads.max(axis=1) / np.maximum(bound, 1e-12) - 1.0
            active = active[gap[active] > tolerance]
            if len(active) == 0:
                break
    return share_BMY, loads_of(share_BMY, np.arange(steps)), np.maximum(gap, 0.0)
