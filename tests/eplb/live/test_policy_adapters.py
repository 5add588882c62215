"""The drop-in policies: DeepSeek's `rebalance_experts` reproduced exactly as torch tensors, the cpsat policy never
worse than the greedy under equal split, and vLLM's policy interface moving the fewest experts from the old map."""

import numpy as np
import pytest
import torch

from eplb import CpsatEplbPolicy, rebalance_experts
from placement import ClusterSpec, Placement
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
    monkeypatch.setattr("eplb.live.policy_adapters.rebalance_experts", fit)
    weight = torch.ones(1, 16)
    moved, log2phy, logcnt = CpsatEplbPolicy.rebalance_experts(weight, 32, 1, 1, 8, old_global_expert_indices=old)
    assert torch.equal(moved, old)
    assert logcnt.tolist() == [[2] * 16] and log2phy.shape == (1, 16, 2)
    unchanged, _, _ = CpsatEplbPolicy.rebalance_experts(weight, 32, 1, 1, 8)
    assert torch.equal(unchanged, shuffled)


@pytest.mark.parametrize(("args", "message"), [
    ((README_WEIGHT, 15, 4, 2, 8), "num_replicas=15 must be a multiple of num_gpus=8"),
    ((README_WEIGHT, 16, 4, 3, 8), "multiple of num_nodes=3"),
    ((-README_WEIGHT, 16, 4, 2, 8), "non-negative"),
], ids=["replicas-not-per-gpu", "gpus-not-per-node", "negative-load"])
def test_bad_arguments_are_refused_naming_the_parameter(args, message):
    with pytest.raises(Exception, match=message):
        rebalance_experts(*args)
