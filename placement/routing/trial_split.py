"""The live router's split of one layer's load on many trial slot maps at once: each trial's busiest GPU over the mean.

Legend: B trial slot maps of one layer, P slots, E logical experts, G GPUs, U the distinct (expert, GPU) pairs of all
trials, M the experts that are not on one and the same GPU in every trial, Y the most GPUs one such expert spans over
all trials.

Why: a burst patch (`placement.burst_patch`) scores a dozen or more trial slot maps per move, each one slot away
from the layer's slot map, under the live router's split (`ROUTER_ROUNDS` rounds of `dynamic_split`'s
water-filling). One `optimal_split_loads` call per trial spends its time in numpy's per-call overhead on tiny arrays,
and on a certificate the fixed number of rounds never uses. Scored together, the trials share that overhead.

Method: the union of the trials' replica graphs. An expert on one and the same GPU in every trial is fixed in all of
them; every other expert gets the GPUs it spans in any trial as its Y columns (padded with G, as `ReplicaGraph`), and
valid_BMY says which of them it spans in trial b. Within trial b an expert on one GPU is fixed there (all its tokens
on that GPU, outside the damping), one on none has no tokens to place (as `ReplicaGraph` drops it), one on two or more
is movable: it starts from the equal split over its GPUs and is damped by the most trial-b movable experts on any of
its GPUs, as `ReplicaGraph.damping_M1`. The rounds are those of `optimal_split` with tolerance -inf (no certificate),
so each trial's loads are the per-trial call's up to rounding.
"""

import numpy as np

from placement.routing.dynamic_split import MOMENTUM, ROUTER_ROUNDS, extrapolate, water_fill


def trial_imbalances(phy2log_BP: np.ndarray, gpu_of_slot_P: np.ndarray, load_E: np.ndarray, num_gpus: int,
                     rounds: int = ROUTER_ROUNDS, momentum: float = MOMENTUM) -> np.ndarray:
    """[B] busiest GPU over the mean GPU load when `rounds` water-filling rounds split `load_E` on each trial.

    Args:
        phy2log_BP: [B, P] int, B >= 1 slot maps of one layer (the expert in each slot).
        gpu_of_slot_P: [P] int, the GPU each slot lives on, shared by the trials.
        load_E: [E] non-negative tokens per expert, shared by the trials.
        num_gpus: G.
        rounds: water-filling rounds (the live router's by default).
        momentum: Nesterov momentum of the rounds.

    Returns:
        [B] float: what `ReplicaGraph.build(phy2log_BP[b], gpu_of_slot_P, E, G)` and `optimal_split_loads(
        load_E[None], graph, -inf, rounds, momentum)` give for trial b as max / mean GPU load.
    """
    phy2log = np.asarray(phy2log_BP, dtype=np.int64)
    load = np.asarray(load_E, dtype=np.float64)
    num_trials = phy2log.shape[0]
    fixed_G, movable = _union_of_trials(phy2log, np.asarray(gpu_of_slot_P, dtype=np.int64), len(load), num_gpus, load)
    if movable is None:
        return np.full(num_trials, fixed_G.max() / max(fixed_G.mean(), 1e-12))
    movable_M, gpus_MY, valid_BMY = movable

    # entry_BMY: where entry (b, m, y) lands in a flattened [B, G + 1] table of GPU loads (column G: the padding), so
    # loads are one bincount and each entry's GPU load one take. Not a matrix product: on shared cores a threaded
    # BLAS spins (`placement.blas_threads`).
    entry_BMY = np.arange(num_trials)[:, None, None] * (num_gpus + 1) + gpus_MY

    def loads_of(share_BMY: np.ndarray) -> np.ndarray:
        """[B, G + 1] tokens per GPU of a [B, M, Y] split; 0 in the padding column."""
        flat = np.bincount(entry_BMY.ravel(), share_BMY.ravel(), minlength=num_trials * (num_gpus + 1))
        return flat.reshape(num_trials, -1)

    count_BM = valid_BMY.sum(axis=-1)
    single_BM = count_BM == 1
    movable_BM = count_BM >= 2
    # fixed_BG1 [B, G + 1]: tokens of the experts fixed in each trial, +inf in the padding column (an absent GPU).
    fixed_BG1 = loads_of(np.where(single_BM[..., None] & valid_BMY, load[movable_M][:, None], 0.0))
    fixed_BG1 += np.append(fixed_G, np.inf)
    valid_BMY &= movable_BM[..., None]
    tokens_BM = np.where(movable_BM, load[movable_M], 0.0)
    degree_BG1 = loads_of(valid_BMY.astype(np.float64))  # movable experts on each GPU, per trial
    step_BM1 = 1.0 / np.maximum(1.0, np.where(valid_BMY, degree_BG1.take(entry_BMY), 0.0).max(axis=-1, keepdims=True))

    share_BMY = tokens_BM[..., None] * np.where(valid_BMY, 1.0 / np.maximum(count_BM, 1)[..., None], 0.0)
    previous_BMY = share_BMY.copy()
    for _ in range(rounds):
        ahead = extrapolate(share_BMY, previous_BMY, tokens_BM, valid_BMY, momentum)
        base = np.where(valid_BMY, (fixed_BG1 + loads_of(ahead)).take(entry_BMY) - ahead, np.inf)
        previous_BMY = share_BMY
        share_BMY = ahead + step_BM1 * (water_fill(tokens_BM, base) - ahead)
    loads_BG = (fixed_BG1 + loads_of(share_BMY))[:, :num_gpus]
    return loads_BG.max(axis=1) / np.maximum(loads_BG.mean(axis=1), 1e-12)


def _union_of_trials(phy2log: np.ndarray, gpu_of_slot_P: np.ndarray, num_experts: int, num_gpus: int,
                     load: np.ndarray) -> tuple[np.ndarray, tuple | None]:
    """The distinct (expert, GPU) pairs of all trials: [G] tokens of the experts on one GPU in every trial (fixed
    there), and for the others (None when there are none) the movable experts [M], their GPUs in ascending order as
    columns [M, Y] (padded with G), and which of them each trial holds [B, M, Y]."""
    num_trials = phy2log.shape[0]
    pairs_BP = phy2log * num_gpus + gpu_of_slot_P
    index_of_pair = np.zeros(num_experts * num_gpus, dtype=np.int64)
    index_of_pair[pairs_BP.ravel()] = 1  # a flag first, then the pair's index in union_pairs
    union_pairs = np.flatnonzero(index_of_pair)
    index_of_pair[union_pairs] = np.arange(len(union_pairs))
    present_BU = np.zeros((num_trials, len(union_pairs)), dtype=bool)
    present_BU[np.arange(num_trials)[:, None], index_of_pair[pairs_BP]] = True
    expert_U, gpu_U = union_pairs // num_gpus, union_pairs % num_gpus
    spans_E = np.bincount(expert_U, minlength=num_experts)
    fixed_U = (spans_E[expert_U] == 1) & present_BU.all(axis=0)
    fixed_G = np.bincount(gpu_U[fixed_U], load[expert_U[fixed_U]], minlength=num_gpus)
    if fixed_U.all():
        return fixed_G, None
    multi_U = np.flatnonzero(~fixed_U)
    multi_expert = expert_U[multi_U]
    movable_M, first_of_M = np.unique(multi_expert, return_index=True)
    row = np.searchsorted(movable_M, multi_expert)
    column = np.arange(len(multi_U)) - first_of_M[row]
    gpus_MY = np.full((len(movable_M), int(column.max()) + 1), num_gpus, dtype=np.int64)
    gpus_MY[row, column] = gpu_U[multi_U]
    valid_BMY = np.zeros((num_trials, *gpus_MY.shape), dtype=bool)
    valid_BMY[:, row, column] = present_BU[:, multi_U]
    return fixed_G, (movable_M, gpus_MY, valid_BMY)
