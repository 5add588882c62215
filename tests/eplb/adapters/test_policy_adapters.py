"""The drop-in policies: DeepSeek's `rebalance_experts` reproduced exactly as torch tensors, the cpsat policy never
worse than the greedy under equal split (fractional loads included), vLLM's policy interface moving the fewest
experts from the old map (unused slots included), and every bad argument refused by a `ValueError` naming it."""

import numpy as np
import pytest
import torch

from eplb import CpsatEplbPolicy, rebalance_experts
from eplb.adapters import policies as policy_adapters
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
    fitted, log2phy, logcnt = rebalance_experts(weight, 48, 1, 2, 16, "cpsat", time_limit_s=2.0)
    assert (peak(fitted, weight, 16, 2) <= peak(greedy, weight, 16, 2) + 1e-9).all()
    assert (logcnt >= 1).all() and logcnt.sum(1).tolist() == [48] * 3
    for layer in range(3):
        for expert in range(32):
            slots = log2phy[layer, expert][log2phy[layer, expert] >= 0]
            assert len(slots) == logcnt[layer, expert] and (fitted[layer, slots] == expert).all()


def test_vllm_interface_relabels_a_fit_to_keep_experts_in_place_from_the_old_map(monkeypatch):
    # The fit returns the old map with GPUs swapped and slots reordered: the same placement, so nothing need move.
    old = torch.as_tensor(np.random.default_rng(1).permutation(np.arange(32) % 16).reshape(1, 32))
    shuffled = old.view(1, 8, 4)[:, [3, 1, 0, 2, 5, 4, 7, 6]].flip(-1).reshape(1, 32)
    fit = lambda *args, **kwargs: (shuffled, None, None)  # noqa: E731
    monkeypatch.setattr("eplb.adapters.policies.rebalance_experts", fit)
    weight = torch.ones(1, 16)
    moved, log2phy, logcnt = CpsatEplbPolicy.rebalance_experts(weight, 32, 1, 1, 8, old_global_expert_indices=old)
    assert torch.equal(moved, old)
    assert logcnt.tolist() == [[2] * 16] and log2phy.shape == (1, 16, 2)
    unchanged, _, _ = CpsatEplbPolicy.rebalance_experts(weight, 32, 1, 1, 8)
    assert torch.equal(unchanged, shuffled)


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
    with pytest.raises(ValueError, match=message.format(gpus="num_ranks")):
        CpsatEplbPolicy.rebalance_experts(*args)


def test_infeasible_shapes_raise_placement_infeasible_error_which_is_a_value_error():
    with pytest.raises(PlacementInfeasibleError) as caught:
        rebalance_experts(README_WEIGHT, 8, 4, 2, 8)
    assert isinstance(caught.value, ValueError)


def test_groups_that_nodes_do_not_divide_select_the_global_policy_as_deepseek_does():
    hierarchical_rule_off, _, _ = rebalance_experts(WEIGHT_16, 16, 3, 2, 8)  # 3 % 2 != 0: global; 3 unused
    global_policy, _, _ = rebalance_experts(WEIGHT_16, 16, 1, 1, 8)
    assert torch.equal(hierarchical_rule_off, global_policy)


@pytest.mark.parametrize(("old", "message"), [
    (torch.full((2, 16), 12), r"expert ids in \[-1, 12\) \(-1: an unused slot\); found ids from 12 to 12"),
    (torch.full((2, 16), -2), r"found ids from -2 to -2"),
    (torch.zeros(3, 16, dtype=torch.int64), r"must be \[2, slots\] \(a row per layer of weight\); got shape \(3, 16"),
    (torch.zeros(2, 16), "must hold integer expert ids; got dtype torch.float32"),
], ids=["id-too-large", "id-below-minus-one", "wrong-layers", "float-ids"])
def test_a_bad_old_map_is_refused_naming_old_global_expert_indices(old, message):
    with pytest.raises(ValueError, match="old_global_expert_indices .*" + message):
        CpsatEplbPolicy.rebalance_experts(README_WEIGHT, 16, 4, 2, 8, old_global_expert_indices=old)


def shuffled_fit(monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """An old map [1, 32] (16 experts twice on 8 GPUs x 4 slots) and a fit that returns the same placement with its
    GPUs swapped inside nodes of 2 and each GPU's slots reversed."""
    old = torch.as_tensor(np.random.default_rng(1).permutation(np.arange(32) % 16).reshape(1, 32))
    shuffled = old.view(1, 8, 4)[:, [1, 0, 3, 2, 5, 4, 7, 6]].flip(-1).reshape(1, 32)
    monkeypatch.setattr(policy_adapters, "rebalance_experts", lambda *args, **kwargs: (shuffled, None, None))
    return old, shuffled


def test_an_old_map_with_unused_slots_is_kept_in_place_and_the_unused_slots_filled(monkeypatch):
    old, _ = shuffled_fit(monkeypatch)
    holey = old.clone()
    holey[0, [1, 6]] = -1  # two unused slots; their experts are still held elsewhere
    only_copies = (old[0] == old[0, 9]).nonzero().flatten()
    holey[0, only_copies] = -1  # and an expert the old map lacks entirely
    moved, log2phy, logcnt = CpsatEplbPolicy.rebalance_experts(torch.ones(1, 16), 32, 1, 4, 8,
                                                               old_global_expert_indices=holey)
    held = holey >= 0
    assert torch.equal(moved[held], holey[held])  # every expert the old map holds stays in its slot
    # and each GPU holds what it held before the holes were made: the unused slots took the rest
    assert torch.equal(moved.view(8, 4).sort(-1).values, old.view(8, 4).sort(-1).values)
    assert logcnt.tolist() == [[2] * 16] and log2phy.shape == (1, 16, 2)


def test_an_old_map_of_another_width_or_with_nothing_in_it_leaves_the_fit_as_it_is(monkeypatch):
    _, shuffled = shuffled_fit(monkeypatch)
    for old in (torch.zeros(1, 48, dtype=torch.int64), torch.full((1, 32), -1)):
        moved, _, _ = CpsatEplbPolicy.rebalance_experts(torch.ones(1, 16), 32, 1, 4, 8, old_global_expert_indices=old)
        assert torch.equal(moved, shuffled)


def test_cpsat_fits_fractional_loads_as_the_same_loads_in_any_unit(monkeypatch):
    # Normalised weights (each layer sums to 1) and the same weights x 1e4 give the fit the same integer loads,
    # and on both the fit beats the greedy.
    seen = []
    real_fit = policy_adapters.fit_placement
    monkeypatch.setattr(policy_adapters, "fit_placement",
                        lambda policy, counts, *args, **kwargs: seen.append(counts) or real_fit(policy, counts, *args,
                                                                                                 **kwargs))
    raw = torch.as_tensor(np.random.default_rng(0).lognormal(3, 1.2, size=(2, 32)))
    normalised = raw / raw.sum(-1, keepdim=True)
    for weight in (normalised, normalised * 1e4):
        greedy, _, _ = rebalance_experts(weight, 48, 1, 2, 16)
        fitted, _, _ = rebalance_experts(weight, 48, 1, 2, 16, "cpsat", time_limit_s=1.0)
        assert peak(fitted, weight, 16, 2).sum() < peak(greedy, weight, 16, 2).sum() * 0.99
    np.testing.assert_array_equal(seen[0], seen[1])
    np.testing.assert_allclose(seen[0].sum(-1), policy_adapters.CPSAT_LOAD_TOTAL, atol=32)
