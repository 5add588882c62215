"""Property-based fuzzing of the library's entry points (hypothesis, derandomised): `ClusterSpec`, `fit_placement`,
`score_placement` and DeepSeek's `rebalance_experts` called with random, often wrong, arguments either return or
raise a `ValueError` (the project's errors are ones) naming what is wrong, never another exception (a TypeError,
an IndexError, an overflow deep inside numpy or OR-Tools), and never change the arrays they were given."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eplb import rebalance_experts
from placement import ClusterSpec, fit_placement, score_placement

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
ODD_NUMBERS = st.sampled_from([0, -1, 1, 2, 3, 4, 7, 8, 16, 2**31, 2**63, 10**9, 1.5, 4.0, math.nan, math.inf,
                               -math.inf, "4", None, True, [4]])
ODD_VALUES = st.sampled_from([0, 1, 10, -5, 0.5, 1e300, math.nan, math.inf, 2**62])


@st.composite
def loads(draw, dtype=np.float64):
    """[T, L, E] loads, good or broken in one of the ways a caller's array can be."""
    shape = draw(st.sampled_from([(3, 2, 8), (1, 1, 8), (2, 2, 4), (2, 8), (0, 2, 8), (2, 2, 8, 1)]))
    counts = np.random.default_rng(draw(st.integers(0, 3))).integers(0, 40, size=shape).astype(dtype)
    if counts.size and draw(st.booleans()):
        counts.flat[draw(st.integers(0, counts.size - 1))] = draw(ODD_VALUES)
    return counts


def _returns_or_value_error(call) -> None:
    try:
        call()
    except ValueError as exc:
        assert str(exc).strip(), "a ValueError with no message"


@FUZZ
@given(num_gpus=ODD_NUMBERS, slots=ODD_NUMBERS, per_node=ODD_NUMBERS)
def test_cluster_spec_takes_counts_or_refuses_them(num_gpus, slots, per_node):
    _returns_or_value_error(lambda: ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots, gpus_per_node=per_node))


@FUZZ
@given(counts=loads(), policy=st.sampled_from(["deepseek", "cpsat", "trivial", "greedy"]),
       option=st.sampled_from([{}, {"seed": 2**40}, {"seed": -1}, {"work_limit": 0}, {"work_limit": 1e300},
                               {"time_limit_s": math.inf}, {"routing": "sideways"}, {"bogus": 1},
                               {"num_groups": 3}, {"groups": 3}]))
def test_fit_placement_returns_or_refuses_naming_the_argument(counts, policy, option):
    before = counts.copy()
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=3)
    if policy == "cpsat":
        option = {"work_limit": 0.05, **option}
    _returns_or_value_error(lambda: fit_placement(policy, counts, cluster, **option))
    np.testing.assert_array_equal(counts, before)


@FUZZ
@given(counts=loads(), routing=st.sampled_from(["static", "dynamic", "live", "best"]))
def test_score_placement_returns_or_refuses_naming_the_argument(counts, routing):
    placement = fit_placement("deepseek", np.ones((2, 2, 8), dtype=np.int64), ClusterSpec(num_gpus=4, slots_per_gpu=3))
    before = counts.copy()
    _returns_or_value_error(lambda: score_placement(placement, counts, routing))
    np.testing.assert_array_equal(counts, before)


@FUZZ
@given(counts=loads(), replicas=ODD_NUMBERS, groups=ODD_NUMBERS, nodes=ODD_NUMBERS, gpus=ODD_NUMBERS)
def test_rebalance_experts_returns_or_refuses_naming_the_argument(counts, replicas, groups, nodes, gpus):
    weight = torch.from_numpy(counts.reshape(-1, counts.shape[-1]) if counts.ndim >= 2 else counts)
    before = weight.clone()
    _returns_or_value_error(lambda: rebalance_experts(weight, replicas, groups, nodes, gpus))
    assert torch.equal(weight, before) or torch.isnan(before).any()
