"""vLLM's policy interface without vLLM: the classes called as vLLM 0.33 calls them (`eplb_state.py`,
`async_worker.py`) return a CPU int64 [L, P] map (the legacy class the 3-tuple), keep experts in their old slots (-1
slots, elastic scale-down and scale-up included), follow vLLM's rule that an expert staying on a rank keeps its
slot, refuse bad options and old maps by name, and importing `eplb` or DeepSeek's function never imports vLLM.
Against vLLM's own files: test_vllm_reference.py."""

import inspect
import subprocess
import sys

import numpy as np
import pytest
import torch

from eplb import CpsatEplbPolicy, LegacyCpsatEplbPolicy
from eplb.engines.vllm import policy as vllm_policy, slot_keeping
from placement import Placement

README_WEIGHT = torch.tensor([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
DEEPSEEK = CpsatEplbPolicy.configured(policy="deepseek")
QUICK_CPSAT = CpsatEplbPolicy.configured(work_limit=0.5)


def kept_everything_that_stayed(new: torch.Tensor, old: torch.Tensor, num_ranks: int) -> bool:
    """vLLM's rule: on every (layer, rank), each expert both maps put there (multiset) sits in an old slot of it."""
    slots = new.shape[1] // num_ranks
    for new_S, old_S in zip(new.reshape(-1, slots).tolist(), old.reshape(-1, slots).tolist()):
        shared = sum(min(new_S.count(e), old_S.count(e)) for e in set(new_S) if e >= 0)
        if sum(a == b for a, b in zip(new_S, old_S)) != shared:
            return False
    return True


def as_vllm_calls(policy_class, weight, num_replicas, num_groups, num_nodes, num_ranks, old):
    """The call of `EplbState.rearrange` (positional, the int32 load window and the map moved to the CPU) and the
    check `async_worker.run_rebalance_experts` makes on the answer."""
    new_map = policy_class.rebalance_experts(weight.to(torch.int32).cpu(), num_replicas, num_groups, num_nodes,
                                             num_ranks, old.cpu())
    assert new_map.device == torch.device("cpu")
    return new_map


@pytest.mark.parametrize("policy_class", [QUICK_CPSAT, DEEPSEEK], ids=["cpsat", "deepseek"])
def test_the_class_answers_vllm_with_one_cpu_int64_map_of_every_slot(policy_class):
    assert isinstance(inspect.getattr_static(policy_class, "rebalance_experts"), classmethod)
    first = policy_class.rebalance_experts(README_WEIGHT, 16, 4, 2, 8)
    assert isinstance(first, torch.Tensor) and first.dtype == torch.int64 and first.device.type == "cpu"
    assert first.shape == (2, 16) and ((first >= 0) & (first < 12)).all()
    assert torch.equal(torch.zeros(2, 12, dtype=torch.int64).scatter_add_(1, first, torch.ones_like(first)) > 0,
                       torch.ones(2, 12, dtype=torch.bool))  # every expert has a slot
    again = as_vllm_calls(policy_class, README_WEIGHT, 16, 4, 2, 8, first)
    assert again.shape == first.shape and again.dtype == torch.int64 and kept_everything_that_stayed(again, first, 8)


def test_the_deepseek_option_reproduces_the_public_example_as_vllm_does():
    assert DEEPSEEK.rebalance_experts(README_WEIGHT, 16, 4, 2, 8).tolist() == README_PHY2LOG


def test_the_legacy_class_returns_the_three_maps_of_the_same_placement():
    phy2log, log2phy, logcnt = LegacyCpsatEplbPolicy.configured(policy="deepseek").rebalance_experts(
        README_WEIGHT, 16, 4, 2, 8)
    assert phy2log.tolist() == README_PHY2LOG
    assert phy2log.dtype == log2phy.dtype == logcnt.dtype == torch.int64
    assert logcnt.shape == (2, 12) and logcnt.sum(1).tolist() == [16, 16]
    for layer in range(2):
        for expert in range(12):
            slots = log2phy[layer, expert][log2phy[layer, expert] >= 0]
            assert slots.tolist() == sorted(slots.tolist()) and len(slots) == logcnt[layer, expert]
            assert (phy2log[layer, slots] == expert).all()


def shuffled_fit(monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """An old map [1, 32] (16 experts twice on 8 GPUs x 4 slots) and a fit that returns the same placement with its
    GPUs swapped inside nodes of 2 and each GPU's slots reversed."""
    old = torch.as_tensor(np.random.default_rng(1).permutation(np.arange(32) % 16).reshape(1, 32))
    shuffled = old.view(1, 8, 4)[:, [1, 0, 3, 2, 5, 4, 7, 6]].flip(-1).reshape(1, 32)
    monkeypatch.setattr(vllm_policy, "cpsat_or_baseline",
                        lambda load, baseline, cluster, options: Placement.equal_split(shuffled.numpy(), cluster, 16))
    return old, shuffled


def test_cpsat_relabels_a_fit_to_keep_every_expert_in_its_old_slot(monkeypatch):
    old, shuffled = shuffled_fit(monkeypatch)
    weight = torch.ones(1, 16)
    assert torch.equal(CpsatEplbPolicy.rebalance_experts(weight, 32, 1, 4, 8, old_global_expert_indices=old), old)
    assert torch.equal(CpsatEplbPolicy.rebalance_experts(weight, 32, 1, 4, 8), shuffled)
    phy2log, log2phy, logcnt = LegacyCpsatEplbPolicy.rebalance_experts(weight, 32, 1, 4, 8, old)
    assert torch.equal(phy2log, old) and logcnt.tolist() == [[2] * 16] and log2phy.shape == (1, 16, 2)


def test_an_old_map_with_unused_slots_is_kept_in_place_and_the_unused_slots_filled(monkeypatch):
    old, _ = shuffled_fit(monkeypatch)
    holey = old.clone()
    holey[0, [1, 6]] = -1  # two unused slots; their experts are still held elsewhere
    only_copies = (old[0] == old[0, 9]).nonzero().flatten()
    holey[0, only_copies] = -1  # and an expert the old map lacks entirely
    moved = CpsatEplbPolicy.rebalance_experts(torch.ones(1, 16), 32, 1, 4, 8, old_global_expert_indices=holey)
    held = holey >= 0
    assert torch.equal(moved[held], holey[held])  # every expert the old map holds stays in its slot
    # and each GPU holds what it held before the holes were made: the unused slots took the rest
    assert torch.equal(moved.view(8, 4).sort(-1).values, old.view(8, 4).sort(-1).values)


def test_an_old_map_with_nothing_in_it_leaves_the_fit_as_it_is(monkeypatch):
    _, shuffled = shuffled_fit(monkeypatch)
    moved = CpsatEplbPolicy.rebalance_experts(torch.ones(1, 16), 32, 1, 4, 8, torch.full((1, 32), -1))
    assert torch.equal(moved, shuffled)


def test_after_scale_down_every_surviving_expert_stays_in_its_old_slot(monkeypatch):
    # 12 ranks x 4 slots shrink to 8: the fit is the 8 surviving ranks' experts, GPUs and slots shuffled; the lost
    # ranks' slots (32..47) held other copies. Every surviving slot keeps its expert: nothing moves.
    old, shuffled = shuffled_fit(monkeypatch)
    lost_ranks = torch.as_tensor(np.random.default_rng(2).integers(0, 16, size=(1, 16)))
    wide = torch.cat([old, lost_ranks], dim=1)  # [1, 48]
    moved = as_vllm_calls(CpsatEplbPolicy, torch.ones(1, 16), 32, 1, 4, 8, wide)
    assert torch.equal(moved, old)


@pytest.mark.parametrize("policy_class", [QUICK_CPSAT, DEEPSEEK], ids=["cpsat", "deepseek"])
@pytest.mark.parametrize("old_ranks", [8, 12, 6], ids=["same-ranks", "scale-down-from-12", "scale-up-from-6"])
def test_an_expert_that_stays_on_a_rank_keeps_its_slot(policy_class, old_ranks):
    rng = np.random.default_rng(old_ranks)
    weight = torch.as_tensor(rng.lognormal(3, 1.2, size=(2, 24)).round())
    old = torch.as_tensor(np.stack([rng.permutation(np.arange(old_ranks * 4) % 24) for _ in range(2)]))
    old[:, rng.choice(old_ranks * 4, 3, replace=False)] = -1
    new = as_vllm_calls(policy_class, weight, 32, 1, 2, 8, old)
    assert new.shape == (2, 32)
    on_new_ranks = old[:, :32] if old_ranks >= 8 else torch.cat([old, torch.full((2, 32 - old.shape[1]), -1)], 1)
    assert kept_everything_that_stayed(new, on_new_ranks, 8)
    if policy_class is DEEPSEEK:  # vLLM's placement with each rank's slots reordered, nothing else
        unmoved = policy_class.rebalance_experts(weight, 32, 1, 2, 8)
        assert torch.equal(new.view(2, 8, 4).sort(-1).values, unmoved.view(2, 8, 4).sort(-1).values)
    else:  # the cpsat promise survives the relabelling: never worse than vLLM's default under equal split
        default = DEEPSEEK.rebalance_experts(weight, 32, 1, 2, 8)
        assert (busiest_rank(new, weight, 8) <= busiest_rank(default, weight, 8) + 1e-9).all()


def busiest_rank(phy2log: torch.Tensor, weight: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """[L] the busiest rank's load under equal split (each expert's load divided evenly over its slots)."""
    count = torch.zeros(weight.shape, dtype=torch.float64).scatter_add_(1, phy2log, torch.ones(phy2log.shape,
                                                                                               dtype=torch.float64))
    per_slot = (weight.double() / count).gather(1, phy2log)
    return per_slot.view(phy2log.shape[0], num_ranks, -1).sum(-1).max(-1).values


def test_preserving_slots_claims_the_first_match_and_fills_in_new_order():
    # One GPU of 4 slots: old [x=7, -1, 5, 7]; new [5, 9, 7, 3]. 7 keeps slot 0, 5 keeps slot 2; the incoming 9 and 3
    # take slots 1 and 3 in their new order. A second GPU with a repeated expert: the first old 2 claims the first
    # new 2, and the new experts not claimed keep their order.
    new = np.array([[5, 9, 7, 3, 2, 4, 2, 8]])
    old = np.array([[7, -1, 5, 7, 6, 2, 1, 1]])
    assert slot_keeping.preserve_intragpu_slots(new, old, 2).tolist() == [[7, 9, 5, 3, 4, 2, 2, 8]]


@pytest.mark.parametrize(("options", "message"), [
    ({"policy": "greedy"}, r"policy must be one of \('deepseek', 'cpsat'\); got 'greedy'"),
    ({"time_limit_s": 0}, r"time_limit_s must be None \(the deterministic work_limit\) or seconds in \(0, 86400\]; "
                          r"got 0"),
    ({"time_limit_s": float("inf")}, r"time_limit_s must be None .* got inf"),
    ({"work_limit": 0}, r"work_limit must be a number of work units in \[0.001, 1e\+06\]; got 0"),
    ({"work_limit": 1e300}, r"work_limit must be a number of work units in \[0.001, 1e\+06\]; got 1e\+300"),
    ({"work_limit": 1e-300}, r"work_limit must be a number of work units in \[0.001, 1e\+06\]; got 1e-300"),
    ({"seed": -1}, "seed must be >= 0; got -1"),
    ({"seed": 1.5}, r"seed must be an int; got 1.5 \(float\)"),
    ({"seed": 2**31}, r"seed must be below 2\^31 \(CP-SAT's seed is a 32-bit int\); got 2147483648"),
], ids=["unknown-policy", "zero-time", "infinite-time", "zero-work", "endless-work", "vanishing-work", "negative-seed",
        "float-seed", "huge-seed"])
def test_bad_options_are_refused_by_name_when_configured_and_when_called(options, message):
    with pytest.raises(ValueError, match=message):
        CpsatEplbPolicy.configured(**options)
    subclass = type("Tuned", (CpsatEplbPolicy,), options)  # set without `configured`: refused at the call
    with pytest.raises(ValueError, match=message):
        subclass.rebalance_experts(README_WEIGHT, 16, 4, 2, 8)


def test_configured_keeps_the_options_it_is_not_given():
    tuned = CpsatEplbPolicy.configured(work_limit=2.5).configured(seed=3)
    assert (tuned.policy, tuned.work_limit, tuned.time_limit_s, tuned.seed) == ("cpsat", 2.5, None, 3)
    assert issubclass(tuned, CpsatEplbPolicy)


@pytest.mark.parametrize(("old", "message"), [
    (torch.full((2, 16), 12), r"expert ids in \[-1, 12\) \(-1: an unused slot\); found ids from 12 to 12"),
    (torch.full((2, 16), -2), r"found ids from -2 to -2"),
    (torch.zeros(3, 16, dtype=torch.int64), r"must be \[2, slots\] \(a row per layer of weight\); got shape \(3, 16"),
    (torch.zeros(2, 16), "must hold integer expert ids; got dtype torch.float32"),
    (torch.zeros(2, 17, dtype=torch.int64), r"must have a multiple of the 2 slots per rank .*; got 17 slots"),
], ids=["id-too-large", "id-below-minus-one", "wrong-layers", "float-ids", "part-of-a-rank"])
@pytest.mark.parametrize("policy_class", [CpsatEplbPolicy, DEEPSEEK, LegacyCpsatEplbPolicy],
                         ids=["cpsat", "deepseek", "legacy"])
def test_a_bad_old_map_is_refused_naming_old_global_expert_indices(policy_class, old, message):
    with pytest.raises(ValueError, match="old_global_expert_indices .*" + message):
        policy_class.rebalance_experts(README_WEIGHT, 16, 4, 2, 8, old_global_expert_indices=old)


def test_importing_eplb_or_its_adapters_imports_neither_vllm_nor_transformers():
    code = ("import sys, eplb; from eplb import rebalance_experts; from eplb.engines import rebalance_experts; "
            "import eplb.engines.deepseek.policy, eplb.engines.transformers.models; "
            "import eplb.engines.transformers.generation; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'transformers')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
