"""The spread the demo reports beside its p99 ratio: a seeded bootstrap interval that holds the ratio of two draws
of one distribution and excludes 1 when one group is slower throughout."""

import numpy as np

from eplb.live.rebalancing_loop import p99_ratio_interval


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
