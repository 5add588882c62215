"""Bad input to the `eplb` command line (real entry point, in a subprocess): exit status 2, exactly one non-empty
line on stderr that names the problem, no traceback, nothing on stdout, and no placement file written or clobbered.
"""

import json
import subprocess

import numpy as np
import pytest

CLUSTER = ("--gpus", "8", "--slots-per-gpu", "5")


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 2, stdout empty, stderr one non-empty line (no traceback) that contains `expected`."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, f"exit {result.returncode}; stderr: {result.stderr}"
    assert len(lines) == 1, f"stderr has {len(lines)} lines: {result.stderr!r}"
    assert lines[0].startswith("eplb") and expected in lines[0], f"{expected!r} not in {lines[0]!r}"
    assert result.stdout == "", f"stdout on error: {result.stdout!r}"


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
     "error: 12 GPUs do not fill whole nodes"),
    ("placement-not-json", "score --placement {dir}/not_json.json --trace {trace}", "not valid JSON"),
    ("placement-missing-keys", "score --placement {dir}/missing_keys.json --trace {trace}", "missing keys"),
    ("window-not-below-steps", "replay --trace {trace} {cluster} --every 10 --window 60", "--window 60"),
    ("every-zero", "replay --trace {trace} {cluster} --every 0 --window 10", "--every"),
    ("drift-ratio-not-above-one", "replay --trace {trace} {cluster} --every 10 --window 10 --refit-on-drift 0.9",
     "--refit-on-drift"),
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
     "invalid int value"),
    ("steps-reversed", "place --trace {trace} {cluster} --steps 5:2 --out {dir}/o.json", "--steps 5:2 selects no step"),
    ("steps-malformed", "place --trace {trace} {cluster} --steps five --out {dir}/o.json", "START:STOP"),
    ("steps-beyond-trace", "score --placement {placement} --trace {trace} --steps 0:999", "60 steps"),
    ("synth-top-k-above-experts", "synth --out {dir}/s.npz --experts 8 --top-k 9 --steps 5", "error: top_k=9"),
]


def _args(template: str, bad: dict) -> list[str]:
    return template.format(cluster=" ".join(CLUSTER), **bad).split()


@pytest.mark.parametrize(("template", "expected"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_exits_2_with_one_line_on_stderr(run_eplb, bad, template, expected):
    assert_one_line_error(run_eplb(*_args(template, bad)), expected)


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
def test_malformed_placement_values_and_misused_flags_exit_2(run_eplb, bad, template, expected):
    assert_one_line_error(run_eplb(*_args(template, bad)), expected)


# --- a failed `place` writes no placement file and leaves an existing one as it was ---------------------------


@pytest.mark.parametrize(
    "failure",
    [
        ("--trace", "{dir}/absent.npz", *CLUSTER),
        ("--trace", "{trace}", "--gpus", "2", "--slots-per-gpu", "3"),
        ("--trace", "{trace}", "--gpus", "12", "--slots-per-gpu", "5"),
        ("--trace", "{trace}", *CLUSTER, "--steps", "5:2"),
    ],
    ids=["missing-trace", "fewer-slots-than-experts", "not-whole-nodes", "steps-reversed"],
)
def test_failed_place_leaves_no_out_file(run_eplb, bad, tmp_path, failure):
    args = [a.format(**bad) for a in failure]
    result = run_eplb("place", *args, "--out", tmp_path / "placement.json", "--sglang-out", tmp_path / "s.json")
    assert result.returncode == 2, result.stderr
    assert list(tmp_path.iterdir()) == [], "a failed place left files (partial, empty or temporary)"


@pytest.mark.parametrize(
    "failure",
    [
        ("--gpus", "2", "--slots-per-gpu", "3"),
        (*CLUSTER, "--plot", "{blocker}/gpu_loads.png"),
        (*CLUSTER, "--sglang-out", "{blocker}/sglang.json"),
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
