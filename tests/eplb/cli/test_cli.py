"""The `eplb` command line through its real entry point (`python -m eplb.cli`): the contract spellings of
DESIGN.md work, write the documented files and print exactly one JSON object under --json.

Shapes are small (60 steps x 3 layers x 32 experts on 8 GPUs x 5 slots) so the file runs in seconds.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placement import burst_exposure, load_placement, score_placement
from placement.imbalance_metrics import group_metric
from placement.noise_floor import noise_floor
from placement.patch_planner import PatchPace
from traces import RoutingTrace, load_trace, save_trace

ESFT = Path(__file__).resolve().parents[3].parent / "shared/data/esft-dsv2lite/esft_vanilla_lite_routing.npz"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCORE_KEYS = ("imbalance_mean", "imbalance_p99", "imbalance_max", "lower_bound")
PLACEMENT_KEYS = (
    "schema_version", "num_layers", "num_logical_experts", "num_gpus", "gpus_per_node", "slots_per_gpu",
    "physical_to_logical_map", "replica_weights",
)
SYNTH = ("--steps", "60", "--layers", "3", "--experts", "32", "--top-k", "4", "--tokens-per-step", "256")
CLUSTER = ("--gpus", "8", "--slots-per-gpu", "5")


def ok_json(result: subprocess.CompletedProcess) -> dict:
    """The one JSON object a successful `--json` run printed; stdout must hold nothing else."""
    assert result.returncode == 0, f"exit {result.returncode}; stderr: {result.stderr}"
    assert result.stdout.count("\n") == 1 and result.stdout.endswith("\n"), f"stdout is not one line: {result.stdout!r}"
    data = json.loads(result.stdout)
    assert isinstance(data, dict), f"stdout is JSON but not an object: {result.stdout!r}"
    assert_no_progress_output(result.stderr)
    return data


def assert_no_progress_output(stderr: str) -> None:
    """stderr is empty or holds only warnings (a warning line, or its indented source line): no progress bar."""
    assert "\r" not in stderr and not re.search(r"\d+%\|", stderr), f"progress bar on stderr: {stderr!r}"
    for line in stderr.splitlines():
        assert not line.strip() or "warning" in line.lower() or line[:1].isspace(), f"stderr: {stderr!r}"


def assert_scores(scores: dict) -> None:
    """The contract keys, p99 <= max, and the lower bound no higher than the imbalance it bounds."""
    assert set(SCORE_KEYS) <= scores.keys(), f"missing {set(SCORE_KEYS) - scores.keys()}"
    assert scores["imbalance_p99"] <= scores["imbalance_max"], scores
    assert scores["lower_bound"] <= scores["imbalance_mean"] + 1e-9, scores


def is_png(path: Path) -> bool:
    data = Path(path).read_bytes()
    return data[:8] == PNG_SIGNATURE and len(data) > 1000


def counts_of(path: Path) -> np.ndarray:
    with np.load(path) as data:
        return data["counts"]


# --- synth -----------------------------------------------------------------------------------------------------


def test_synth_writes_a_counts_trace_of_the_asked_shape_with_k_picks_per_token(run_eplb, tmp_path):
    result = run_eplb("synth", "--out", "trace.npz", *SYNTH, "--seed", "0", "--json", cwd=tmp_path)
    assert ok_json(result)["shape"] == [60, 3, 32]
    counts = counts_of(tmp_path / "trace.npz")
    assert counts.shape == (60, 3, 32) and counts.dtype.kind in "iu"
    assert (counts.sum(axis=2) == 256 * 4).all(), "each of 256 tokens picks 4 experts per layer"


def test_synth_same_seed_gives_identical_counts_and_another_seed_differs(run_eplb, tmp_path):
    for name, seed in (("a.npz", 7), ("b.npz", 7), ("c.npz", 8)):
        assert run_eplb("synth", "--out", name, *SYNTH, "--seed", seed, "--quiet", cwd=tmp_path).returncode == 0
    np.testing.assert_array_equal(counts_of(tmp_path / "a.npz"), counts_of(tmp_path / "b.npz"))
    assert not np.array_equal(counts_of(tmp_path / "a.npz"), counts_of(tmp_path / "c.npz"))


def test_synth_npy_output_holds_the_bare_counts_array(run_eplb, tmp_path):
    assert run_eplb("synth", "--out", "trace.npy", *SYNTH, "--quiet", cwd=tmp_path).returncode == 0
    assert np.load(tmp_path / "trace.npy").shape == (60, 3, 32)


@pytest.mark.parametrize("mode, lengths", [("prefill", ("--prompt-tokens", "100")),
                                           ("decode", ("--output-tokens", "20"))], ids=["prefill", "decode"])
def test_synth_requests_writes_request_level_traffic_that_replay_takes(run_eplb, tmp_path, mode, lengths):
    result = run_eplb("synth", "--out", "trace.npz", *SYNTH, "--requests", mode, *lengths, "--json", cwd=tmp_path)
    assert ok_json(result)["shape"] == [60, 3, 32]
    counts = counts_of(tmp_path / "trace.npz")
    assert (counts.sum(axis=2) == 256 * 4).all()
    replay = run_eplb("replay", "--trace", "trace.npz", *CLUSTER, "--every", "10", "--window", "10", "--json",
                      cwd=tmp_path)
    assert ok_json(replay)["imbalance_mean"] >= 1.0


@pytest.mark.parametrize("flags, says", [
    (("--concentration", "5"), "--requests"),
    (("--requests", "decode", "--tokens-per-request", "3"), "--tokens-per-request"),
    (("--requests", "prefill", "--popularity", "zipf"), "--popularity zipf"),
    (("--requests", "prefill", "--request-trace", "missing.jsonl"), "--request-trace"),
    (("--requests", "decode", "--concentration", "0"), "--concentration"),
])
def test_synth_requests_refuses_bad_flags_in_one_line(run_eplb, tmp_path, flags, says, one_line_error):
    result = run_eplb("synth", "--out", "trace.npz", *SYNTH, *flags, cwd=tmp_path)
    one_line_error(result, says)
    assert not (tmp_path / "trace.npz").exists()


# --- place -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command, flags, says", [
    ("place", ("--policy", "deepseek", "--work-limit", "5"), "--work-limit applies only to --policy cpsat"),
    ("place", ("--policy", "deepseek", "--seed", "3"), "--seed applies only to --policy cpsat"),
    ("place", ("--policy", "trivial", "--time-limit", "5"), "--time-limit applies only to --policy cpsat"),
    ("place", ("--policy", "deepseek", "--workers", "3", "--seed", "1"), "--workers, --seed apply only"),
    ("replay", ("--policy", "deepseek", "--work-limit", "3", "--every", "10", "--window", "10"), "--work-limit"),
], ids=["deepseek-work-limit", "deepseek-seed", "trivial-time-limit", "two-flags", "replay-work-limit"])
def test_a_cpsat_option_given_to_another_policy_is_refused(run_eplb, small_trace, tmp_path, one_line_error, command,
                                                            flags, says):
    out = ("--out", str(tmp_path / "p.json")) if command == "place" else ()
    one_line_error(run_eplb(command, "--trace", small_trace, *CLUSTER, *flags, *out), says)
    assert not (tmp_path / "p.json").exists()



@pytest.mark.parametrize("policy", ["deepseek", "trivial"], ids=["deepseek", "trivial"])
def test_place_writes_the_design_md_placement_file(run_eplb, small_trace, tmp_path, policy):
    out = tmp_path / "placement.json"
    result = run_eplb("place", "--trace", small_trace, *CLUSTER, "--gpus-per-node", "8", "--policy", policy,
                      "--out", out, "--json")
    assert ok_json(result)["out"] == str(out)
    data = json.loads(out.read_text())
    assert set(PLACEMENT_KEYS) <= data.keys()
    assert (data["schema_version"], data["num_layers"], data["num_logical_experts"]) == (1, 3, 32)
    assert (data["num_gpus"], data["gpus_per_node"], data["slots_per_gpu"]) == (8, 8, 5)
    phy2log_LP = np.array(data["physical_to_logical_map"])
    weights_LP = np.array(data["replica_weights"])
    assert phy2log_LP.shape == weights_LP.shape == (3, 40)
    for layer in range(3):
        assert set(phy2log_LP[layer]) == set(range(32)), f"layer {layer} misses an expert"
        sums_E = np.bincount(phy2log_LP[layer], weights=weights_LP[layer], minlength=32)
        np.testing.assert_allclose(sums_E, 1.0, atol=1e-9, err_msg=f"layer {layer}: weights per expert")


def test_place_sglang_out_holds_only_the_map_with_a_row_per_model_layer(run_eplb, small_trace, tmp_path):
    out, sglang = tmp_path / "placement.json", tmp_path / "sglang.json"
    # The trace's 3 layers are layers 2-4 of a 5-layer model whose layers 0-1 are dense.
    result = run_eplb("place", "--trace", small_trace, *CLUSTER, "--out", out, "--sglang-out", sglang,
                      "--sglang-num-layers", "5", "--sglang-first-moe-layer", "2", "--quiet")
    assert result.returncode == 0, result.stderr
    mapping = json.loads(sglang.read_text())
    assert list(mapping) == ["physical_to_logical_map"]
    assert mapping["physical_to_logical_map"][2:] == json.loads(out.read_text())["physical_to_logical_map"]
    assert mapping["physical_to_logical_map"][:2] == [[slot % 32 for slot in range(40)]] * 2


def test_place_with_current_reports_bytes_moved_and_nothing_for_the_same_fit(run_eplb, small_trace, tmp_path):
    first, second, third = (tmp_path / f"{name}.json" for name in ("first", "second", "third"))
    assert run_eplb("place", "--trace", small_trace, *CLUSTER, "--steps", "0:30", "--out", first).returncode == 0
    moved = run_eplb("place", "--trace", small_trace, *CLUSTER, "--steps", "30:60", "--out", second,
                     "--current", first, "--bytes-per-expert", "1000", "--json")
    result = json.loads(moved.stdout)
    assert result["bytes_moved"] == 1000 * result["experts_moved"]
    assert result["experts_moved"] <= result["migration"]["oblivious_moves"]
    again = run_eplb("place", "--trace", small_trace, *CLUSTER, "--steps", "30:60", "--out", third,
                     "--current", second, "--json")
    assert json.loads(again.stdout)["bytes_moved"] == 0
    assert json.loads(third.read_text())["physical_to_logical_map"] == json.loads(second.read_text())[
        "physical_to_logical_map"]


def test_place_with_the_cpsat_policy_writes_a_solver_report(run_eplb, small_trace, tmp_path):
    out = tmp_path / "cpsat.json"
    result = run_eplb("place", "--trace", small_trace, *CLUSTER, "--policy", "cpsat", "--time-limit", "3",
                      "--workers", "2", "--routing", "dynamic", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["policy"] == "cpsat"
    data = json.loads(out.read_text())
    assert data["policy"] == "cpsat" and data["info"]["time_limit_s"] == 3.0
    assert data["info"]["solver"] == "cp-sat" and data["info"]["routing"] == "dynamic"


def test_demo_writes_its_files_and_one_json_object(run_eplb, tmp_path):
    result = run_eplb("demo", "--steps", "60", "--layers", "4", "--time-limit", "1", "--out-dir", tmp_path / "demo",
                      "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {(r["policy"], r["routing"], r["fit"]) for r in summary["rows"]} == {
        (p, r, f) for p in ("trivial", "deepseek") for r in ("static", "dynamic") for f in ("fitted", "held-out")} | {
        ("cpsat", "dynamic", "fitted"), ("cpsat", "dynamic", "held-out"),
        ("cpsat", "live", "held-out")}
    # Beside each row: the same replay on independent tokens at the same shape and skew.
    beside = {(r["policy"], r["routing"], r["fit"]): r["imbalance_mean"] for r in summary["independent_tokens_rows"]}
    assert set(beside) == {(r["policy"], r["routing"], r["fit"]) for r in summary["rows"]}
    assert all(r["independent tokens"] == f"{beside[r['policy'], r['routing'], r['fit']]:.3f}" for r in summary["rows"])
    assert json.loads((tmp_path / "demo" / "placement.json").read_text())["policy"] == "cpsat"
    for name in ("trace.npz", "placement.json", "load_heatmap.png", "gpu_loads.png", "replay.png"):
        assert (tmp_path / "demo" / name).stat().st_size > 0


def test_place_records_gpus_per_node_and_narrows_to_steps(run_eplb, small_trace, tmp_path):
    out = tmp_path / "placement.json"
    result = run_eplb("place", "--trace", small_trace, "--gpus", "16", "--slots-per-gpu", "5",
                      "--gpus-per-node", "4", "--steps", "10:30", "--out", out, "--json")
    assert ok_json(result)["steps"] == 20
    data = json.loads(out.read_text())
    assert (data["num_gpus"], data["gpus_per_node"]) == (16, 4)
    assert np.array(data["physical_to_logical_map"]).shape == (3, 80)


def test_place_without_json_prints_a_table_and_quiet_prints_nothing(run_eplb, small_trace, tmp_path):
    table = run_eplb("place", "--trace", small_trace, *CLUSTER, "--out", tmp_path / "a.json")
    assert table.returncode == 0 and "mean" in table.stdout and "deepseek" in table.stdout
    quiet = run_eplb("place", "--trace", small_trace, *CLUSTER, "--out", tmp_path / "b.json", "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")


# --- score -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("routing", ["static", "dynamic"], ids=["static", "dynamic"])
def test_score_prints_one_json_object_with_sane_imbalance(run_eplb, small_trace, small_placement, routing):
    result = run_eplb("score", "--placement", small_placement, "--trace", small_trace, "--routing", routing, "--json")
    printed = ok_json(result)
    assert_scores(printed)
    expected = score_placement(load_placement(small_placement), load_trace(small_trace).counts_TLE, routing).summary()
    for key in SCORE_KEYS:
        assert printed[key] == pytest.approx(expected[key], rel=1e-12), key


def test_score_reports_the_burst_exposure_on_the_trace_s_mean_load(run_eplb, small_trace, small_placement):
    printed = ok_json(run_eplb("score", "--placement", small_placement, "--trace", small_trace, "--burst-factor", "4",
                               "--json"))
    placement = load_placement(small_placement)
    exposure_LE = burst_exposure(placement, load_trace(small_trace).counts_TLE.mean(axis=0), 4.0)
    assert printed["burst_factor"] == 4.0
    assert printed["burst_exposure_mean"] == pytest.approx(exposure_LE.mean(), rel=1e-12)
    assert printed["burst_exposure_max"] == pytest.approx(exposure_LE.max(), rel=1e-12)
    assert 1.0 <= printed["burst_exposure_mean"] <= printed["burst_exposure_max"]
    plain = ok_json(run_eplb("score", "--placement", small_placement, "--trace", small_trace, "--json"))
    assert "burst_exposure_mean" not in plain


def test_score_dynamic_routing_is_no_worse_than_static_on_the_same_placement(run_eplb, small_trace, small_placement):
    static, dynamic = (
        ok_json(run_eplb("score", "--placement", small_placement, "--trace", small_trace, "--routing", r, "--json"))
        for r in ("static", "dynamic")
    )
    assert dynamic["imbalance_mean"] <= static["imbalance_mean"] + 1e-9
    assert dynamic["imbalance_max"] <= static["imbalance_max"] + 1e-9


def test_score_on_the_fitted_trace_matches_what_place_reported(run_eplb, small_trace, tmp_path):
    out = tmp_path / "placement.json"
    placed = ok_json(run_eplb("place", "--trace", small_trace, *CLUSTER, "--out", out, "--json"))
    scored = ok_json(run_eplb("score", "--placement", out, "--trace", small_trace, "--json"))
    for key in SCORE_KEYS:
        assert scored[key] == pytest.approx(placed[key], rel=1e-9), key


def test_score_carries_the_yardsticks_and_every_named_metric(run_eplb, small_trace, small_placement):
    printed = ok_json(run_eplb("score", "--placement", small_placement, "--trace", small_trace, "--metric-groups",
                               "4", "--json"))
    counts_TLE = load_trace(small_trace).counts_TLE
    assert printed["noise_floor"] == noise_floor(counts_TLE.sum(axis=-1).mean(), 8)
    assert 1.0 <= printed["granularity_bound"] <= printed["imbalance_mean"] + 1e-9
    metrics = printed["metrics"]
    assert metrics["card_step"]["value"] == pytest.approx(printed["imbalance_mean"])
    assert metrics["group_step"]["value"] == pytest.approx(group_metric(counts_TLE, 4)["value"])
    assert metrics["card_window_10"]["rows"] == 6 * 3 and metrics["card_window_100"]["value"] is None
    text = run_eplb("score", "--placement", small_placement, "--trace", small_trace).stdout
    assert "yardsticks: noise floor" in text and "card/10 steps" in text


def test_score_refuses_metric_groups_that_do_not_divide_the_experts(run_eplb, small_trace, small_placement):
    result = run_eplb("score", "--placement", small_placement, "--trace", small_trace, "--metric-groups", "5")
    assert result.returncode == 2 and "--metric-groups 5 does not divide" in result.stderr


# --- replay ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("routing", ["static", "dynamic"], ids=["static", "dynamic"])
def test_replay_scores_the_held_out_steps_with_one_refit_per_every(run_eplb, small_trace, routing):
    result = run_eplb("replay", "--trace", small_trace, *CLUSTER, "--policy", "deepseek", "--every", "15",
                      "--window", "10", "--routing", routing, "--json")
    summary = ok_json(result)
    assert_scores(summary)
    assert summary["steps"] == 60 - 10, "steps [0, window) are never scored"
    assert summary["refits"] == 4, "refits at steps 10, 25, 40, 55"
    assert summary["forecast"] == "trend", "the trend forecast is the default fit"
    held_TLE = load_trace(small_trace).counts_TLE[10:]
    assert summary["noise_floor"] == noise_floor(held_TLE.sum(axis=-1).mean(), 8), "at the held-out steps' load"
    assert summary["metrics"]["card_window_10"]["rows"] == 5 * 3


def test_replay_patches_a_burst_between_refits_and_reports_the_slots_moved(run_eplb, tmp_path):
    # Expert 0 turns 8 times as hot at step 40, between the refits at 30 and 50 (each served 5 steps later).
    rng = np.random.default_rng(0)
    rate = np.full((70, 1, 32), 40.0)
    rate[40:, 0, 0] *= 8
    save_trace(RoutingTrace.from_counts(rng.poisson(rate)), tmp_path / "burst.npz")
    args = ("replay", "--trace", tmp_path / "burst.npz", *CLUSTER, "--policy", "deepseek", "--every", "20",
            "--window", "10", "--lag", "5", "--routing", "dynamic", "--json")
    plain, patched = ok_json(run_eplb(*args, "--patch-every", "0")), ok_json(run_eplb(*args, "--patch-lag", "2",
                                                                                      "--patch-every", "2"))
    assert plain["patch_lag"] is None and "patch_moves" not in plain
    assert patched["patch_lag"] == 2 and patched["patch_moves"] > 0
    assert patched["imbalance_mean"] < plain["imbalance_mean"]
    default = ok_json(run_eplb(*args))  # patches are on by default, as in the live rebalancer
    assert default["patch_lag"] == PatchPace().lag and default["patch_moves"] > 0
    assert default["refit_blocks_patches"] is False and plain["refit_blocks_patches"] is None
    blocked = ok_json(run_eplb(*args, "--patch-lag", "2", "--patch-every", "2", "--refit-blocks-patches"))
    assert blocked["refit_blocks_patches"] is True and 0 < blocked["patch_moves"] <= patched["patch_moves"]
    assert blocked["imbalance_mean"] < plain["imbalance_mean"]
    # The burst's layer served a step sooner than the patches' other layers, as a live patch switches it.
    later, sooner = (ok_json(run_eplb(*args, "--patch-lag", "4", "--patch-every", "2", *more))
                     for more in ((), ("--patch-burst-lag", "3")))
    assert later["patch_burst_lag"] is None and sooner["patch_burst_lag"] == 3
    assert sooner["imbalance_mean"] < later["imbalance_mean"]
    outside = run_eplb(*args, "--patch-lag", "4", "--patch-every", "2", "--patch-burst-lag", "2")
    assert outside.returncode == 2 and "--patch-burst-lag must lie in" in outside.stderr and "(2, 4]" in outside.stderr


def test_replay_fits_the_window_as_it_is_with_no_forecast(run_eplb, tmp_path):
    # One expert's rate rises steadily: the forecast gives it more replicas than its stale window does.
    rng = np.random.default_rng(0)
    rate = np.full((80, 1, 32), 20.0)
    rate[:, 0, 0] = np.linspace(20.0, 900.0, 80)
    save_trace(RoutingTrace.from_counts(rng.poisson(rate)), tmp_path / "rising.npz")
    args = ("replay", "--trace", tmp_path / "rising.npz", *CLUSTER, "--policy", "deepseek", "--every", "10",
            "--window", "10", "--lag", "10", "--routing", "dynamic", "--json")
    trend, none = ok_json(run_eplb(*args)), ok_json(run_eplb(*args, "--forecast", "none"))
    assert (trend["forecast"], none["forecast"]) == ("trend", "none")
    assert trend["imbalance_mean"] < none["imbalance_mean"]


def test_replay_refits_on_drift_when_the_traffic_switches(run_eplb, tmp_path):
    rng = np.random.default_rng(0)
    rate = np.full((2, 3, 32), 10.0)
    rate[0, :, :4], rate[1, :, 16:20] = 200.0, 200.0  # the hot experts change at step 37
    counts = np.concatenate([rng.poisson(rate[0], size=(37, 3, 32)), rng.poisson(rate[1], size=(23, 3, 32))])
    save_trace(RoutingTrace.from_counts(counts), tmp_path / "switch.npz")
    args = ("replay", "--trace", tmp_path / "switch.npz", *CLUSTER, "--every", "10", "--window", "10",
            "--routing", "dynamic", "--json")
    fixed, drift = ok_json(run_eplb(*args)), ok_json(run_eplb(*args, "--refit-on-drift", "1.3"))
    assert (fixed["drift_refits"], drift["drift_refits"]) == (0, 1)
    assert (fixed["refits"], drift["refits"], drift["refit_on_drift"]) == (5, 6, 1.3)
    assert drift["steps"] == fixed["steps"] == 50
    assert drift["imbalance_mean"] < fixed["imbalance_mean"]


# --- progress bars --------------------------------------------------------------------------------------------


def test_replay_draws_a_progress_bar_on_a_terminal(run_eplb_tty_stderr, small_trace):
    status, stderr = run_eplb_tty_stderr("replay", "--trace", small_trace, *CLUSTER, "--every", "1", "--window", "10")
    assert status == 0, stderr
    assert "replay deepseek" in stderr and "50/50" in stderr, f"no progress bar on a terminal: {stderr!r}"


@pytest.mark.parametrize(
    "command",
    [
        ("replay", "--trace", "{trace}", *CLUSTER, "--every", "1", "--window", "10"),
        ("score", "--placement", "{placement}", "--trace", "{trace}", "--routing", "dynamic"),
    ],
    ids=["replay", "score"],
)
@pytest.mark.parametrize("flag", ["--json", "--quiet"], ids=["json", "quiet"])
def test_json_and_quiet_draw_no_progress_bar_even_on_a_terminal(
    run_eplb_tty_stderr, small_trace, small_placement, command, flag
):
    args = [a.format(trace=small_trace, placement=small_placement) for a in command]
    status, stderr = run_eplb_tty_stderr(*args, flag)
    assert status == 0, stderr
    assert_no_progress_output(stderr)


# --- figures ---------------------------------------------------------------------------------------------------


def test_plot_command_writes_a_heatmap_and_with_a_placement_gpu_loads(run_eplb, small_trace, small_placement, tmp_path):
    alone = ok_json(run_eplb("plot", "--trace", small_trace, "--out-dir", tmp_path / "a", "--json"))
    both = ok_json(run_eplb("plot", "--trace", small_trace, "--placement", small_placement,
                            "--out-dir", tmp_path / "b", "--json"))
    assert [Path(p).name for p in alone["written"]] == ["load_heatmap.png"]
    assert [Path(p).name for p in both["written"]] == ["load_heatmap.png", "gpu_loads.png"]
    assert all(is_png(p) for p in alone["written"] + both["written"])


@pytest.mark.parametrize(
    "command",
    [
        ("synth", "--out", "t.npz", *SYNTH),
        ("place", "--trace", "{trace}", *CLUSTER, "--out", "p.json"),
        ("score", "--placement", "{placement}", "--trace", "{trace}"),
        ("replay", "--trace", "{trace}", *CLUSTER, "--policy", "deepseek", "--every", "20", "--window", "20"),
    ],
    ids=["synth", "place", "score", "replay"],
)
def test_plot_flag_writes_a_png(run_eplb, small_trace, small_placement, tmp_path, command):
    args = [a.format(trace=small_trace, placement=small_placement) for a in command]
    result = run_eplb(*args, "--plot", "figure.png", "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert is_png(tmp_path / "figure.png")


# --- help ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [[], ["demo"], ["synth"], ["place"], ["score"], ["replay"], ["plot"]],
    ids=["eplb", "demo", "synth", "place", "score", "replay", "plot"],
)
def test_help_exits_zero_with_usage(run_eplb, command):
    result = run_eplb(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: eplb") and result.stderr == ""


def test_console_script_runs_the_same_main(tmp_path):
    script = Path(sys.executable).parent / "eplb"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}; install the package to get it")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0 and "place" in result.stdout, result.stderr


# --- SGLang dumps and plain .npy -------------------------------------------------------------------------------


def test_sglang_pt_dump_and_plain_npy_place_the_same_as_npz(run_eplb, tmp_path):
    torch = pytest.importorskip("torch")
    counts_TLE = np.random.default_rng(0).poisson(np.linspace(1, 40, 16), size=(20, 2, 16)).astype(np.int64)
    torch.save({"logical_count": torch.tensor(counts_TLE)}, tmp_path / "dump.pt")
    np.save(tmp_path / "counts.npy", counts_TLE)
    np.savez(tmp_path / "counts.npz", counts=counts_TLE)
    maps = {}
    for name in ("dump.pt", "counts.npy", "counts.npz"):
        out = tmp_path / f"{name}.json"
        result = run_eplb("place", "--trace", tmp_path / name, "--gpus", "4", "--slots-per-gpu", "5", "--out", out,
                          "--json")
        assert ok_json(result)["steps"] == 20, name
        data = json.loads(out.read_text())
        assert (data["num_layers"], data["num_logical_experts"]) == (2, 16), name
        maps[name] = data["physical_to_logical_map"]
    assert maps["dump.pt"] == maps["counts.npy"] == maps["counts.npz"]


# --- real data: the ESFT DeepSeek-V2-Lite top-k id log ---------------------------------------------------------


@pytest.fixture(scope="module")
def esft() -> Path:
    if not ESFT.is_file():
        pytest.skip(f"real routing data not present at {ESFT}")
    return ESFT


def test_esft_place_then_score_static_and_dynamic(run_eplb, esft, tmp_path):
    out = tmp_path / "esft.json"
    reading = ("--trace", esft, "--tokens-per-step", "256")
    assert run_eplb("place", *reading, "--gpus", "16", "--slots-per-gpu", "5", "--out", out, "--quiet").returncode == 0
    data = json.loads(out.read_text())
    assert (data["num_layers"], data["num_logical_experts"]) == (26, 64)
    assert np.array(data["physical_to_logical_map"]).shape == (26, 80)
    static, dynamic = (ok_json(run_eplb("score", "--placement", out, *reading, "--routing", r, "--json"))
                       for r in ("static", "dynamic"))
    assert_scores(static)
    assert_scores(dynamic)
    assert dynamic["imbalance_mean"] <= static["imbalance_mean"] + 1e-9


def test_esft_rolling_replay(run_eplb, esft):
    result = run_eplb("replay", "--trace", esft, "--tokens-per-step", "256", "--gpus", "16", "--slots-per-gpu", "5",
                      "--policy", "deepseek", "--every", "8", "--window", "8", "--json")
    summary = ok_json(result)
    assert_scores(summary)
    assert summary["refits"] == -(-summary["steps"] // 8)


def test_esft_placement_fitted_on_law_is_worse_on_held_out_intent(run_eplb, esft, tmp_path):
    out = tmp_path / "law.json"
    reading = ("--trace", esft, "--tokens-per-step", "256")
    fitted = ok_json(run_eplb("place", *reading, "--task", "law", "--gpus", "16", "--slots-per-gpu", "5",
                              "--out", out, "--json"))
    held_out = ok_json(run_eplb("score", "--placement", out, *reading, "--task", "intent", "--json"))
    assert_scores(held_out)
    assert held_out["imbalance_mean"] > fitted["imbalance_mean"]


def test_replay_follows_a_drifting_mix_with_drift_swaps_unless_told_not_to(run_eplb, tmp_path):
    # Two mixes of 32 experts, one fading into the other over 120 steps; cpsat's ring layouts can trade replica sets.
    rng = np.random.default_rng(1)
    start, end = rng.gamma(2.0, 20.0, 32), rng.gamma(2.0, 20.0, 32)
    mix = np.linspace(0.0, 1.0, 120)[:, None, None]
    save_trace(RoutingTrace.from_counts(rng.poisson((1 - mix) * start + mix * end)), tmp_path / "drift.npz")
    args = ("replay", "--trace", tmp_path / "drift.npz", *CLUSTER, "--policy", "cpsat", "--time-limit", "0.5",
            "--every", "60", "--window", "20", "--lag", "20", "--routing", "dynamic", "--patch-lag", "2", "--json")
    followed, fixed = ok_json(run_eplb(*args)), ok_json(run_eplb(*args, "--drift-swaps", "0"))
    assert followed["drift_swaps"] == 4 and fixed["drift_swaps"] == 0
    assert followed["patch_moves"] > fixed["patch_moves"]


def test_options_refused_together_are_named_without_leaking_the_options_dict(run_eplb, tmp_path, one_line_error):
    trace = tmp_path / "t.npz"
    assert run_eplb("synth", "--out", trace, "--steps", "30", "--layers", "2", "--experts", "48", "--top-k", "4",
                    "--tokens-per-step", "256", "--quiet").returncode == 0
    result = run_eplb("place", "--trace", trace, "--gpus", "16", "--slots-per-gpu", "3", "--gpus-per-node", "4",
                      "--policy", "cpsat", "--nodes-per-group", "1", "--out", tmp_path / "p.json")
    one_line_error(result, "--nodes-per-group go together")
    assert "{" not in result.stderr and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("command, kind", [
    (("place", "--trace", "{trace}", *CLUSTER, "--out", "{victim}"), "placement"),
    (("place", "--trace", "{trace}", *CLUSTER, "--out", "p.json", "--plot", "{victim}"), "PNG"),
    (("synth", "--out", "{victim}", *SYNTH), "routing trace"),
    (("sim", "--capacity", "--curve", "20", "--plot", "{victim}"), "PNG"),
], ids=["place-out", "place-plot", "synth-out", "sim-plot"])
def test_an_output_never_replaces_a_file_of_another_kind(run_eplb, small_trace, tmp_path, one_line_error, command,
                                                        kind):
    victim = tmp_path / "README.md"
    victim.write_text("# a document, not an output\n")
    args = [str(part).format(trace=small_trace, victim=victim) for part in command]
    one_line_error(run_eplb(*args, cwd=tmp_path), f"is not a {kind} file; give a new path, or remove it first")
    assert victim.read_text() == "# a document, not an output\n" and not (tmp_path / "p.json").exists()


def test_an_output_replaces_a_file_of_its_own_kind(run_eplb, small_trace, tmp_path):
    out = tmp_path / "p.json"
    for _ in range(2):
        assert run_eplb("place", "--trace", small_trace, *CLUSTER, "--out", out, "--quiet").returncode == 0
    assert "physical_to_logical_map" in json.loads(out.read_text())
