"""A budget is either deterministic work or wall-clock time, never both, at every entry point; the cpsat policy's
options are refused where the policy is DeepSeek's (the command line already refused both)."""

import numpy as np
import pytest
import torch

from eplb import CpsatEplbPolicy, rebalance_experts
from placement import ClusterSpec, PlacementInfeasibleError, fit_placement

COUNTS = np.random.default_rng(0).integers(0, 50, (4, 2, 32))
WEIGHT = torch.from_numpy(COUNTS.sum(axis=0)).float()


@pytest.mark.parametrize("call", [
    lambda: fit_placement("cpsat", COUNTS, ClusterSpec(num_gpus=8, slots_per_gpu=5), work_limit=1, time_limit_s=1),
    lambda: rebalance_experts(WEIGHT, 40, 1, 1, 8, "cpsat", work_limit=1, time_limit_s=1),
    lambda: CpsatEplbPolicy.configured(work_limit=1, time_limit_s=1),
], ids=["fit_placement", "rebalance_experts", "vllm-configured"])
def test_work_and_time_budgets_together_are_refused(call):
    with pytest.raises((ValueError, PlacementInfeasibleError), match="work_limit .* or time_limit_s .*not both"):
        call()


@pytest.mark.parametrize("option", [{"work_limit": 1.0}, {"time_limit_s": 1.0}, {"seed": 3}])
def test_deepseeks_policy_refuses_the_cpsat_policys_options(option):
    with pytest.raises(ValueError, match=f"{next(iter(option))}: the cpsat policy's options"):
        rebalance_experts(WEIGHT, 40, 1, 1, 8, "deepseek", **option)


def test_either_budget_alone_still_places():
    for budget in ({"work_limit": 0.5}, {"time_limit_s": 0.5}, {}):
        phy2log = rebalance_experts(WEIGHT, 40, 1, 1, 8, "cpsat", **budget)[0]
        assert phy2log.shape == (2, 40)
    placement = fit_placement("cpsat", COUNTS, ClusterSpec(num_gpus=8, slots_per_gpu=5), time_limit_s=0.5)
    assert placement.phy2log_LP.shape == (2, 40)
