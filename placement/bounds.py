"""Lower bounds on imbalance that no placement can beat.

Legend: B independent rows (steps of one layer), E logical experts.

- Splittable routing (weights free, or dynamic routing): 1.0.
- Equal-split routing: with P slots, the busiest GPU carries at least the busiest replica, so imbalance >=
  min over replica counts r (sum r = P, r_e >= 1) of max_e c_e / r_e, divided by the mean GPU load.
"""

import numpy as np

BISECTION_ROUNDS = 40


def min_max_load_per_replica(counts_BE: np.ndarray, num_slots: int) -> np.ndarray:
    """[B] a lower bound, within about 1e-8 relative, on min over replica counts of max_e c_e / r_e.

    Found by bisection on the threshold theta: theta is feasible iff sum_e max(1, ceil(c_e / theta)) <= P.
    The returned value is the largest infeasible theta found (or 0 for an all-zero row), so it never exceeds
    the true optimum.
    """
    counts = np.asarray(counts_BE, dtype=np.float64)
    rows, num_experts = counts.shape
    spare = num_slots - num_experts
    peak = counts.max(axis=1)
    low = np.maximum(counts.sum(axis=1) / num_slots, peak / (spare + 1)) * (1 - 1e-12)
    high = peak.copy()
    for _ in range(BISECTION_ROUNDS):
        mid = 0.5 * (low + high)
        safe = np.maximum(mid, 1e-300)[:, None]
        needed = np.maximum(1.0, np.ceil(counts / safe - 1e-9)).sum(axis=1)
        feasible = needed <= num_slots
        high = np.where(feasible, mid, high)
        low = np.where(feasible, low, mid)
    return np.where(peak > 0, low, 0.0)


def equal_split_bound(counts_BE: np.ndarray, num_slots: int, num_gpus: int) -> np.ndarray:
    """[B] lower bound on max/mean GPU load for any placement with equal split over replicas (>= 1.0)."""
    counts = np.asarray(counts_BE, dtype=np.float64)
    mean_gpu_load = counts.sum(axis=1) / num_gpus
    per_replica = min_max_load_per_replica(counts, num_slots)
    ratio = np.divide(per_replica, mean_gpu_load, out=np.ones_like(per_replica), where=mean_gpu_load > 0)
    return np.maximum(1.0, ratio)
