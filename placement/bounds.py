"""Lower bounds on imbalance that no placement can beat, under any routing.

Legend: B independent rows (steps of one layer), E logical experts, G GPUs, S slots per GPU, P = G * S slots
(P - E of them redundant).

Take one step's counts c_e. Whatever the placement (any E <= P slots' contents) and whatever the routing (the
placement's static weights, the best split of each step, the live router's whole tokens), the busiest GPU carries
at least:

1. the mean, sum_e c_e / G: some GPU carries at least the average;
2. the replica-count bound, min over d of max_e c_e / d_e, over integers 1 <= d_e <= G with sum_e d_e <= P.
   Let d_e be the number of distinct GPUs holding a replica of expert e. Its c_e tokens reach only those GPUs, so
   one of them takes at least c_e / d_e; each of them spends a slot on e, so sum_e d_e <= P; and d_e <= G. The
   actual d is one of the vectors minimised over. (The cap d_e <= G lifts the term to at least max_e c_e / G,
   which never exceeds the mean, so it never lifts the bound; it keeps the term alone honest.)
3. without a redundant slot (P = E), every expert has one replica and its tokens cannot move: for k = 1 .. S - 1,
   some GPU holds k + 1 of the kG + 1 busiest experts (pigeonhole), so the busiest GPU carries at least the sum of
   the k + 1 least busy among them;
4. with whole tokens (the live router), the busiest GPU's load is an integer: the ceiling of the largest of 1-3.

`imbalance_lower_bound` reports the largest of 1-3 (or its ceiling) over the mean. For S = 1 it is the optimum under
the best per-step split: each GPU holds one replica, so d = replica counts and the best split gives every replica of e
c_e / d_e. Example (`tests/placement/test_bounds.py`): counts [6, 1, 1] on 2 GPUs x 2 slots: the mean is 4; d =
(2, 1, 1) gives max(3, 1, 1) = 3, so the bound is 4 / 4 = 1.0. On 4 GPUs x 1 slot: mean 2, d = (2, 1, 1) is all
4 slots, max 3: bound 1.5.
"""

import numpy as np

BISECTION_ROUNDS = 48
# Slack on c_e / theta before its ceiling, so that float error never counts a replica too many (which would
# declare an infeasible theta feasible and the bound would come out too high).
CEIL_SLACK = 1e-9


def replica_count_load(counts_BE: np.ndarray, num_slots: int, num_gpus: int) -> np.ndarray:
    """The replica-count bound (2 in the module docstring) on the busiest GPU's load, in tokens.

    Args:
        counts_BE: [B, E] tokens routed to each logical expert, one row per (step, layer).
        num_slots: P, expert slots in the EP group (P >= E).
        num_gpus: G.

    Returns:
        [B] float64: min over replica counts d (1 <= d_e <= G, sum_e d_e <= P) of max_e c_e / d_e, from below
        within about 1e-9 relative (0 for an all-zero row).

    Only the P - E busiest experts can use a second replica (an optimum never gives one to an expert while a
    busier one has a single replica: swapping the two counts lowers nothing), so the others count once and the
    bisection runs on the P - E busiest columns; the (P - E + 1)-th busiest count, which keeps one replica in any
    choice of P - E experts, starts it. Uncapped, theta is feasible iff sum_e max(1, ceil(c_e / theta)) <= P; the cap adds
    theta >= max_e c_e / G, so the capped optimum is the larger of the two.
    """
    counts = np.asarray(counts_BE, dtype=np.float64)
    rows, num_experts = counts.shape
    redundant = num_slots - num_experts
    if redundant < 0:
        raise ValueError(f"num_slots={num_slots} cannot hold {num_experts} experts; need num_slots >= {num_experts}")
    peak = counts.max(axis=1, initial=0.0)
    candidates = min(redundant, num_experts)
    split = num_experts - candidates  # columns [split:] of the partition hold the `candidates` busiest experts
    ordered = np.partition(counts, split - 1, axis=1) if split > 0 else counts
    busiest = ordered[:, split:]
    single_peak = ordered[:, split - 1] if split > 0 else np.zeros(rows)
    low = np.maximum.reduce([counts.sum(axis=1) / num_slots, peak / (redundant + 1), single_peak]) * (1 - 1e-12)
    high = peak.copy()
    for _ in range(BISECTION_ROUNDS):
        mid = 0.5 * (low + high)
        safe = np.maximum(mid, 1e-300)[:, None]
        needed = np.maximum(1.0, np.ceil(busiest / safe - CEIL_SLACK)).sum(axis=1)
        feasible = needed <= candidates + redundant
        high = np.where(feasible, mid, high)
        low = np.where(feasible, low, mid)
    return np.where(peak > 0, np.maximum(low, peak / num_gpus), 0.0)


def imbalance_lower_bound(
    counts_BE: np.ndarray, num_slots: int, num_gpus: int, whole_tokens: bool = False
) -> np.ndarray:
    """[B] float64 >= 1: no placement of P slots on G GPUs under any routing has a lower max / mean GPU load.

    Args:
        counts_BE: [B, E] tokens routed to each logical expert, one row per (step, layer).
        num_slots: P.
        num_gpus: G.
        whole_tokens: loads are whole tokens (the live router): round the busiest GPU's bound up to an integer.

    Returns:
        max(mean, replica-count bound, and without redundant slots the pigeonhole bound), rounded up with
        `whole_tokens`, over the mean GPU load; 1.0 for a row without tokens. The replica-count bound is computed
        only for rows where it exceeds the mean (where the mean needs more than P slots as theta), so it costs one
        pass over the rows elsewhere.
    """
    counts = np.asarray(counts_BE, dtype=np.float64)
    mean = counts.sum(axis=1) / num_gpus
    safe_mean = np.maximum(mean, 1e-300)[:, None]
    above = np.maximum(1.0, np.ceil(counts / safe_mean - CEIL_SLACK)).sum(axis=1) > num_slots
    busiest = mean.copy()
    busiest[above] = np.maximum(mean[above], replica_count_load(counts[above], num_slots, num_gpus))
    if num_slots == counts.shape[1] and num_gpus < num_slots:
        busiest = np.maximum(busiest, pigeonhole_load(counts, num_slots // num_gpus, num_gpus))
    if whole_tokens:
        busiest = np.ceil(busiest)
    return np.divide(busiest, mean, out=np.ones_like(mean), where=mean > 0)


def pigeonhole_load(counts_BE: np.ndarray, slots_per_gpu: int, num_gpus: int) -> np.ndarray:
    """[B] the pigeonhole bound (3 in the module docstring) on the busiest GPU's load of a placement without
    redundant slots (E = G * S): max over k = 1 .. S - 1 of the sum of the k + 1 least busy of the kG + 1 busiest
    experts."""
    ordered = -np.sort(-np.asarray(counts_BE, dtype=np.float64), axis=1)
    best = np.zeros(len(ordered))
    for k in range(1, slots_per_gpu):
        last = k * num_gpus + 1
        if last > ordered.shape[1]:
            break
        best = np.maximum(best, ordered[:, last - k - 1:last].sum(axis=1))
    return best
