"""SGLang's map has one row per model layer: the placement's rows at the MoE layers' ids, SGLang's trivial row
(slot p holds expert p % E) at the dense ones, and a placement of another layer count refused."""

import json

import numpy as np
import pytest

from eplb.engines.sglang.expert_map import save_sglang_mapping, sglang_physical_to_logical_map
from placement import ClusterSpec, PlacementFormatError, fit_placement
from traces.model_layers import ModelLayers

CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=5)


def placement_of(num_layers: int):
    # Layer l's loads favour expert l, so each placement row is told apart by its layer.
    counts = np.random.default_rng(0).poisson(20.0, size=(6, num_layers, 16))
    counts[:, np.arange(num_layers), np.arange(num_layers) % 16] += 400
    return fit_placement("deepseek", counts, CLUSTER)


@pytest.mark.parametrize(
    "layers",
    [ModelLayers.from_first_moe_layer(3, 9), ModelLayers(9, (1, 2, 4, 5, 7, 8)),
     ModelLayers.from_first_moe_layer(0, 6)],
    ids=["first-3-dense", "interleaved-dense", "all-moe"],
)
def test_each_moe_layer_s_row_sits_at_its_model_layer_and_dense_rows_are_trivial(layers):
    placement = placement_of(layers.num_moe_layers)
    phy2log_MP = sglang_physical_to_logical_map(placement, layers)
    assert phy2log_MP.shape == (layers.num_layers, CLUSTER.num_slots)
    for trace_layer, model_layer in enumerate(layers.moe_layer_ids):
        np.testing.assert_array_equal(phy2log_MP[model_layer], placement.phy2log_LP[trace_layer])
    for model_layer in layers.dense_layer_ids:
        np.testing.assert_array_equal(phy2log_MP[model_layer], np.arange(CLUSTER.num_slots) % 16)
    assert all(set(row) == set(range(16)) for row in phy2log_MP.tolist())  # every expert has a slot in every row


def test_a_placement_of_another_layer_count_is_refused():
    with pytest.raises(PlacementFormatError, match="placement has 61 layers but model_layers .* has 58 MoE layers"):
        sglang_physical_to_logical_map(placement_of(61), ModelLayers.from_first_moe_layer(3, 61))


def test_the_file_holds_the_one_key_with_one_row_per_model_layer(tmp_path):
    save_sglang_mapping(placement_of(4), tmp_path / "sglang.json", ModelLayers.from_first_moe_layer(2, 6))
    data = json.loads((tmp_path / "sglang.json").read_text())
    assert list(data) == ["physical_to_logical_map"] and len(data["physical_to_logical_map"]) == 6


def test_sglang_mapping_file_holds_only_the_map(tmp_path):
    counts_TLE = np.random.default_rng(0).integers(0, 50, (3, 5, 32))
    placement = fit_placement("deepseek", counts_TLE, ClusterSpec(num_gpus=8, slots_per_gpu=5))
    layers = placement.num_layers
    save_sglang_mapping(placement, tmp_path / "s.json", ModelLayers.from_first_moe_layer(0, layers))
    data = json.loads((tmp_path / "s.json").read_text())
    assert list(data) == ["physical_to_logical_map"]
    assert data["physical_to_logical_map"] == placement.phy2log_LP.tolist()
