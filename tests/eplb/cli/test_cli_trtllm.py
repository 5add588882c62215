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
WRITERS = ("exclusive", "inclusive")  # TensorRT-LLM's writer versions (tests/conftest.py, TRTLLM_WRITERS)


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


@pytest.fixture(scope="module")
def ep32_dump(tmp_path_factory, record_trtllm_dump):
    """What each writer version leaves after a DeepSeek-R1-shaped run recorded at EP32 (32 rank files, 256 experts,
    top-8) with EXPERT_STATISTIC_ITER_RANGE=2-5, three MoE layers (3-5) for speed: {writer: folder}."""
    ids = np.random.default_rng(7).zipf(1.6, size=(32, 7, len(LAYER_IDS), 4, 8)) % 256
    return {writer: record_trtllm_dump(tmp_path_factory.mktemp(writer) / "expert_statistic", ids, LAYER_IDS, "2-5",
                                       256, writer) for writer in WRITERS}


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("gpus, slots", [(36, 8), (32, 9)], ids=["ep36x8", "ep32x9"])
def test_the_docs_command_on_either_writers_dump_gives_a_yaml_tensorrt_llm_accepts(run_eplb, ep32_dump, tmp_path,
                                                                                  tensorrt_llm_accepts, writer, gpus,
                                                                                  slots):
    """eplb/engines/trtllm/README.md's step 2, run literally in the dump's folder: EP36 needs no whole 8-GPU nodes
    (its nodes are GB200 trays of 4); the file passes TensorRT-LLM's checks at the ep_size it names."""
    shutil.copytree(ep32_dump[writer], tmp_path / "expert_statistic")
    result = run_eplb("place", "--trace", "./expert_statistic", "--gpus", gpus, "--slots-per-gpu", slots, "--out",
                      "placement.json", "--trtllm-out", "moe_load_balancer.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "moe_load_balancer.yaml").read_text()
    assert text.startswith(f"# TensorRT-LLM MoeLoadBalancerConfig written by eplb: serve with ep_size {gpus} ")
    tensorrt_llm_accepts(yaml.safe_load(text), ep_size=gpus, num_experts=256, layer_ids=LAYER_IDS)
    assert json.loads((tmp_path / "placement.json").read_text())["gpus_per_node"] == (4 if gpus == 36 else 8)


def test_a_group_that_fills_no_whole_node_places_without_node_limits_and_refuses_them(run_eplb_here, one_line_error,
                                                                                      small_trace, tmp_path):
    out = tmp_path / "p.json"
    result = run_eplb_here("place", "--trace", small_trace, "--gpus", "12", "--slots-per-gpu", "3", "--out", out)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["gpus_per_node"] == 12  # one node: no node structure known or used
    one_line_error(run_eplb_here("place", "--trace", small_trace, "--gpus", "12", "--slots-per-gpu", "3", "--groups",
                                 "4", "--out", tmp_path / "q.json"),
                   "--groups places expert groups on nodes, and --gpus=12 does not fill whole 8-GPU nodes; give "
                   "--gpus-per-node")
    assert not (tmp_path / "q.json").exists()


@pytest.mark.parametrize("writer", WRITERS)
def test_mtp_layers_get_their_key_from_a_stand_in_stated_in_the_file(run_eplb_here, ep32_dump, tmp_path,
                                                                     tensorrt_llm_accepts, writer):
    """TensorRT-LLM serving with MTP looks up layer_idx 61 (DeepSeek-V3); a dump recorded without MTP holds no
    statistics of it, so it holds the last layer's placement, and the file says so."""
    yaml_out = tmp_path / "moe_load_balancer.yaml"
    result = run_eplb_here("place", "--trace", ep32_dump[writer], "--gpus", "36", "--slots-per-gpu", "8", "--out",
                           tmp_path / "p.json", "--trtllm-out", yaml_out, "--trtllm-mtp-layers", "61", "--json")
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["trtllm_mtp_layers"] == [61] and reply["trtllm_mtp_stand_ins"] == {"61": 5}
    text = yaml_out.read_text()
    assert "# MTP layer 61: a stand-in, layer 5's placement (the trace holds no statistics of layer 61" in text
    data = yaml.safe_load(text)
    tensorrt_llm_accepts(data, ep_size=36, num_experts=256, layer_ids=(*LAYER_IDS, 61))
    assert data["initial_global_assignments"][61] == data["initial_global_assignments"][5]


def test_an_mtp_layer_the_dump_recorded_keeps_its_own_placement(run_eplb_here, record_trtllm_dump, tmp_path,
                                                                tensorrt_llm_accepts):
    ids = np.random.default_rng(8).integers(0, 16, size=(2, 4, 3, 6, 2))
    dump = record_trtllm_dump(tmp_path / "d", ids, (3, 4, 61), "1-3", 16)
    yaml_out = tmp_path / "m.yaml"
    result = run_eplb_here("place", "--trace", dump, *CLUSTER, "--out", tmp_path / "p.json", "--trtllm-out", yaml_out,
                           "--trtllm-mtp-layers", "61", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trtllm_mtp_stand_ins"] == {}
    assert "# MTP layer 61: fitted on its own statistics in the trace" in yaml_out.read_text()
    tensorrt_llm_accepts(yaml.safe_load(yaml_out.read_text()), ep_size=4, num_experts=16, layer_ids=(3, 4, 61))


@pytest.mark.parametrize(("flags", "expected"), [
    ("--trtllm-mtp-layers 61", "--trtllm-mtp-layers applies only with --trtllm-out"),
    ("--trtllm-out {dir}/m.yaml --trtllm-mtp-layers 2", "--trtllm-mtp-layers names layer 2, which is neither a layer"),
], ids=["without-trtllm-out", "inside-the-decoder-layers"])
def test_mtp_layer_ids_that_cannot_be_served_are_refused_in_one_line(run_eplb_here, one_line_error, ep32_dump,
                                                                     tmp_path, flags, expected):
    args = flags.format(dir=tmp_path).split()
    one_line_error(run_eplb_here("place", "--trace", ep32_dump["exclusive"], "--gpus", "36", "--slots-per-gpu", "8",
                                 "--out", tmp_path / "p.json", *args), expected)
    assert not (tmp_path / "p.json").exists()


def test_a_refit_for_the_cluster_now_serving_takes_its_node_size(run_eplb_here, ep32_dump, tmp_path):
    """--current names the placement serving at EP36 on GB200 trays: a refit without --trtllm-out keeps its nodes."""
    served, refit = tmp_path / "served.json", tmp_path / "refit.json"
    assert run_eplb_here("place", "--trace", ep32_dump["exclusive"], "--gpus", "36", "--slots-per-gpu", "8", "--out",
                         served, "--trtllm-out", tmp_path / "m.yaml", "--quiet").returncode == 0
    result = run_eplb_here("place", "--trace", ep32_dump["inclusive"], "--gpus", "36", "--slots-per-gpu", "8",
                           "--out", refit, "--current", served, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(refit.read_text())["gpus_per_node"] == 4 and "experts_moved" in json.loads(result.stdout)
