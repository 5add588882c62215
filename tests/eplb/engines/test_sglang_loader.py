"""A DeepSeek-V3-shaped SGLang dump through `eplb place --sglang-out` into SGLang's own loader, run for real.

SGLang 0.5.23 installed with `--no-deps` cannot `import sglang` (the server's dependencies are missing), so its code
runs from its source files: `expert_location.py` whole, loaded by path under the name SGLang gives it, with the three
modules it reaches for replaced by stand-ins holding the server's settings (`runtime_context`: the device, the MoE
and parallel settings; `model_loader.get_model_architecture`: the model class, whose
`get_model_config_for_expert_location` is DeepSeek's, which this test checks reads `num_hidden_layers`;
`elastic_ep`: off); and from `expert_distribution.py` the recorder's circular buffer and its logical-count conversion.
The loader's checks all run: `compute_initial_expert_location_metadata` reads the `--init-expert-location` file,
`init_by_mapping` builds every table, and the static dispatch table asserts every expert has a slot on every layer.
"""

import ast
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
SGLANG = importlib.util.find_spec("sglang")
pytestmark = pytest.mark.skipif(SGLANG is None, reason="SGLang is not installed (pip install --no-deps sglang)")

LAYERS, DENSE, EXPERTS, GROUPS = 61, 3, 256, 8  # DeepSeek-V3: num_hidden_layers, first_k_dense_replace, ...
GPUS, SLOTS = 32, 9  # EP32, 288 slots: --ep-num-redundant-experts 32
BUFFER, RECORDED = 1000, 300  # SGLang's default buffer, and the steps recorded into it


def _source(*parts: str) -> Path:
    return Path(SGLANG.submodule_search_locations[0], "srt", *parts)


def _recorder_pieces() -> dict:
    """SGLang's `_Buffer`, `_CircularBuffer` and `_convert_global_physical_count_to_logical_count`, from its source."""
    tree = ast.parse(_source("eplb", "expert_distribution.py").read_text())
    wanted = {"_Buffer", "_CircularBuffer", "_convert_global_physical_count_to_logical_count"}
    body = [node for node in tree.body if getattr(node, "name", None) in wanted]
    assert {node.name for node in body} == wanted, "SGLang's recorder changed: look again at expert_distribution.py"
    module = ast.Module(body=[ast.parse("from __future__ import annotations").body[0], *body], type_ignores=[])
    namespace = {"torch": torch}
    exec(compile(module, "sglang/srt/eplb/expert_distribution.py", "exec"), namespace)
    return namespace


def _sglang_stat_dump(path: Path) -> None:
    """What rank 0 writes in stat mode after RECORDED passes into a BUFFER-step circular buffer, on the trivial map:
    `_StatAccumulator`'s buffer, conversion and dump dict, run from SGLang's source."""
    pieces = _recorder_pieces()
    num_slots = EXPERTS + GPUS
    buffer = pieces["_CircularBuffer"]((LAYERS, num_slots), BUFFER, dtype=torch.int32, device="cpu")
    rng = np.random.default_rng(0)
    popularity = rng.lognormal(0.0, 1.0, size=(LAYERS - DENSE, num_slots))
    for _ in range(RECORDED):
        count = np.zeros((LAYERS, num_slots), dtype=np.int32)
        count[DENSE:] = rng.poisson(popularity * 4)  # the dense layers select no expert
        buffer.append(torch.from_numpy(count))
    trivial = torch.arange(num_slots).repeat(LAYERS, 1) % EXPERTS  # `init_trivial`'s map
    logical = pieces["_convert_global_physical_count_to_logical_count"](
        buffer.get_all(), num_layers=LAYERS, num_logical_experts=EXPERTS, physical_to_logical_map=trivial)
    torch.save({"rank": 0, "logical_count": logical, "average_utilization_rate_over_window": None}, path)


def _sglang_loader(monkeypatch, init_expert_location: Path):
    """SGLang's `expert_location` module, run from its source with the server's settings for DeepSeek-V3 on EP32."""
    assert "num_layers=config.num_hidden_layers" in _source("models", "deepseek_v2.py").read_text()
    moe = types.SimpleNamespace(init_expert_location=str(init_expert_location),
                                ep_num_redundant_experts=GPUS * SLOTS - EXPERTS, ep_join_mode="none",
                                ep_dispatch_algorithm="static", moe_a2a_backend="deepep")
    parallel = types.SimpleNamespace(ep_size=GPUS, tp_size=GPUS, nnodes=GPUS // 8, elastic_ep_initial_size=None)
    context = types.ModuleType("sglang.srt.runtime_context")
    context.get_device = lambda: types.SimpleNamespace(device="cpu")
    context.get_exec = lambda: types.SimpleNamespace(moe=moe)
    context.get_parallel = lambda: parallel
    context.get_resources = lambda: types.SimpleNamespace(expert_location_metadata=None)
    elastic = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
    elastic.elastic_expanded_world_enabled = lambda: False
    loader = types.ModuleType("sglang.srt.model_loader")
    for name in ("sglang", "sglang.srt", "sglang.srt.eplb", "sglang.srt.elastic_ep"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    for module in (context, elastic, loader):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    spec = importlib.util.spec_from_file_location("sglang.srt.eplb.expert_location",
                                                  _source("eplb", "expert_location.py"))
    expert_location = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, expert_location)
    spec.loader.exec_module(expert_location)

    class DeepseekV3ForCausalLM:  # deepseek_v2.py's classmethod, as the source checked above holds it
        @classmethod
        def get_model_config_for_expert_location(cls, config):
            return expert_location.ModelConfigForExpertLocation(
                num_layers=config.num_hidden_layers, num_logical_experts=config.n_routed_experts,
                num_groups=config.n_group)

    loader.get_model_architecture = lambda model_config: (DeepseekV3ForCausalLM, "DeepseekV3ForCausalLM")
    return expert_location


MODEL_CONFIG = types.SimpleNamespace(hf_config=types.SimpleNamespace(num_hidden_layers=LAYERS,
                                                                     n_routed_experts=EXPERTS, n_group=GROUPS))


def test_a_deepseek_v3_dump_placed_loads_in_sglang_with_61_aligned_rows_and_every_expert_placed(
        run_eplb, monkeypatch, tmp_path):
    _sglang_stat_dump(tmp_path / "dump.pt")
    out, sglang = tmp_path / "placement.json", tmp_path / "sglang.json"
    result = run_eplb("place", "--trace", tmp_path / "dump.pt", "--gpus", GPUS, "--slots-per-gpu", SLOTS,
                      "--out", out, "--sglang-out", sglang, "--json")
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and f"dropped {BUFFER - RECORDED} of {BUFFER} steps with no token" in warning[0]
    assert json.loads(result.stdout)["steps"] == RECORDED

    metadata = _sglang_loader(monkeypatch, sglang).compute_initial_expert_location_metadata(MODEL_CONFIG, 0)
    placed = np.asarray(json.loads(out.read_text())["physical_to_logical_map"])
    served = metadata.physical_to_logical_map_cpu.numpy()
    assert metadata.num_layers == LAYERS and metadata.num_physical_experts == GPUS * SLOTS
    np.testing.assert_array_equal(served[DENSE:], placed)  # model layer 3 + l serves trace layer l
    np.testing.assert_array_equal(served[:DENSE], np.tile(np.arange(GPUS * SLOTS) % EXPERTS, (DENSE, 1)))
    assert (metadata.logical_to_all_physical_map_num_valid >= 1).all()
    assert (metadata.logical_to_rank_dispatch_physical_map >= 0).all()  # SGLang asserts this for every rank


def test_sglang_s_loader_takes_a_58_row_map_without_a_word(monkeypatch, tmp_path):
    """Why `eplb place` refuses a map short of the model's layers: SGLang loads it, and its layers 58-60 index
    past the end (`ExpertLocationDispatchInfo.init_new(layer_id)`)."""
    rows = (np.arange(GPUS * SLOTS) % EXPERTS)[None].repeat(LAYERS - DENSE, axis=0)
    (tmp_path / "short.json").write_text(json.dumps({"physical_to_logical_map": rows.tolist()}))
    metadata = _sglang_loader(monkeypatch, tmp_path / "short.json").compute_initial_expert_location_metadata(
        MODEL_CONFIG, 0)
    assert metadata.num_layers == LAYERS - DENSE
    dispatch = _source("eplb", "expert_location_dispatch.py").read_text()
    assert "logical_to_all_physical_map[\n                layer_id, :" in dispatch
