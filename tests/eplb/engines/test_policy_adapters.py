"""DeepSeek's drop-in `rebalance_experts`: its public example reproduced as torch tensors, the cpsat policy never
worse than the greedy under equal split (fractional loads included), and every bad argument refused by a `ValueError`
naming it, by the function and by both vLLM policy classes (their other behaviour: test_vllm_policy.py)."""

import numpy as np
import pytest
import torch

from eplb import CpsatEplbPolicy, LegacyCpsatEplbPolicy, rebalance_experts
from eplb.engines.deepseek import policy as deepseek_policy
from placement import ClusterSpec, Placement, PlacementInfeasibleError
from placement.scoring import static_gpu_loads

README_WEIGHT = torch.tensor([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def test_deepseek_policy_reproduces_the_public_readme_example_as_int64_tensors():
    phy2log, log2phy, logcnt = rebalance_experts(README_WEIGHT, 16, 4, 2, 8)
    assert phy2log.tolist() == README_PHY2LOG
    assert phy2log.dtype == log2phy.dtype == logcnt.dtype == torch.int64
    assert log2phy.shape == (2, 12, int(logcnt.max())) and (log2phy >= -1).all()
    assert logcnt.sum(1).tolist() == [16, 16]


def peak(phy2log: torch.Tensor, weight: torch.Tensor, gpus: int, nodes: int) -> np.ndarray:
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=phy2log.shape[1] // gpus, gpus_per_node=gpus // nodes)
    placement = Placement.equal_split(phy2log.numpy(), cluster, weight.shape[1])
    return static_gpu_loads(weight.numpy()[None].astype(float), placement)[0].max(-1)


def test_cpsat_policy_is_never_worse_than_the_greedy_under_equal_split():
    weight = torch.as_tensor(np.random.default_rng(0).lognormal(3, 1.2, size=(3, 32)).round())
    greedy, _, _ = rebalance_experts(weight, 48, 1, 2, 16)
    fitted, log2phy, logcnt = rebalance_experts(weight, 48, 1, 2, 16, "cpsat")
    assert (peak(fitted, weight, 16, 2) <= peak(greedy, weight, 16, 2) + 1e-9).all()
    assert (logcnt >= 1).all() and logcnt.sum(1).tolist() == [48] * 3
    for layer in range(3):
        for expert in range(32):
            slots = log2phy[layer, expert][log2phy[layer, expert] >= 0]
            assert len(slots) == logcnt[layer, expert] and (fitted[layer, slots] == expert).all()


WEIGHT_16 = torch.arange(32).view(2, 16)
BAD_ARGUMENTS = [  # (weight, num_replicas, num_groups, num_nodes, num_gpus), the message (num_gpus spelt {gpus})
    ((README_WEIGHT, 15, 4, 2, 8), "num_replicas=15 must be a multiple of {gpus}=8"),
    ((README_WEIGHT, 16, 4, 3, 8), "{gpus}=8 must be a multiple of num_nodes=3"),
    ((README_WEIGHT, 8, 4, 2, 8), "num_replicas=8 must be at least the 12 experts of weight"),
    ((README_WEIGHT, -32, 4, 2, 8), "num_replicas must be >= 1; got -32"),
    ((README_WEIGHT, 32.0, 4, 2, 8), r"num_replicas must be an int; got 32.0 \(float\)"),
    ((README_WEIGHT, True, 4, 2, 8), "num_replicas must be an int; got the bool True"),
    ((README_WEIGHT, 16, 0, 2, 8), "num_groups must be >= 1; got 0"),
    ((README_WEIGHT, 16, -2, 2, 8), "num_groups must be >= 1; got -2"),
    ((WEIGHT_16, 16, 6, 2, 8), "num_groups=6 must divide the 16 experts of weight: num_nodes=2 divides it"),
    ((WEIGHT_16, 32, 32, 2, 8), "num_groups=32 must divide the 16 experts of weight"),
    ((README_WEIGHT, 16, 4, 0, 8), "num_nodes must be >= 1; got 0"),
    ((README_WEIGHT, 16, 4, 2, 0), "{gpus} must be >= 1; got 0"),
    ((torch.zeros(0, 12), 16, 4, 2, 8), r"weight must be a 2-D tensor \[layers, experts\] with at least one of each; "
                                        r"got shape \(0, 12\)"),
    ((torch.zeros(2, 0), 16, 4, 2, 8), r"got shape \(2, 0\)"),
    ((torch.ones(12), 16, 4, 2, 8), r"weight must be a 2-D tensor .* got shape \(12,\)"),
    ((-README_WEIGHT, 16, 4, 2, 8), "weight must be non-negative; found 24 negative loads"),
    ((README_WEIGHT.float().fill_(float("nan")), 16, 4, 2, 8), "weight must be finite in float32; found 24 NaN"),
]
BAD_IDS = ["replicas-not-per-gpu", "gpus-not-per-node", "fewer-replicas-than-experts", "negative-replicas",
           "float-replicas", "bool-replicas", "zero-groups", "negative-groups", "groups-not-dividing-experts",
           "more-groups-than-experts", "zero-nodes", "zero-gpus", "zero-layers", "zero-experts", "one-dimensional",
           "negative-load", "nan-load"]


@pytest.mark.parametrize(("args", "message"), BAD_ARGUMENTS, ids=BAD_IDS)
def test_bad_arguments_raise_a_value_error_naming_the_parameter_rule_and_value(args, message):
    for policy in ("deepseek", "cpsat"):
        with pytest.raises(ValueError, match=message.format(gpus="num_gpus")):
            rebalance_experts(*args, policy=policy)
    for policy_class in (CpsatEplbPolicy, CpsatEplbPolicy.configured(policy="deepseek"), LegacyCpsatEplbPolicy):
        with pytest.raises(ValueError, match=message.format(gpus="num_ranks")):
            policy_class.rebalance_experts(*args)


def test_infeasible_shapes_raise_placement_infeasible_error_which_is_a_value_error():
    with pytest.raises(PlacementInfeasibleError) as caught:
        rebalance_experts(README_WEIGHT, 8, 4, 2, 8)
    assert isinstance(caught.value, ValueError)


def test_groups_that_nodes_do_not_divide_select_the_global_policy_as_deepseek_does():
    hierarchical_rule_off, _, _ = rebalance_experts(WEIGHT_16, 16, 3, 2, 8)  # 3 % 2 != 0: global; 3 unused
    global_policy, _, _ = rebalance_experts(WEIGHT_16, 16, 1, 1, 8)
    assert torch.equal(hierarchical_rule_off, global_policy)


def test_cpsat_fits_fractional_loads_as_the_same_loads_in_any_unit(monkeypatch):
    # Normalised weights (each layer sums to 1) and the same weights x 1e4 give the fit the same integer loads,
    # and on both the fit beats the greedy.
    seen = []
    real_fit = deepseek_policy.fit_placement
    monkeypatch.setattr(deepseek_policy, "fit_placement",
                        lambda policy, counts, *args, **kwargs: seen.append(counts) or real_fit(policy, counts, *args,
                                                                                                 **kwargs))
    raw = torch.as_tensor(np.random.default_rng(0).lognormal(3, 1.2, size=(2, 32)))
    normalised = raw / raw.sum(-1, keepdim=True)
    for weight in (normalised, normalised * 1e4):
        greedy, _, _ = rebalance_experts(weight, 48, 1, 2, 16)
        fitted, _, _ = rebalance_experts(weight, 48, 1, 2, 16, "cpsat")
        assert peak(fitted, weight, 16, 2).sum() < peak(greedy, weight, 16, 2).sum() * 0.99
    np.testing.assert_array_equal(seen[0], seen[1])
    np.testing.assert_allclose(seen[0].sum(-1), deepseek_policy.CPSAT_LOAD_TOTAL, atol=32)


def group_nodes(phy2log: torch.Tensor, group_size: int, slots_per_node: int) -> list[set[int]]:
    """Per (layer, group), the nodes its experts' replicas lie on."""
    node_of_slot = torch.arange(phy2log.shape[1]) // slots_per_node
    spans = []
    for row in phy2log:
        for group in range(int(row.max()) // group_size + 1):
            spans.append(set(node_of_slot[row // group_size == group].tolist()))
    return spans


@pytest.mark.parametrize(("experts", "slots", "groups", "nodes", "gpus"), [(64, 96, 8, 4, 16), (64, 64, 4, 2, 16),
                                                                         (256, 288, 8, 4, 32)],
                         ids=["redundant-slots", "no-redundant-slot", "deepseek-v3-ep32"])
def test_cpsat_keeps_every_group_on_one_node_where_deepseeks_policy_is_hierarchical(experts, slots, groups, nodes,
                                                                                  gpus):
    weight = torch.as_tensor(np.random.default_rng(experts + gpus).lognormal(3, 1.0, size=(3, experts)))
    greedy, _, _ = rebalance_experts(weight, slots, groups, nodes, gpus)
    fitted, _, _ = rebalance_experts(weight, slots, groups, nodes, gpus, "cpsat")
    by_vllm_class = CpsatEplbPolicy.rebalance_experts(weight, slots, groups, nodes, gpus)
    for phy2log in (greedy, fitted, by_vllm_class):
        assert all(len(span) == 1 for span in group_nodes(phy2log, experts // groups, slots // nodes))
    assert (peak(fitted, weight, gpus, nodes) <= peak(greedy, weight, gpus, nodes) + 1e-9).all()
