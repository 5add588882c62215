"""`scripts/live_demo.py` runs a real 3-process Gloo decode loop and reports the contract keys: outputs equal the
dense layer, no token lost, the measured imbalance equal to the planned one; with a rebalancer, its per-step times
written where asked, and a path it cannot write refused before anything runs."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "live_demo.py"
KEYS = {"steps", "world_size", "routing", "max_abs_err_vs_dense", "imbalance_measured", "imbalance_planned",
        "tokens_lost"}


@pytest.mark.parametrize("routing", ["dynamic", "oblivious"])
def test_live_demo_prints_the_contract_keys_last_with_no_token_lost(routing):
    result = subprocess.run([sys.executable, str(SCRIPT), "--world-size", "3", "--steps", "3", "--experts", "12",
                             "--hidden-size", "16", "--tokens-per-step", "60", "--time-limit", "0.5",
                             "--routing", routing, "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert KEYS <= report.keys()
    assert report["steps"] == 3 and report["world_size"] == 3 and report["routing"] == routing
    assert report["max_abs_err_vs_dense"] <= 1e-5 and report["tokens_lost"] == 0
    assert report["imbalance_measured"] == report["imbalance_planned"]


def test_live_demo_rebalances_and_survives_a_killed_rank(tmp_path):
    times_file = tmp_path / "step_times.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--world-size", "3", "--steps", "36", "--experts", "12",
                             "--hidden-size", "16", "--tokens-per-step", "60", "--time-limit", "0.5",
                             "--rebalance-every", "6", "--rebalance-policy", "deepseek", "--solve-in", "thread",
                             "--fail-rank", "1", "--step-times", str(times_file),
                             "--fail-at-step", "26", "--timeout", "4", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"steps", "world_size", "max_abs_err_vs_dense", "imbalance_before", "imbalance_after", "rebalances",
            "bytes_moved", "tokens_lost", "requests_requeued", "failed_rank", "decode_steps_waiting_on_rebalance",
            "step_time_p99_ratio"} <= report.keys()
    assert report["steps"] == 36 and report["world_size"] == 3 and report["failed_rank"] == 1
    assert report["max_abs_err_vs_dense"] <= 1e-5 and report["tokens_lost"] == 0
    assert report["rebalances"] >= 1 and report["bytes_moved"] > 0 and report["requests_requeued"] > 0
    assert report["survivors"] == [0, 2]
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
    (["--rebalance-every", "5", "--step-times", "."], "is a folder"),
])
def test_live_demo_refuses_a_step_times_file_it_cannot_write(tmp_path, extra, message):
    result = subprocess.run([sys.executable, str(SCRIPT), "--steps", "3", *extra], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
