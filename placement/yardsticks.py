"""Yardsticks: what part of an imbalance figure a balancer can move, and what it cannot.

Legend: T steps, L layers, E logical experts, G GPUs (cards), P slots, B rows.

Every imbalance figure mixes three things: the sampling noise of a step (its tokens are a sample of the traffic's
expected load), the granularity of few slots a card (an expert's load moves only in replicas), and the placement.
Only the last is the balancer's. Beside a figure this module gives:

- the **noise floor** (`placement.noise_floor`): the max / mean of `cells` cards whose expected loads are exactly equal, each
  step's picks drawn independently onto them (multinomial). A perfect expectation, sampled: what a placement with
  the static split serves at that load when it knows everything but the sample. A per-step split over replicas can
  go below it (it moves tokens after seeing the sample), so it bounds nothing; it says how much of a figure is the
  load's own noise. A token's K picks are distinct experts, which the multinomial ignores (it slightly overstates
  the noise where a card holds several of one token's experts).
- the **granularity bound** (`granularity_bound`): the best integer replica counts for the expected load
  (`placement.bounds.imbalance_lower_bound` on the expectation, not on a sample): no placement of P slots beats it
  in expectation.
- the **expectation oracle** (`expectation_oracle`): the placement refitted on the expected load of the steps it
  serves (no lag, free moves), serving the sampled counts with the best split. Where a generator exposes its
  expected load (`traces.synthetic.expected_counts_TLE`, `traces.request_traffic.request_traffic_with_expectation`),
  it is what a balancer that forecasts perfectly reaches; a held-out figure's distance to it is what is left to win.
- the **in-batch bound** (`StepScores.lower_bound_TL`): the same replica-count bound on each scored step's own
  counts. It knows the step's noise, which no placement chosen before the step can: a floor, not a target.
"""

import numpy as np

from placement.bounds import imbalance_lower_bound
from placement.cluster import ClusterSpec
from placement.noise_floor import noise_floor
from placement.policies import fit_placement
from placement.scoring import Routing, StepScores, score_placement

# Steps averaged into one expected load where a trace gives none (the granularity bound of a plain trace): the
# window a refit sees, whose sampling noise is a tenth of one step's.
GRANULARITY_BLOCK = 100
ORACLE_SCALE = 64  # the expected load is fitted as whole counts of 1/64 token


def granularity_bound(expected_BE: np.ndarray, cluster: ClusterSpec) -> float:
    """Mean over rows of the replica-count bound on an expected load [B, E] (one row per step or block and layer):
    the best any placement of the cluster's slots does on that expectation, whatever its split (1.0 where the
    slots can spread every expert evenly)."""
    expected = np.asarray(expected_BE, dtype=np.float64)
    if expected.ndim != 2 or not expected.size:
        raise ValueError(f"expected_BE must be a non-empty [B, E] array; got shape {expected.shape}")
    return float(imbalance_lower_bound(expected, cluster.num_slots, cluster.num_gpus).mean())


def block_means_BE(counts_TLE: np.ndarray, block: int = GRANULARITY_BLOCK) -> np.ndarray:
    """[B, E] the mean load of each layer over consecutive blocks of `block` steps (a last shorter block kept): the
    expected load estimated from a trace that carries none."""
    steps, layers, experts = counts_TLE.shape
    rows = [counts_TLE[start:start + block].mean(axis=0, dtype=np.float64) for start in range(0, steps, block)]
    return np.concatenate(rows).reshape(-1, experts)


def trace_yardsticks(counts_TLE: np.ndarray, cluster: ClusterSpec, expected_TLE: np.ndarray | None = None) -> dict:
    """The yardsticks of a trace [T, L, E] on `cluster` that need no placement: `noise_floor` (per step, per card,
    at the trace's mean picks a step and layer) and `granularity_bound` (on `expected_TLE` where given, else on
    `block_means_BE`), with `granularity_from` saying which."""
    counts = np.asarray(counts_TLE)
    picks = float(counts.sum(axis=-1, dtype=np.float64).mean()) if counts.size else 0.0
    if expected_TLE is not None:
        expected_BE, source = np.asarray(expected_TLE).reshape(-1, counts.shape[-1]), "expected load"
    else:
        expected_BE, source = block_means_BE(counts), f"mean load over blocks of {GRANULARITY_BLOCK} steps"
    return {"noise_floor": noise_floor(picks, cluster.num_gpus),
            "granularity_bound": granularity_bound(expected_BE, cluster), "granularity_from": source}


def expectation_oracle(counts_TLE: np.ndarray, expected_TLE: np.ndarray, cluster: ClusterSpec,
                       policy: str = "cpsat", routing: Routing = "dynamic", every: int = 1,
                       policy_options: dict | None = None) -> StepScores:
    """Scores of the counts [T, L, E] when every block of `every` steps is served by `policy`'s placement fitted on
    those very steps' expected load `expected_TLE` [T, L, E] (the mean over the block): no lag, free moves, the
    sample unknown. `every` 1 refits each step; a larger block trades exactness for fewer fits where the expected
    load moves slowly (request-level traffic changes a few requests a step).

    Raises:
        ValueError: the two arrays differ in shape, or `every` is below 1.
    """
    counts, expected = np.asarray(counts_TLE), np.asarray(expected_TLE, dtype=np.float64)
    if counts.shape != expected.shape:
        raise ValueError(f"expected_TLE {expected.shape} must have the shape of counts_TLE {counts.shape}")
    if every < 1:
        raise ValueError(f"every must be >= 1 step; got every={every}")
    options = dict(policy_options or {})
    parts = []
    for start in range(0, counts.shape[0], every):
        block = slice(start, start + every)
        # Policies fit whole counts: the expectation scaled up (every policy's placement depends on the loads'
        # ratios only) and rounded.
        fit_1LE = np.rint(expected[block].mean(axis=0, keepdims=True) * ORACLE_SCALE)
        placement = fit_placement(policy, fit_1LE, cluster, **options)
        parts.append(score_placement(placement, counts[block], routing))
    return StepScores.concatenate(parts)


def yardsticks_line(found: dict) -> str:
    """Yardsticks on one line: {"noise_floor", "granularity_bound", "granularity_from", "in_batch_bound",
    "expectation_oracle" (None with an "oracle_why")}, as `sim.imbalance_readings` reports a decode unit's."""
    oracle = f"{found['expectation_oracle']:.3f}" if found["expectation_oracle"] is not None else \
        f"- ({found['oracle_why']})"
    return (f"noise floor {found['noise_floor']:.3f}, granularity bound {found['granularity_bound']:.3f} (on the "
            f"{found['granularity_from']}), expectation oracle {oracle}, in-batch bound {found['in_batch_bound']:.3f} "
            f"(knows each step's noise)")
