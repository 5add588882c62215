"""The numpy split (`placement.routing.dynamic_split`): as good as an exact LP, with a certificate that says so."""

import numpy as np
import pytest

from placement import ClusterSpec, fit_placement
from placement.routing.dynamic_split import ReplicaGraph, optimal_split_loads


@pytest.mark.parametrize(
    "num_gpus, slots, num_experts", [(16, 5, 64), (32, 3, 64), (8, 4, 16)], ids=["16x5", "32x3", "8x4"]
)
def test_dynamic_split_matches_the_exact_lp_on_sampled_steps(exact_lp_max_load, num_gpus, slots, num_experts):
    rng = np.random.default_rng(num_gpus)
    popularity = rng.lognormal(0, 1.2, size=num_experts)
    popularity /= popularity.sum()
    history = rng.multinomial(64 * num_gpus, popularity, size=(20, 1))
    placement = fit_placement("deepseek", history, ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots))
    steps = rng.multinomial(64 * num_gpus, popularity, size=12)
    graph = ReplicaGraph.build(placement.phy2log_LP[0], placement.gpu_of_slot_P, num_experts, num_gpus)
    loads, gap = optimal_split_loads(steps, graph, tolerance=1e-4, max_rounds=2000)
    np.testing.assert_allclose(loads.sum(axis=1), steps.sum(axis=1))  # no token lost or invented
    for step in range(len(steps)):
        exact = exact_lp_max_load(steps[step].astype(float), placement.phy2log_LP[0], placement.gpu_of_slot_P,
                                  num_gpus)
        assert exact - 1e-6 <= loads[step].max() <= exact * (1 + 1e-4) + 1e-6
        assert gap[step] <= 1e-4
