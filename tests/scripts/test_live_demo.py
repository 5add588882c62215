"""`scripts/live_demo.py` runs a real 3-process Gloo decode loop and reports the contract keys: outputs equal the
dense layer, no token lost, the measured imbalance equal to the planned one; with a rebalancer, its per-step times
written where asked, and a path it cannot write refused before anything runs; every bad flag value refused in the
parser with one line and exit 2, before any process starts; and a SIGTERM or SIGKILL sent to the demo's process
alone ends every process it started (ranks, the solver's helper and its pacer, multiprocessing's resource tracker)
within 5 s."""

import json
import os
import multiprocessing.process
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "live_demo.py"
KEYS = {"steps", "world_size", "routing", "max_abs_err_vs_dense", "imbalance_measured", "imbalance_planned",
        "tokens_lost"}


@pytest.fixture(scope="module")
def demo(load_script):
    """The script loaded as a module, to call its `main` in this process."""
    return load_script("live_demo")


@pytest.mark.parametrize("routing", ["dynamic", "oblivious"])
def test_live_demo_prints_the_contract_keys_last_with_no_token_lost(demo, capsys, routing):
    assert demo.main(["--world-size", "3", "--steps", "3", "--experts", "12", "--hidden-size", "16",
                      "--tokens-per-step", "60", "--time-limit", "0.5", "--routing", routing, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS <= report.keys()
    assert report["steps"] == 3 and report["world_size"] == 3 and report["routing"] == routing
    assert report["max_abs_err_vs_dense"] <= 1e-5 and report["tokens_lost"] == 0
    assert report["imbalance_measured"] == report["imbalance_planned"]


def test_a_rank_killed_as_the_group_starts_stops_the_run_with_one_json_object_saying_why(demo, capsys):
    # The demo's start placement keeps most experts on one rank only: before any host copy exists, the survivors
    # cannot serve rank 1's, so every one of them stops, and the JSON says why (the harness's ring test serves on)
    assert demo.main(["--world-size", "3", "--steps", "6", "--experts", "12", "--hidden-size", "16",
                      "--tokens-per-step", "60", "--time-limit", "0.5", "--solve-in", "thread", "--fail-rank", "1",
                      "--fail-at-start", "--timeout", "4", "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert "cannot start without the lost ranks" in report["stopped"] and report["failed_rank"] == 1
    assert report["ranks_finished"] == 0 and report["stopped_rank"] in (0, 2)
    assert captured.err.count("\n") == 1 and "live_demo: rank" in captured.err


def test_live_demo_rebalances_and_survives_a_killed_rank(demo, capsys, tmp_path):
    times_file = tmp_path / "step_times.json"
    assert demo.main(["--world-size", "3", "--steps", "36", "--experts", "12", "--hidden-size", "16",
                      "--tokens-per-step", "60", "--time-limit", "0.5", "--rebalance-every", "6",
                      "--rebalance-policy", "deepseek", "--solve-in", "thread", "--fail-rank", "1",
                      "--step-times", str(times_file), "--fail-at-step", "26", "--timeout", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"steps", "world_size", "max_abs_err_vs_dense", "imbalance_before", "imbalance_after", "rebalances",
            "bytes_moved", "tokens_lost", "requests_requeued", "failed_rank", "decode_steps_waiting_on_rebalance",
            "step_time_p99_ratio"} <= report.keys()
    assert report["steps"] == 36 and report["world_size"] == 3 and report["failed_rank"] == 1
    assert report["max_abs_err_vs_dense"] <= 1e-5 and report["tokens_lost"] == 0
    assert report["rebalances"] >= 1 and report["bytes_moved"] > 0 and report["requests_requeued"] > 0
    assert report["survivors"] == [0, 2]
    switch = report["first_switch"]  # what the first switch served until the next one or the kill
    assert switch["from_step"] == report["switch_steps"][0] < switch["to_step"] <= 36
    assert switch["before"] > 0 and switch["after"] > 0
    phases = report["step_time_ms_by_phase"]
    assert phases["quiet"]["steps"] > 0 and sum(row["steps"] for row in phases.values()) == report["steps"]
    low, high = report["step_time_p99_ratio_interval"]
    assert 0 < low <= high
    times = json.loads(times_file.read_text())["steps"]
    assert [row["step"] for row in times] == list(range(36))
    assert [row["world_size"] for row in times] == [3] * 26 + [2] * 10
    busy = [row["seconds"] for row in times if row["rebalancing"]]
    assert len(busy) == report["step_time_ms"]["steps_rebalancing"]
    assert round(1e3 * float(np.percentile(busy, 99)), 3) == report["step_time_ms"]["p99_rebalancing"]


@pytest.mark.parametrize("extra, message", [
    (["--step-times", "times.json"], "--step-times needs --rebalance-every or --fail-rank"),
    (["--rebalance-every", "5", "--step-times", "missing/times.json"], "does not exist; create it first"),
    (["--rebalance-every", "5", "--step-times", "."], "it exists and is a directory"),
    (["--rebalance-every", "5", "--step-times", "/dev/full"], "not a regular file"),
    (["--rebalance-every", "5", "--step-times", "notes.md"], "notes.md exists and is not a JSON file"),
])
def test_live_demo_refuses_a_step_times_file_it_cannot_write(demo, capsys, monkeypatch, tmp_path, extra, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("# the project's own file\n")
    with pytest.raises(SystemExit) as exited:
        demo.main(["--steps", "3", *extra])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err, err
    assert [path.name for path in tmp_path.iterdir()] == ["notes.md"]
    assert (tmp_path / "notes.md").read_text() == "# the project's own file\n"


BAD_FLAGS = [  # (id, argv, what the one line says)
    ("world-size-0", ["--world-size", "0"], "argument --world-size: expected an integer in [1, 1024], got 0"),
    ("world-size-negative", ["--world-size", "-2"], "argument --world-size: expected an integer in [1, 1024], got -2"),
    ("world-size-not-a-number", ["--world-size", "four"], "argument --world-size: expected an integer"),
    ("steps-0", ["--steps", "0", "--world-size", "4"], "argument --steps: expected an integer in [1, 100000], got 0"),
    ("steps-negative", ["--steps", "-3"], "argument --steps: expected an integer in [1, 100000], got -3"),
    ("timeout-0", ["--timeout", "0"], "argument --timeout: expected a number > 0 and <= 86400, got 0"),
    ("timeout-nan", ["--timeout", "nan"], "argument --timeout: expected a number > 0 and <= 86400, got nan"),
    ("top-k-0", ["--top-k", "0"], "argument --top-k: expected an integer in [1, 4096], got 0"),
    ("tokens-per-step-0", ["--tokens-per-step", "0"],
     "argument --tokens-per-step: expected an integer in [1, 1048576], got 0"),
    ("layers-0", ["--layers", "0"], "argument --layers: expected an integer in [1, 256], got 0"),
    ("experts-0", ["--experts", "0"], "argument --experts: expected an integer in [1, 4096], got 0"),
    ("slots-per-gpu-0", ["--slots-per-gpu", "0"], "argument --slots-per-gpu: expected an integer in [1, 256], got 0"),
    ("hidden-size-0", ["--hidden-size", "0"], "argument --hidden-size: expected an integer in [1, 65536], got 0"),
    ("fit-steps-0", ["--fit-steps", "0"], "argument --fit-steps: expected an integer in [1, 100000], got 0"),
    ("time-limit-0", ["--time-limit", "0"], "argument --time-limit: expected a number > 0 and <= 86400, got 0"),
    ("seed-negative", ["--seed", "-1"], "argument --seed: expected an integer in [0, 2147483647], got -1"),
    ("seed-beyond-cp-sat", ["--seed", "99999999999"], "argument --seed: expected an integer in [0, 2147483647]"),
    ("rebalance-every-0", ["--rebalance-every", "0"],
     "argument --rebalance-every: expected an integer in [1, 100000], got 0"),
    ("rebalance-time-limit-negative", ["--rebalance-time-limit", "-1"],
     "argument --rebalance-time-limit: expected a number > 0 and <= 86400, got -1"),
    ("good-enough-below-1", ["--rebalance-good-enough", "0.5"],
     "argument --rebalance-good-enough: expected a number 0 or >= 1 and <= 2, got 0.5"),
    ("min-gain-negative", ["--rebalance-min-gain", "-0.1"],
     "argument --rebalance-min-gain: expected a number >= 0 and <= 1, got -0.1"),
    ("solve-cpu-share-above-1", ["--solve-cpu-share", "2"],
     "argument --solve-cpu-share: expected a number > 0 and <= 1, got 2"),
    ("max-bytes-per-step-0", ["--max-bytes-per-step", "0"],
     "argument --max-bytes-per-step: expected an integer in [1, 1099511627776], got 0"),
    ("fail-rank-negative", ["--fail-rank", "-1"], "argument --fail-rank: expected an integer in [0, 1023], got -1"),
    ("top-k-above-experts", ["--experts", "8", "--top-k", "9"], "--top-k must be <= --experts"),
    ("hidden-size-below-experts", ["--hidden-size", "16"], "--hidden-size must be >= --experts"),
    ("fewer-slots-than-experts", ["--world-size", "2", "--slots-per-gpu", "3"], "every expert needs a slot"),
    ("fail-rank-outside-the-group", ["--world-size", "2", "--fail-rank", "2"], "--fail-rank must be a rank in [0, 2)"),
    ("fail-at-step-after-the-run", ["--steps", "5", "--fail-rank", "1", "--fail-at-step", "5"],
     "--fail-at-step must be in [0, --steps=5)"),
    ("fail-at-start-without-a-rank", ["--fail-at-start"], "--fail-at-start needs --fail-rank"),
    ("fail-at-start-and-at-a-step", ["--fail-rank", "1", "--fail-at-start", "--fail-at-step", "2"],
     "replaces --fail-at-step"),
    ("steps-beyond-any-demo", ["--steps", "1000000000000"], "argument --steps: expected an integer in [1, 100000]"),
    ("time-limit-absurd", ["--time-limit", "1e300"], "argument --time-limit: expected a number > 0 and <= 86400"),
    ("memory-beyond-the-machine", ["--hidden-size", "65536"], "lower --layers, --experts, --hidden-size"),
    ("move-budget-below-one-row", ["--rebalance-every", "5", "--max-bytes-per-step", "100"],
     "--max-bytes-per-step must be >= one row of an expert's weights"),
]


@pytest.mark.parametrize("argv, message", [case[1:] for case in BAD_FLAGS], ids=[case[0] for case in BAD_FLAGS])
def test_a_bad_flag_exits_2_with_one_line_before_any_process_starts(demo, monkeypatch, capsys, argv, message):
    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(demo, "run_local_group", no_process)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", no_process)
    began = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        demo.main(argv)
    assert time.monotonic() - began < 2.0
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_the_script_itself_exits_2_with_one_line_on_stderr_and_nothing_on_stdout():
    result = subprocess.run([sys.executable, str(SCRIPT), "--steps", "-3"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["live_demo.py: error: argument --steps: expected an integer in [1, 100000], "
                                          "got -3 (see live_demo.py --help)"]


# A run long enough to be killed in the middle: 2 ranks, rank 0 with its solver's helper and the helper's pacer
# (started for a CPU share below 1).
LONG_RUN = ["--world-size", "2", "--steps", "100000", "--experts", "8", "--hidden-size", "16",
            "--tokens-per-step", "16", "--fit-steps", "5", "--time-limit", "0.2", "--rebalance-every", "5",
            "--rebalance-time-limit", "0.2", "--solve-cpu-share", "0.5"]


def _all_up(members: dict[int, str]) -> bool:
    commands = list(members.values())
    # The fork server and the 2 ranks forked from it carry its command line.
    return (sum("multiprocessing.forkserver" in command for command in commands) == 3
            and any("-m eplb.rebalance.background_solver" in command for command in commands)
            and any("cpu_pacer.py" in command for command in commands))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_to_the_demo_process_alone_ends_every_process_it_started(tmp_path, new_session, signum):
    with open(tmp_path / "stderr", "w") as stderr:
        session = new_session([sys.executable, str(SCRIPT), *LONG_RUN], stdout=subprocess.DEVNULL, stderr=stderr)
    members = session.wait_for(_all_up, timeout_s=180)
    assert any("resource_tracker" in command for command in members.values())
    session.process.send_signal(signum)
    returncode = session.process.wait(timeout=60)
    assert session.survivors_after(5.0) == {}
    if signum == signal.SIGTERM:  # stopped its ranks, and exited quietly with the shell's status for SIGTERM
        assert returncode == 128 + signal.SIGTERM
        assert "Traceback" not in (tmp_path / "stderr").read_text()


def test_a_group_larger_than_the_machine_runs_is_refused_before_any_rank_starts(load_script, capsys, monkeypatch):
    demo = load_script("live_demo")
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    assert demo.machine_ranks() <= 2 * demo.RANKS_PER_CORE
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--world-size", str(2 * demo.RANKS_PER_CORE + 1)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "more ranks than this machine runs" in err[0]


def _ranks_by_number(members: dict[int, str], leader: int) -> list[int]:
    """Pids of the ranks, in rank order: the fork server's children (forked one after another, rank 0 first)."""
    parents = {}
    for pid in members:
        with open(f"/proc/{pid}/stat") as stat:
            parents[pid] = int(stat.read().rsplit(")", 1)[1].split()[1])
    servers = [pid for pid, parent in parents.items() if parent == leader and "forkserver" in members[pid]]
    return sorted(pid for pid, parent in parents.items() if servers and parent == servers[0])


SMALL = ["--world-size", "3", "--experts", "12", "--hidden-size", "16", "--tokens-per-step", "60",
         "--time-limit", "0.5", "--timeout", "4", "--json"]


@pytest.mark.parametrize("extra, victim", [(["--steps", "100000"], 1),
                                           (["--steps", "30", "--rebalance-every", "6", "--solve-in", "thread"], 2)],
                         ids=["no-rebalancer", "with-rebalancer"])
def test_a_rank_killed_from_outside_is_named_in_the_one_json_object_with_no_traceback(tmp_path, new_session, extra,
                                                                                         victim):
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        session = new_session([sys.executable, str(SCRIPT), *SMALL, *extra], stdout=stdout, stderr=stderr)
    members = session.wait_for(lambda found: len(_ranks_by_number(found, session.sid)) == 3, timeout_s=120)
    time.sleep(0.5)
    os.kill(_ranks_by_number(members, session.sid)[victim], signal.SIGKILL)
    returncode = session.process.wait(timeout=120)
    report = json.loads((tmp_path / "stdout").read_text().strip().splitlines()[-1])
    errors = (tmp_path / "stderr").read_text()
    assert report["failed_rank"] == victim and victim in report["lost_ranks"], report
    assert "Traceback" not in errors and "[W" not in errors, errors
    if "stopped" in report:  # without a rebalancer, or before the survivors could serve the victim's experts
        assert returncode == 1 and f"rank {victim} died" in report["stopped"] + errors
        assert errors.strip().splitlines()[-1].startswith("live_demo: rank")
