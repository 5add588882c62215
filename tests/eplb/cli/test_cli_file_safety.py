"""No `eplb` command destroys an input or leaves a partial output: outputs that name an input or each other, and
outputs that are not regular files, are refused before any work; links are written through; a command that fails
leaves no file behind. The inputs of `eplb sim` include every file its config names.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

SMALL_CLUSTER = ("--gpus", "8", "--slots-per-gpu", "5")
SMALL_SYNTH = ("--steps", "60", "--layers", "3", "--experts", "32", "--top-k", "4", "--tokens-per-step", "256")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def inputs(tmp_path, small_trace, small_placement) -> dict:
    """Copies of the small trace and placement in a fresh folder, so each test may see them destroyed."""
    trace = Path(shutil.copy(small_trace, tmp_path / "t.npz"))
    placement = Path(shutil.copy(small_placement, tmp_path / "p.json"))
    os.symlink(trace, tmp_path / "link_to_trace.npz")
    os.link(placement, tmp_path / "hardlink_to_placement.json")
    return {"dir": tmp_path, "trace": trace, "placement": placement}


CONFLICTS = [
    ("place-out-is-trace", "place --trace {trace} {cluster} --out {trace}", "--out {trace} is the input --trace"),
    ("place-plot-is-trace", "place --trace {trace} {cluster} --out {dir}/o.json --plot {trace}",
     "--plot {trace} is the input --trace"),
    ("place-sglang-out-is-trace", "place --trace {trace} {cluster} --out {dir}/o.json --sglang-out {trace}",
     "--sglang-out {trace} is the input --trace"),
    ("place-out-is-current", "place --trace {trace} {cluster} --current {placement} --out {placement}",
     "is the input --current"),
    ("score-plot-is-placement", "score --placement {placement} --trace {trace} --plot {placement}",
     "is the input --placement"),
    ("replay-plot-is-trace", "replay --trace {trace} {cluster} --every 10 --window 10 --plot {trace}",
     "is the input --trace"),
    ("synth-out-and-plot-coincide", "synth --out {dir}/s.npz --plot {dir}/s.npz --steps 5",
     "--out {dir}/s.npz and --plot {dir}/s.npz name the same file"),
    ("place-out-and-plot-coincide", "place --trace {trace} {cluster} --out {dir}/o.json --plot {dir}/o.json",
     "name the same file"),
    ("out-through-a-symlink-to-the-trace", "place --trace {trace} {cluster} --out {dir}/link_to_trace.npz",
     "is the input --trace"),
    ("plot-is-a-hard-link-to-the-placement", "score --placement {placement} --trace {trace} "
     "--plot {dir}/hardlink_to_placement.json", "is the input --placement"),
    ("plot-out-dir-holds-the-trace", "plot --trace {dir}/load_heatmap.png --out-dir {dir}",
     "is the input --trace"),
    ("out-is-a-directory", "place --trace {trace} {cluster} --out {dir}", "is a directory"),
    ("out-is-a-fifo", "place --trace {trace} {cluster} --out {dir}/fifo", "not a regular file"),
]


@pytest.mark.parametrize(("template", "expected"), [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS])
def test_output_naming_an_input_or_another_output_is_refused_and_every_file_kept(run_eplb_here, one_line_error,
                                                                                  inputs, template, expected):
    folder = inputs["dir"]
    os.mkfifo(folder / "fifo")
    (folder / "load_heatmap.png").write_bytes((folder / "t.npz").read_bytes())
    names = {k: str(v) for k, v in inputs.items()}
    before = {p.name: digest(p) for p in folder.iterdir() if p.is_file() and not p.is_fifo()}
    args = template.format(cluster=" ".join(SMALL_CLUSTER), **names).split()
    one_line_error(run_eplb_here(*args), expected.format(**names))
    after = {p.name: digest(p) for p in folder.iterdir() if p.is_file() and not p.is_fifo()}
    assert after == before
    assert (folder / "fifo").is_fifo() and (folder / "link_to_trace.npz").is_symlink()


def test_output_through_a_symlink_writes_its_target_and_keeps_the_link(run_eplb, inputs):
    folder = inputs["dir"]
    real = folder / "real.json"
    real.write_text('{"physical_to_logical_map": [[0]]}\n')  # an earlier placement: an output replaces its own kind
    os.symlink(real, folder / "link.json")
    result = run_eplb("place", "--trace", inputs["trace"], *SMALL_CLUSTER, "--out", folder / "link.json", "--quiet")
    assert result.returncode == 0, result.stderr
    assert (folder / "link.json").is_symlink()
    assert '"physical_to_logical_map"' in real.read_text()


def test_output_keeps_the_mode_of_the_file_it_replaces(run_eplb, inputs):
    out = inputs["dir"] / "o.json"
    out.write_text('{"physical_to_logical_map": [[0]]}\n')  # an earlier placement: an output replaces its own kind
    os.chmod(out, 0o640)
    result = run_eplb("place", "--trace", inputs["trace"], *SMALL_CLUSTER, "--out", out, "--quiet")
    assert result.returncode == 0, result.stderr
    assert out.stat().st_mode & 0o777 == 0o640


def test_plot_with_a_placement_for_another_model_writes_no_figure(run_eplb, one_line_error, tmp_path, small_placement):
    other = tmp_path / "other.npz"
    assert run_eplb("synth", "--out", other, "--steps", "5", "--layers", "2", "--experts", "16", "--top-k", "2",
                    "--quiet").returncode == 0
    result = run_eplb("plot", "--trace", other, "--placement", small_placement, "--out-dir", tmp_path / "figs")
    one_line_error(result, "the placement is for 3 layers x 32 experts")
    assert not (tmp_path / "figs").exists() or list((tmp_path / "figs").iterdir()) == []


def test_synth_whose_plot_cannot_be_written_leaves_no_trace(run_eplb, one_line_error, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = run_eplb("synth", "--out", tmp_path / "t.npz", *SMALL_SYNTH, "--plot", blocker / "heat.png")
    one_line_error(result, "is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.fixture()
def sim_inputs(tmp_path, small_trace) -> dict:
    """A request trace, a routing trace of a 32-expert model and a config naming both (relative to it), in a fresh
    folder beside an empty output folder."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps({"timestamp": 400 * i, "input_length": 600, "output_length": 20,
                                            "hash_ids": [1, 2]}) + "\n" for i in range(3)))
    routing = Path(shutil.copy(small_trace, tmp_path / "routing.npz"))
    config = tmp_path / "c.yaml"
    config.write_text("duration_s: 2\nworkload: {trace: requests.jsonl}\nmodel: {num_routed_experts: 32}\n"
                      "cluster: {prefill_nodes: 1, decode_cards: 8}\n"
                      "balance: {routing_trace: routing.npz, policy: none}\n")
    (tmp_path / "out").mkdir()
    return {"dir": tmp_path, "config": config, "workload.trace": requests, "balance.routing_trace": routing}


SIM_CONFLICTS = [  # (id, output file in --out-dir, input it is made a link to, symbolic or hard)
    ("report-links-to-the-request-trace", "report.json", "workload.trace", "symbolic"),
    ("report-is-a-hard-link-to-the-request-trace", "report.json", "workload.trace", "hard"),
    ("timeline-links-to-the-routing-trace", "sim_timeline.png", "balance.routing_trace", "symbolic"),
    ("report-is-a-hard-link-to-the-routing-trace", "report.json", "balance.routing_trace", "hard"),
]


@pytest.mark.parametrize(("name", "key", "link"), [c[1:] for c in SIM_CONFLICTS], ids=[c[0] for c in SIM_CONFLICTS])
def test_sim_output_linked_to_a_file_its_config_names_is_refused_and_the_file_kept(run_eplb_here, one_line_error,
                                                                                    sim_inputs, name, key, link):
    output = sim_inputs["dir"] / "out" / name
    if link == "symbolic":
        os.symlink(sim_inputs[key], output)
    else:
        os.link(sim_inputs[key], output)
    before = {p.name: digest(p) for p in sim_inputs["dir"].iterdir() if p.is_file()}
    result = run_eplb_here("sim", "--config", sim_inputs["config"], "--out-dir", sim_inputs["dir"] / "out", "--quiet")
    one_line_error(result, f"is the input {key} (in --config) {sim_inputs[key]}")
    assert {p.name: digest(p) for p in sim_inputs["dir"].iterdir() if p.is_file()} == before
    assert sorted(p.name for p in (sim_inputs["dir"] / "out").iterdir()) == [name]


def test_sim_with_its_outputs_apart_from_its_inputs_runs(run_eplb_here, sim_inputs):
    result = run_eplb_here("sim", "--config", sim_inputs["config"], "--out-dir", sim_inputs["dir"] / "out", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads((sim_inputs["dir"] / "out" / "report.json").read_text())["requests"] == 3


@pytest.fixture()
def trtllm_inputs(tmp_path, write_trtllm_dump, small_trace) -> dict:
    """A TensorRT-LLM dump, a small trace, a simulator model config and a JSON file of another kind, side by side."""
    import numpy as np

    dump = write_trtllm_dump(tmp_path / "dump", np.ones((2, 4, 3, 32), dtype=np.int64), (3, 4, 5))
    model = tmp_path / "model.json"
    model.write_text('{"model": {"num_routed_experts": 32}}\n')
    other = tmp_path / "other.json"
    other.write_text('{"not": "a placement"}\n')
    return {"dir": tmp_path, "dump": dump, "trace": Path(shutil.copy(small_trace, tmp_path / "t.npz")),
            "model": model, "other": other}


SGLANG_LAYERS = "--sglang-num-layers 3 --sglang-first-moe-layer 0"
INPUT_CONFLICTS = [
    ("advise-sglang-out-is-the-model", f"advise --trace {{trace}} --model {{model}} --sglang-out {{model}} "
     f"{SGLANG_LAYERS}", "--sglang-out {model} is the input --model {model}"),
    ("advise-sglang-out-over-other-json", f"advise --trace {{trace}} --sglang-out {{other}} {SGLANG_LAYERS}",
     "--sglang-out {other} exists and is not a placement"),
    ("advise-sglang-out-in-the-dump", "advise --trace {dump} --sglang-out {dump}/meta_info.json "
     "--sglang-num-layers 3 --sglang-first-moe-layer 0", "--sglang-out {dump}/meta_info.json is inside the input "
                                                         "folder --trace {dump}"),
    ("place-trtllm-out-in-the-dump", "place --trace {dump} --gpus 8 --slots-per-gpu 5 --out {dir}/o.json "
     "--trtllm-out {dump}/rank2.safetensors", "--trtllm-out {dump}/rank2.safetensors is inside the input folder"),
    ("place-out-in-the-dump", "place --trace {dump} --gpus 8 --slots-per-gpu 5 --out {dump}/rank2.safetensors",
     "--out {dump}/rank2.safetensors is inside the input folder"),
    ("score-plot-in-the-dump", "score --placement {other} --trace {dump} --plot {dump}/p.png",
     "--plot {dump}/p.png is inside the input folder"),
    ("advise-trace-missing", "advise --trace {dir}/absent.npz", "--trace {dir}/absent.npz not found"),
    ("advise-model-missing", "advise --trace {trace} --model {dir}/absent.yaml", "--model {dir}/absent.yaml not found"),
    ("advise-model-a-directory", "advise --trace {trace} --model {dump}", "--model {dump} is a directory"),
    ("place-plot-unwritable", "place --trace {trace} --gpus 8 --slots-per-gpu 5 --out {dir}/o.json "
     "--plot /proc/self/x.png", "cannot write --plot /proc/self/x.png"),
    ("advise-plot-unwritable", "advise --trace {trace} --plot /proc/self/x.png", "cannot write --plot"),
    ("advise-sglang-out-unwritable", f"advise --trace {{trace}} --sglang-out /proc/self/x.json {SGLANG_LAYERS}",
     "cannot write --sglang-out"),
    ("advise-trtllm-out-unwritable", "advise --trace {trace} --trtllm-out /proc/self/x.yaml --trtllm-layers 3-5",
     "cannot write --trtllm-out"),
    ("synth-out-unwritable", "synth --out /proc/self/t.npz --steps 5", "cannot write --out"),
    ("synth-request-trace-missing", "synth --out {dir}/s.npz --requests decode --request-trace {dir}/absent.jsonl",
     "--request-trace {dir}/absent.jsonl not found"),
]


@pytest.mark.parametrize(("template", "expected"), [c[1:] for c in INPUT_CONFLICTS],
                         ids=[c[0] for c in INPUT_CONFLICTS])
def test_no_command_writes_over_or_into_an_input_and_every_output_is_checked_first(run_eplb_here, one_line_error,
                                                                                   trtllm_inputs, template, expected):
    folder = trtllm_inputs["dir"]
    names = {k: str(v) for k, v in trtllm_inputs.items()}
    before = {p: digest(p) for p in folder.rglob("*") if p.is_file()}
    one_line_error(run_eplb_here(*template.format(**names).split()), expected.format(**names))
    assert {p: digest(p) for p in folder.rglob("*") if p.is_file()} == before
