"""Properties every placement has, and the placement file round trip."""

import json

import numpy as np
import pytest

from placement import (
    ClusterSpec,
    Placement,
    PlacementFormatError,
    fit_placement,
    load_placement,
    save_placement,
)
from traces.model_layers import ModelLayers

CASES = [(8, 5, 32, "deepseek"), (16, 3, 40, "deepseek"), (4, 2, 8, "trivial"), (8, 4, 32, "trivial")]
CASE_IDS = ["8x5-deepseek", "16x3-deepseek", "4x2-trivial", "8x4-trivial"]


def window_counts(num_experts: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.poisson(rng.lognormal(3, 1, size=(3, num_experts)), size=(10, 3, num_experts))


def make_placement(num_gpus: int, slots: int, num_experts: int, policy: str, seed: int = 0) -> Placement:
    return fit_placement(policy, window_counts(num_experts, seed), ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots))


@pytest.mark.parametrize("num_gpus, slots, num_experts", [(8, 5, 32), (16, 3, 40)], ids=["8x5", "16x3"])
def test_deepseek_never_gives_a_busier_expert_fewer_replicas(num_gpus, slots, num_experts):
    load_LE = window_counts(num_experts).sum(axis=0)
    logcnt = make_placement(num_gpus, slots, num_experts, "deepseek").logcnt_LE
    for layer in range(3):
        busier = load_LE[layer][:, None] > load_LE[layer][None, :]
        assert (logcnt[layer][:, None] >= logcnt[layer][None, :])[busier].all()
        assert logcnt[layer].max() > 1


@pytest.mark.parametrize("num_gpus, slots, num_experts", [(4, 2, 8), (8, 4, 32), (4, 3, 8)],
                         ids=["4x2", "8x4", "4x3-uneven-copies"])
def test_trivial_puts_expert_p_mod_e_in_slot_p_with_an_equal_split(num_gpus, slots, num_experts):
    placement = make_placement(num_gpus, slots, num_experts, "trivial")
    expected = np.arange(num_gpus * slots) % num_experts
    assert (placement.phy2log_LP == expected).all()
    np.testing.assert_allclose(placement.weights_LP, 1.0 / np.bincount(expected)[expected][None].repeat(3, 0))


@pytest.mark.parametrize("num_gpus, slots, num_experts, policy", CASES, ids=CASE_IDS)
def test_log2phy_and_phy2log_invert_each_other(num_gpus, slots, num_experts, policy):
    placement = make_placement(num_gpus, slots, num_experts, policy)
    log2phy = placement.log2phy_LEX
    assert log2phy.shape[:2] == (3, num_experts)
    for layer in range(3):
        listed = log2phy[layer][log2phy[layer] >= 0]
        assert sorted(listed.tolist()) == list(range(num_gpus * slots))  # each slot listed exactly once
        for expert in range(num_experts):
            slots_of_expert = log2phy[layer, expert][log2phy[layer, expert] >= 0]
            assert len(slots_of_expert) == placement.logcnt_LE[layer, expert]
            assert (placement.phy2log_LP[layer, slots_of_expert] == expert).all()


def test_placement_file_round_trip_keeps_everything(tmp_path):
    placement = make_placement(8, 5, 32, "deepseek")
    save_placement(placement, tmp_path / "p.json")
    loaded = load_placement(tmp_path / "p.json")
    np.testing.assert_array_equal(loaded.phy2log_LP, placement.phy2log_LP)
    np.testing.assert_allclose(loaded.weights_LP, placement.weights_LP)
    assert loaded.cluster == placement.cluster and loaded.policy == "deepseek"
    data = json.loads((tmp_path / "p.json").read_text())
    for key in ("schema_version", "num_layers", "num_logical_experts", "num_gpus", "gpus_per_node", "slots_per_gpu",
                "physical_to_logical_map", "replica_weights"):
        assert key in data


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("replica_weights"), "missing keys"),
        (lambda d: d.__setitem__("schema_version", 9), "schema_version"),
        (lambda d: d["physical_to_logical_map"][0].__setitem__(0, 99), "expert ids"),
        (lambda d: d["replica_weights"][0].__setitem__(0, 0.9), "sum to 1"),
        (lambda d: d.__setitem__("slots_per_gpu", 4), r"3 rows of \[40\] entries; expected \[3, 32\]"),
        (lambda d: d["physical_to_logical_map"].pop(), r"2 rows of \[40\] entries; expected \[3, 40\]"),
        (lambda d: d["physical_to_logical_map"][1].__setitem__(2, 15.7), "layer 1 holds 15.7; expected expert ids"),
        (lambda d: d["physical_to_logical_map"][1].__setitem__(2, "15"), "layer 1 holds '15'"),
        (lambda d: d["replica_weights"][2].__setitem__(0, "1.0"), "replica_weights layer 2 holds '1.0'"),
        (lambda d: d["replica_weights"][2].__setitem__(0, False), "replica_weights layer 2 holds False"),
    ],
    ids=["missing-key", "schema", "bad-expert-id", "weights-not-summing", "slot-count", "layer-count",
         "fractional-expert-id", "string-expert-id", "string-weight", "boolean-weight"],
)
def test_bad_placement_files_raise_format_errors(tmp_path, mutate, message):
    placement = make_placement(8, 5, 32, "deepseek")
    save_placement(placement, tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    mutate(data)
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(PlacementFormatError, match=message):
        load_placement(tmp_path / "p.json")


def test_expert_without_replica_is_rejected():
    with pytest.raises(PlacementFormatError, match="no replica"):
        Placement.equal_split(np.array([[0, 0, 1, 1]]), ClusterSpec(num_gpus=2, slots_per_gpu=2), 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"num_gpus": 12, "slots_per_gpu": 2}, "whole nodes"), ({"num_gpus": 0, "slots_per_gpu": 2}, "greater than 0")],
    ids=["partial-node", "zero-gpus"],
)
def test_cluster_spec_rejects_impossible_clusters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(**kwargs)
