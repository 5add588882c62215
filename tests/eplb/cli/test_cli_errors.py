"""Bad input to the `eplb` command line (its `main`, in this process for the long tables, and the real entry point
in a subprocess for the failed writes): exit status 2, exactly one non-empty line on stderr that names the problem,
no traceback, nothing on stdout, and no placement file written or clobbered.
"""

import json
import os
import signal
import time

import numpy as np
import pytest
import torch

CLUSTER = ("--gpus", "8", "--slots-per-gpu", "5")


@pytest.fixture(scope="module")
def bad(tmp_path_factory, small_trace, small_placement) -> dict:
    """Paths of bad inputs (and of the good 32-expert trace and its placement) for the error table."""
    d = tmp_path_factory.mktemp("bad")
    np.savez(d / "trace16.npz", counts=np.ones((10, 3, 16), dtype=np.int64))
    np.save(d / "rank2.npy", np.ones((10, 32), dtype=np.int64))
    negative = np.ones((10, 3, 32), dtype=np.int64)
    negative[4, 1, 7] = -5
    np.save(d / "negative.npy", negative)
    nan = np.ones((10, 3, 32), dtype=np.float64)
    nan[2, 0, 3] = np.nan
    np.save(d / "nan.npy", nan)
    np.savez(d / "topk.npz", chat_topk_ids=np.random.default_rng(0).integers(0, 32, size=(3, 64, 4)))
    (d / "trace.csv").write_text("1,2,3\n")
    (d / "not_json.json").write_text("{not json")
    (d / "missing_keys.json").write_text(json.dumps({"schema_version": 1, "num_layers": 3}))
    good = json.loads(small_placement.read_text())
    (d / "info_not_dict.json").write_text(json.dumps({**good, "info": 5}))
    (d / "experts_null.json").write_text(json.dumps({**good, "num_logical_experts": None}))
    torch.save({"logical_count": "many"}, d / "string.pt")
    for name, key, value in [("id_fraction", "physical_to_logical_map", 15.7),
                             ("id_string", "physical_to_logical_map", "15"),
                             ("id_huge", "physical_to_logical_map", 2**70),
                             ("id_bool", "physical_to_logical_map", True),
                             ("weight_string", "replica_weights", "0.5")]:
        rows = [list(row) for row in good[key]]
        rows[0][3] = value
        (d / f"{name}.json").write_text(json.dumps({**good, key: rows}))
    ragged = [row[:-1] for row in good["replica_weights"]]
    (d / "ragged.json").write_text(json.dumps({**good, "replica_weights": ragged}))
    (d / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    return {"dir": d, "trace": small_trace, "placement": small_placement}


ERRORS = [
    ("missing-trace", "place --trace {dir}/absent.npz {cluster} --out {dir}/o.json", "not found"),
    ("missing-placement", "score --placement {dir}/absent.json --trace {trace}", "not found"),
    ("trace-npy-of-rank-2", "place --trace {dir}/rank2.npy {cluster} --out {dir}/o.json", "3-D"),
    ("negative-counts", "place --trace {dir}/negative.npy {cluster} --out {dir}/o.json", "negative"),
    ("nan-counts", "score --placement {placement} --trace {dir}/nan.npy", "NaN"),
    ("placement-for-another-model", "score --placement {placement} --trace {dir}/trace16.npz", "32 experts"),
    ("fewer-slots-than-experts", "place --trace {trace} --gpus 2 --slots-per-gpu 3 --out {dir}/o.json",
     "cannot hold 32 experts"),
    ("not-whole-nodes", "place --trace {trace} --gpus 12 --gpus-per-node 8 --slots-per-gpu 5 --out {dir}/o.json",
     "error: --gpus=12 does not fill whole nodes of --gpus-per-node=8; use --gpus=16"),
    ("placement-not-json", "score --placement {dir}/not_json.json --trace {trace}", "not valid JSON"),
    ("placement-missing-keys", "score --placement {dir}/missing_keys.json --trace {trace}", "missing keys"),
    ("window-not-below-steps", "replay --trace {trace} {cluster} --every 10 --window 60",
     "--window=60 and --lag=0 leave no step to score in a trace of 60 steps"),
    ("lag-leaves-no-step", "replay --trace {trace} {cluster} --every 10 --window 50 --lag 10",
     "--window=50 and --lag=10 leave no step to score"),
    ("lag-negative", "replay --trace {trace} {cluster} --every 10 --window 50 --lag -1", "argument --lag"),
    ("every-zero", "replay --trace {trace} {cluster} --every 0 --window 10", "--every"),
    ("drift-ratio-not-above-one", "replay --trace {trace} {cluster} --every 10 --window 10 --refit-on-drift 0.9",
     "--refit-on-drift"),
    ("patch-lag-negative", "replay --trace {trace} {cluster} --every 10 --window 10 --patch-lag -1",
     "argument --patch-lag"),
    ("burst-factor-below-one", "score --placement {placement} --trace {trace} --burst-factor 0.5",
     "argument --burst-factor"),
    ("unknown-policy", "place --trace {trace} {cluster} --policy nosuch --out {dir}/o.json", "invalid choice"),
    ("unknown-policy-replay", "replay --trace {trace} {cluster} --policy nosuch --every 10 --window 10",
     "invalid choice"),
    ("topk-log-without-tokens-per-step", "place --trace {dir}/topk.npz {cluster} --out {dir}/o.json",
     "--tokens-per-step"),
    ("topk-log-unknown-task",
     "place --trace {dir}/topk.npz --tokens-per-step 8 --task law {cluster} --out {dir}/o.json", "no task"),
    ("unknown-trace-suffix", "place --trace {dir}/trace.csv {cluster} --out {dir}/o.json", "unknown trace format"),
    ("unknown-subcommand", "frobnicate", "invalid choice"),
    ("no-subcommand", "", "required"),
    ("missing-required-flag", "place --trace {trace} --gpus 8 --out {dir}/o.json", "--slots-per-gpu"),
    ("non-integer-flag", "place --trace {trace} --gpus eight --slots-per-gpu 5 --out {dir}/o.json",
     "argument --gpus: expected a number >= 1"),
    ("steps-reversed", "place --trace {trace} {cluster} --steps 5:2 --out {dir}/o.json", "--steps 5:2 selects no step"),
    ("steps-malformed", "place --trace {trace} {cluster} --steps five --out {dir}/o.json", "START:STOP"),
    ("steps-beyond-trace", "score --placement {placement} --trace {trace} --steps 0:999", "60 steps"),
    ("synth-top-k-above-experts", "synth --out {dir}/s.npz --experts 8 --top-k 9 --steps 5", "error: --top-k=9"),
    ("synth-skew-with-zipf", "synth --out {dir}/s.npz --steps 5 --popularity zipf --skew 1.2",
     "--skew does not apply to --popularity zipf; use --zipf-exponent"),
    ("synth-zipf-exponent-with-lognormal", "synth --out {dir}/s.npz --steps 5 --zipf-exponent 1.2",
     "--zipf-exponent does not apply to --popularity lognormal"),
    ("synth-absurd-size", "synth --out {dir}/s.npz --steps 10000000 --layers 61", "exceeds the limit"),
    ("gpus-absurd", "place --trace {trace} --gpus 100000 --slots-per-gpu 5 --out {dir}/o.json",
     "argument --gpus: must be >= 1 and <= 1024; got 100000"),
    ("slots-absurd", "place --trace {trace} --gpus 1024 --slots-per-gpu 100 --out {dir}/o.json",
     "= 102400 slots exceeds the limit of 16384"),
    ("refit-on-drift-infinite", "replay --trace {trace} {cluster} --every 10 --window 10 --refit-on-drift inf",
     "argument --refit-on-drift: must be > 1; got inf"),
    ("refit-on-drift-nan", "replay --trace {trace} {cluster} --every 10 --window 10 --refit-on-drift nan",
     "argument --refit-on-drift"),
    ("time-limit-zero", "place --trace {trace} {cluster} --policy cpsat --time-limit 0 --out {dir}/o.json",
     "argument --time-limit: must be > 0"),
    ("task-twice", "place --trace {dir}/topk.npz --tokens-per-step 8 --task chat,chat {cluster} --out {dir}/o.json",
     "--task='chat,chat' names chat more than once"),
    ("task-empty", "place --trace {dir}/topk.npz --tokens-per-step 8 --task= {cluster} --out {dir}/o.json",
     "--task='' holds an empty name"),
    ("tokens-per-step-on-counts", "place --trace {trace} --tokens-per-step 256 {cluster} --out {dir}/o.json",
     "--tokens-per-step=256: only top-k id logs"),
    ("num-experts-on-counts", "score --placement {placement} --trace {trace} --num-experts 32",
     "--num-experts=32: only top-k id logs"),
    ("topk-ids-beyond-num-experts",
     "place --trace {dir}/topk.npz --tokens-per-step 8 --num-experts 16 {cluster} --out {dir}/o.json",
     "top-k ids reach"),
    ("pt-logical-count-a-string", "place --trace {dir}/string.pt {cluster} --out {dir}/o.json",
     "logical_count must be a tensor"),
    ("placement-expert-id-fractional", "score --placement {dir}/id_fraction.json --trace {trace}",
     "physical_to_logical_map layer 0 holds 15.7; expected expert ids"),
    ("placement-expert-id-string", "score --placement {dir}/id_string.json --trace {trace}",
     "physical_to_logical_map layer 0 holds '15'; expected expert ids"),
    ("placement-expert-id-huge", "score --placement {dir}/id_huge.json --trace {trace}",
     "physical_to_logical_map layer 0 holds 1180591620717411303424"),
    ("placement-expert-id-boolean", "score --placement {dir}/id_bool.json --trace {trace}",
     "physical_to_logical_map layer 0 holds True"),
    ("placement-weight-string", "score --placement {dir}/weight_string.json --trace {trace}",
     "replica_weights layer 0 holds '0.5'; expected numbers"),
    ("placement-ragged", "score --placement {dir}/ragged.json --trace {trace}", "expected [3, 40]"),
    ("placement-deeply-nested", "score --placement {dir}/nested.json --trace {trace}", "nests JSON too deeply"),
    ("plot-placement-for-another-model", "plot --trace {dir}/trace16.npz --placement {placement} --out-dir {dir}/pl",
     "32 experts"),
    ("sglang-num-layers-ten-million", "place --trace {trace} {cluster} --out {dir}/o.json --sglang-out {dir}/s.json "
     "--sglang-num-layers 10000004 --sglang-first-moe-layer 10000001", "argument --sglang-num-layers: must be >= 1 "
                                                                       "and <= 1024; got 10000004"),
    ("advise-sglang-num-layers-100004", "advise --trace {trace} --sglang-out {dir}/s.json --sglang-num-layers 100004 "
     "--sglang-first-moe-layer 100001", "--sglang-num-layers 100004 is more decoder layers than a model has"),
    ("trtllm-layers-range-to-1e11", "place --trace {trace} {cluster} --out {dir}/o.json --trtllm-out {dir}/t.yaml "
     "--trtllm-layers 0-100000000000", "layer ids are a model's layers, below 1024; got '0-100000000000'"),
    ("trtllm-layers-a-23-digit-id", "advise --trace {trace} --trtllm-out {dir}/t.yaml "
     "--trtllm-layers 1,2,3,99999999999999999999999", "layer ids are a model's layers, below 1024"),
    ("synth-prefill-a-million-one-token-prompts", "synth --out {dir}/r.npz --requests prefill --tokens-per-step "
     "1000000 --prompt-tokens 1", "--requests prefill would draw about 2e+09 requests' preferences"),
    ("synth-decode-one-token-outputs", "synth --out {dir}/r.npz --requests decode --layers 61 --output-tokens 1",
     "raise --output-tokens"),
    ("synth-prefill-tokens-per-request", "synth --out {dir}/r.npz --requests prefill --tokens-per-request 4",
     "--tokens-per-request applies to --requests decode only"),
    ("synth-prefill-output-tokens", "synth --out {dir}/r.npz --requests prefill --output-tokens 3",
     "--output-tokens applies to --requests decode only"),
    ("synth-decode-prompt-tokens", "synth --out {dir}/r.npz --requests decode --prompt-tokens 5",
     "--prompt-tokens applies to --requests prefill only"),
]


def _args(template: str, bad: dict) -> list[str]:
    return template.format(cluster=" ".join(CLUSTER), **bad).split()


@pytest.mark.parametrize(("template", "expected"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_exits_2_with_one_line_on_stderr(run_eplb_here, one_line_error, bad, template, expected):
    one_line_error(run_eplb_here(*_args(template, bad)), expected)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("score --placement {dir}/info_not_dict.json --trace {trace}", "info",
                     id="placement-info-not-an-object"),
        pytest.param("score --placement {dir}/experts_null.json --trace {trace}", "num_logical_experts",
                     id="placement-num-logical-experts-null"),
        pytest.param("place --trace {trace} {cluster} --groups -1 --out {dir}/o.json", "--groups",
                     id="negative-groups"),
        pytest.param("place --trace {trace} {cluster} --policy trivial --groups 4 --out {dir}/o.json", "--groups",
                     id="groups-with-trivial-policy"),
        pytest.param("place --trace {trace} {cluster} --out {trace}/o.json", "is a file, not a directory",
                     id="out-under-a-file"),
        pytest.param("score --placement {placement} --trace {trace} --task law", "--task",
                     id="task-on-a-counts-trace"),
    ],
)
def test_malformed_placement_values_and_misused_flags_exit_2(run_eplb_here, one_line_error, bad, template,
                                                            expected):
    one_line_error(run_eplb_here(*_args(template, bad)), expected)


# --- a failed `place` writes no placement file and leaves an existing one as it was ---------------------------


@pytest.mark.parametrize(
    "failure",
    [
        ("--trace", "{dir}/absent.npz", *CLUSTER),
        ("--trace", "{trace}", "--gpus", "2", "--slots-per-gpu", "3"),
        ("--trace", "{trace}", "--gpus", "12", "--gpus-per-node", "8", "--slots-per-gpu", "5"),
        ("--trace", "{trace}", *CLUSTER, "--steps", "5:2"),
    ],
    ids=["missing-trace", "fewer-slots-than-experts", "not-whole-nodes", "steps-reversed"],
)
def test_failed_place_leaves_no_out_file(run_eplb, bad, tmp_path, failure):
    args = [a.format(**bad) for a in failure]
    result = run_eplb("place", *args, "--out", tmp_path / "placement.json", "--sglang-out", tmp_path / "s.json",
                      "--sglang-num-layers", "3", "--sglang-first-moe-layer", "0")
    assert result.returncode == 2, result.stderr
    assert list(tmp_path.iterdir()) == [], "a failed place left files (partial, empty or temporary)"


@pytest.mark.parametrize(
    "failure",
    [
        ("--gpus", "2", "--slots-per-gpu", "3"),
        (*CLUSTER, "--plot", "{blocker}/gpu_loads.png"),
        (*CLUSTER, "--sglang-out", "{blocker}/sglang.json", "--sglang-num-layers", "3",
         "--sglang-first-moe-layer", "0"),
    ],
    ids=["fewer-slots-than-experts", "plot-unwritable", "sglang-out-unwritable"],
)
def test_failed_place_leaves_an_existing_out_file_unchanged(run_eplb, small_trace, tmp_path, failure):
    out = tmp_path / "placement.json"
    out.write_text('{"old": true}\n')
    blocker = tmp_path / "a_file"  # a regular file where a directory is needed: writing under it fails
    blocker.write_text("")
    args = [a.format(blocker=blocker) for a in failure]
    result = run_eplb("place", "--trace", small_trace, *args, "--out", out)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert out.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "placement.json"], "temporary files left"


def _plot_interrupted_into_a_value_error(*args, **kwargs):
    """A plot that Ctrl-C cuts into and that turns the interrupt into an error of its own (as matplotlib's
    "Invalid bounding box" did)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        raise ValueError("Invalid bounding box") from None


def _plot_with_a_bug(*args, **kwargs):
    raise ValueError("a library's internal error")


def test_ctrl_c_during_a_plot_exits_130_and_leaves_no_file(run_eplb_here, small_trace, tmp_path, monkeypatch):
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", _plot_interrupted_into_a_value_error)
    result = run_eplb_here("place", "--trace", small_trace, *CLUSTER, "--policy", "deepseek",
                           "--out", tmp_path / "placement.json", "--plot", tmp_path / "loads.png")
    assert result.returncode == 130 and result.stderr == "", result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_value_error_inside_a_library_is_a_bug_with_its_traceback_not_bad_input(run_eplb_here, small_trace,
                                                                                   tmp_path, monkeypatch):
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", _plot_with_a_bug)
    with pytest.raises(ValueError, match="internal error"):
        run_eplb_here("place", "--trace", small_trace, *CLUSTER, "--policy", "deepseek",
                      "--out", tmp_path / "placement.json", "--plot", tmp_path / "loads.png")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("message", "expected"), [
    ("one integer tensor [num_experts] per record", "one integer tensor [num_experts] per record"),
    ("meta_info.json's 'num_experts' is 0", "meta_info.json's 'num_experts' is 0"),
    ("num_gpus=3 cannot hold num_experts", "--gpus=3 cannot hold --num-experts"),
], ids=["shape-in-brackets", "quoted-file-key", "parameters"])
def test_parameter_names_become_flags_except_shapes_and_file_keys(message, expected):
    from eplb.cli.error_lines import as_flags

    assert as_flags(message, "place") == expected
