"""The spread the demo reports beside its p99 ratio: a seeded bootstrap interval that holds the ratio of two draws
of one distribution and excludes 1 when one group is slower throughout; the same over several runs pooled; and the
per-step times the ratios rest on."""

import numpy as np
import pytest

from eplb.harness.rebalancing_loop import LoopReport
from eplb.harness.rebalancing_summary import group_step_times, p99_ratio, p99_ratio_interval, pooled_p99_ratio


def test_the_interval_holds_one_for_alike_groups_and_excludes_it_for_a_slower_one():
    rng = np.random.default_rng(3)
    quiet = list(rng.lognormal(np.log(0.05), 0.3, 400))
    alike = list(rng.lognormal(np.log(0.05), 0.3, 200))
    low, high = p99_ratio_interval(alike, quiet)
    assert low < 1 < high
    assert p99_ratio_interval(alike, quiet) == [low, high]  # seeded: a run's figures repeat
    slower = [1.5 * t for t in alike]
    low, high = p99_ratio_interval(slower, quiet)
    ratio = np.percentile(slower, 99) / np.percentile(quiet, 99)
    assert 1 < low <= ratio <= high
    assert p99_ratio_interval([0.05], quiet) is None


def test_the_pooled_ratio_pools_every_run_and_resamples_whole_runs():
    rng = np.random.default_rng(5)
    runs = [(list(rng.lognormal(np.log(0.05), 0.3, 40)), list(rng.lognormal(np.log(0.05), 0.3, 80)))
            for _ in range(12)]
    ratio, (low, high) = pooled_p99_ratio(runs)
    busy, quiet = sum((b for b, _ in runs), []), sum((q for _, q in runs), [])
    assert ratio == pytest.approx(np.percentile(busy, 99) / np.percentile(quiet, 99))
    assert low <= ratio <= high and low < 1 < high
    assert pooled_p99_ratio(runs) == (ratio, [low, high])  # seeded
    slower = [([1.5 * t for t in b], q) for b, q in runs]
    ratio, (low, high) = pooled_p99_ratio(slower)
    assert 1 < low <= ratio <= high
    assert pooled_p99_ratio(runs[:1] + [([], [0.05])]) == (pytest.approx(p99_ratio(*runs[0])), None)
    with pytest.raises(ValueError, match="both busy and quiet"):
        pooled_p99_ratio([([], [0.05]), ([0.05], [])])


def test_group_step_times_takes_the_slowest_rank_and_skips_a_killed_one():
    def report(rank, seconds_by_step, rebalancing_at=()):
        return LoopReport(original_rank=rank, steps={
            step: {"seconds": seconds, "rebalancing": step in rebalancing_at, "phase": "idle>idle",
                   "world_size": 2} for step, seconds in seconds_by_step.items()})

    reports = [report(0, {0: 0.01, 1: 0.03, 2: 0.02}, rebalancing_at=(1,)),
               report(1, {0: 0.02, 1: 0.01}), RuntimeError("killed")]
    rows = group_step_times(reports)
    assert [(row["step"], row["seconds"], row["rebalancing"]) for row in rows] == [
        (0, 0.02, False), (1, 0.03, True), (2, 0.02, False)]
