"""The file SGLang's `--init-expert-location` takes is the one `eplb place --sglang-out` writes, not the placement
file: checked against SGLang's own code where SGLang is installed. SGLang 0.5.23 installed with `--no-deps` cannot
import its expert-location module without the server's dependencies, so its parser is read from its source: the
loader hands every key of the JSON to `ExpertLocationMetadata.init_by_mapping(model_config, **data, moe_ep_rank=)`
when the JSON has `physical_to_logical_map`."""

import ast
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from eplb.engines.sglang.expert_map import save_sglang_mapping
from placement import ClusterSpec, fit_placement, save_placement
from traces.model_layers import ModelLayers

SGLANG = importlib.util.find_spec("sglang")
pytestmark = pytest.mark.skipif(SGLANG is None, reason="SGLang is not installed (pip install --no-deps sglang)")


def _sglang_source() -> ast.Module:
    path = Path(SGLANG.submodule_search_locations[0]) / "srt" / "eplb" / "expert_location.py"
    return ast.parse(path.read_text())


def _init_by_mapping_params() -> set[str]:
    """The keyword parameters of SGLang's `ExpertLocationMetadata.init_by_mapping`, as its source declares them."""
    for node in ast.walk(_sglang_source()):
        if isinstance(node, ast.FunctionDef) and node.name == "init_by_mapping":
            return {arg.arg for arg in node.args.args + node.args.kwonlyargs}
    raise AssertionError("SGLang's expert_location.py has no init_by_mapping")


def _placement(tmp_path: Path):
    counts = np.random.default_rng(0).poisson(50.0, size=(8, 2, 16))
    placement = fit_placement("deepseek", counts, ClusterSpec(num_gpus=4, slots_per_gpu=5))
    save_placement(placement, tmp_path / "placement.json")
    save_sglang_mapping(placement, tmp_path / "sglang.json", ModelLayers.from_first_moe_layer(0, 2))
    return placement


def test_sglang_s_loader_passes_every_key_to_init_by_mapping():
    source = ast.unparse(_sglang_source())
    assert "init_by_mapping(model_config, **data_dict, moe_ep_rank=moe_ep_rank)" in source


def test_the_sglang_out_file_binds_to_sglang_s_init_by_mapping_and_the_placement_file_does_not(tmp_path):
    placement = _placement(tmp_path)
    params = _init_by_mapping_params()
    mapping = json.loads((tmp_path / "sglang.json").read_text())
    assert set(mapping) <= params - {"model_config", "moe_ep_rank"}
    assert np.array_equal(np.asarray(mapping["physical_to_logical_map"]), placement.phy2log_LP)
    full = json.loads((tmp_path / "placement.json").read_text())
    assert "schema_version" in set(full) - params  # SGLang would raise: unexpected keyword argument
