"""TensorRT-LLM end to end: `eplb place --trace <dump> --trtllm-out` writes a moe_load_balancer.yaml TensorRT-LLM
accepts, keyed by the dump's layer ids and holding the placement's map; `eplb score` on the dump prints the figure
report_load_statistics.py prints, as recorded and with the placement; every mismatch of layer ids, and a file of
another kind in the way, is refused in one line before any work."""

import json
import shutil

import numpy as np
import pytest
import yaml

LAYER_IDS = (3, 4, 5)
CLUSTER = ("--gpus", "4", "--slots-per-gpu", "5")


@pytest.fixture()
def dump(tmp_path, write_trtllm_dump):
    counts_RTLE = np.random.default_rng(3).integers(0, 50, size=(4, 10, len(LAYER_IDS), 16))
    counts_RTLE[:, :, 0, 5] *= 6  # one hot expert
    return write_trtllm_dump(tmp_path / "expert_statistic", counts_RTLE, LAYER_IDS, first_iteration=50, top_k=4)


def test_place_on_a_dump_writes_a_yaml_tensorrt_llm_accepts_keyed_by_the_dump_layers(run_eplb, dump, tmp_path,
                                                                                     tensorrt_llm_accepts):
    out, yaml_out = tmp_path / "placement.json", tmp_path / "moe_load_balancer.yaml"
    result = run_eplb("place", "--trace", dump, *CLUSTER, "--out", out, "--trtllm-out", yaml_out, "--json")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(yaml_out.read_text())
    tensorrt_llm_accepts(data, ep_size=4, num_experts=16, layer_ids=LAYER_IDS)
    placement = json.loads(out.read_text())
    assert [data["initial_global_assignments"][layer] for layer in LAYER_IDS] == placement["physical_to_logical_map"]
    reply = json.loads(result.stdout)
    assert reply["trtllm_out"] == str(yaml_out) and reply["trtllm_layers"] == list(LAYER_IDS)
    assert reply["trtllm_imbalance_ratio"] == pytest.approx(reply["imbalance_mean"] - 1, rel=1e-12)


def test_score_on_a_dump_prints_report_load_statistics_figures(run_eplb_here, dump, tmp_path, report_load_statistics):
    out, yaml_out = tmp_path / "placement.json", tmp_path / "moe_load_balancer.yaml"
    assert run_eplb_here("place", "--trace", dump, *CLUSTER, "--out", out, "--trtllm-out", yaml_out,
                         "--quiet").returncode == 0
    reply = json.loads(run_eplb_here("score", "--placement", out, "--trace", dump, "--json").stdout)
    projection = yaml.safe_load(yaml_out.read_text() + "ep_size: 4\n")
    assert reply["trtllm_recorded_ranks"] == 4
    assert reply["trtllm_recorded_imbalance_ratio"] == pytest.approx(report_load_statistics(dump), rel=1e-5)
    assert reply["trtllm_imbalance_ratio"] == pytest.approx(report_load_statistics(dump, projection), rel=1e-5)
    table = run_eplb_here("score", "--placement", out, "--trace", dump).stdout
    assert f"as recorded (4 rank files): {reply['trtllm_recorded_imbalance_ratio']:.4f}" in table
    assert f"(--projection_eplb_config_path, ep_size 4): {reply['trtllm_imbalance_ratio']:.4f}" in table


def test_score_on_another_trace_prints_no_tensorrt_llm_figure(run_eplb_here, small_trace, small_placement):
    result = run_eplb_here("score", "--placement", small_placement, "--trace", small_trace, "--json")
    assert result.returncode == 0 and not any(key.startswith("trtllm") for key in json.loads(result.stdout))


def test_another_trace_takes_its_layer_ids_from_trtllm_layers(run_eplb_here, small_trace, tmp_path,
                                                             tensorrt_llm_accepts):
    yaml_out = tmp_path / "moe.yaml"
    result = run_eplb_here("place", "--trace", small_trace, "--gpus", "8", "--slots-per-gpu", "5", "--out",
                           tmp_path / "p.json", "--trtllm-out", yaml_out, "--trtllm-layers", "1,3,5", "--quiet")
    assert result.returncode == 0, result.stderr
    tensorrt_llm_accepts(yaml.safe_load(yaml_out.read_text()), ep_size=8, num_experts=32, layer_ids=(1, 3, 5))


REFUSED = [
    ("no-layer-ids-for-a-plain-trace", "--trace {small} {cluster8} --trtllm-out {dir}/m.yaml",
     "--trtllm-out needs --trtllm-layers"),
    ("layer-count-off", "--trace {small} {cluster8} --trtllm-out {dir}/m.yaml --trtllm-layers 3-4",
     "--trtllm-layers 3-4 names 2 layers but the trace has 3"),
    ("layers-other-than-the-dump-s", "--trace {dump} {cluster} --trtllm-out {dir}/m.yaml --trtllm-layers 0-2",
     "differs from the layers the TensorRT-LLM dump"),
    ("layer-ids-without-trtllm-out", "--trace {dump} {cluster} --trtllm-layers 3-5",
     "--trtllm-layers applies only with --trtllm-out"),
    ("layer-range-backwards", "--trace {dump} {cluster} --trtllm-out {dir}/m.yaml --trtllm-layers 5-3",
     "argument --trtllm-layers: range 5-3 runs backwards"),
    ("yaml-over-another-kind-of-file", "--trace {dump} {cluster} --trtllm-out {dir}/README.md",
     "exists and is not a TensorRT-LLM load-balancer YAML file"),
    ("yaml-over-the-placement-output", "--trace {dump} {cluster} --trtllm-out {dir}/out.json",
     "name the same file"),
    ("dump-that-recorded-nothing", "--trace {empty_dump} {cluster}", "recorded no iteration"),
    ("dump-keys-named-as-in-the-dump", "--trace {bad_meta} {cluster}", 'expected {"num_experts": E'),
]


@pytest.mark.parametrize(("template", "expected"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_layer_id_mismatches_and_files_in_the_way_are_refused_in_one_line(run_eplb_here, one_line_error, dump,
                                                                          small_trace, tmp_path, template, expected):
    (tmp_path / "README.md").write_text("# not a YAML of TensorRT-LLM's\n")
    empty_dump = tmp_path / "empty"
    empty_dump.mkdir()
    (empty_dump / "meta_info.json").write_text("null")
    bad_meta = tmp_path / "bad_meta"
    shutil.copytree(dump, bad_meta)
    (bad_meta / "meta_info.json").write_text("{}")
    args = template.format(small=small_trace, dump=dump, empty_dump=empty_dump, bad_meta=bad_meta, dir=tmp_path,
                           cluster=" ".join(CLUSTER), cluster8="--gpus 8 --slots-per-gpu 5").split()
    one_line_error(run_eplb_here("place", *args, "--out", tmp_path / "out.json"), expected)
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "m.yaml").exists()
    assert (tmp_path / "README.md").read_text() == "# not a YAML of TensorRT-LLM's\n"


def test_trtllm_out_replaces_a_yaml_of_its_own_kind(run_eplb_here, dump, tmp_path):
    yaml_out = tmp_path / "moe_load_balancer.yaml"
    yaml_out.write_text("num_slots: 20\nlayer_updates_per_iter: 2\n")  # an online-balancer file
    result = run_eplb_here("place", "--trace", dump, *CLUSTER, "--out", tmp_path / "p.json", "--trtllm-out", yaml_out)
    assert result.returncode == 0, result.stderr
    assert set(yaml.safe_load(yaml_out.read_text())["initial_global_assignments"]) == set(LAYER_IDS)
