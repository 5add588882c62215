"""`fit_placement` checks what it is given like the command line does, with errors that name the parameter."""

import numpy as np
import pytest

from placement import ClusterSpec, PlacementInfeasibleError, fit_placement
from traces import TraceFormatError

CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=3)
GOOD = np.random.default_rng(0).integers(0, 20, size=(5, 2, 8))


def _with(value, index=(1, 0, 3)):
    counts = GOOD.astype(float)
    counts[index] = value
    return counts


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (_with(-3.0), "counts_TLE contains negative values"),
        (_with(np.nan), "counts_TLE contains NaN"),
        (_with(2.7), "counts_TLE contains non-integer values"),
        (GOOD[0], r"counts_TLE must be a 3-D array \[steps, layers, experts\]; found shape \(2, 8\)"),
        (GOOD[:0], "counts_TLE has an empty axis"),
        (GOOD.astype(str), "counts_TLE must hold numbers"),
    ],
    ids=["negative", "nan", "fraction", "two-dimensional", "no-steps", "strings"],
)
@pytest.mark.parametrize("policy", ["deepseek", "cpsat", "trivial"])
def test_bad_counts_are_refused_naming_counts_tle(counts, message, policy):
    with pytest.raises(TraceFormatError, match=message):
        fit_placement(policy, counts, CLUSTER)


def test_whole_float_counts_are_accepted_as_integers():
    placement = fit_placement("deepseek", GOOD.astype(np.float32), CLUSTER)
    expected = fit_placement("deepseek", GOOD, CLUSTER)
    np.testing.assert_array_equal(placement.phy2log_LP, expected.phy2log_LP)


def test_a_cluster_that_is_not_a_cluster_spec_is_refused():
    with pytest.raises(PlacementInfeasibleError, match="cluster must be a ClusterSpec; got dict"):
        fit_placement("deepseek", GOOD, {"num_gpus": 4, "slots_per_gpu": 3})
