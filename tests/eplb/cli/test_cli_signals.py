"""Ctrl-C and SIGTERM stop `eplb place` and `eplb advise` within 2 s at any budget, with the shell's exit status for
the signal, no traceback, and nothing left behind (no output, no temporary file or folder)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MPLBACKEND": "Agg", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    return subprocess.Popen([sys.executable, "-m", "eplb.cli", *map(str, args)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout_s: float = 30.0) -> None:
    """Read the child's stderr until a line holding `text` (its log says the work has begun)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if text in line or not line:
            return
    raise AssertionError(f"no {text!r} on stderr within {timeout_s} s")


def _stop_and_time(proc: subprocess.Popen, signum: int) -> tuple[int, float, str]:
    """Send `signum`; (exit status, seconds until the process ended, the rest of its stderr)."""
    sent = time.monotonic()
    proc.send_signal(signum)
    try:
        status = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - sent
    return status, took, proc.stderr.read()


@pytest.fixture(scope="module")
def trace(tmp_path_factory, run_eplb) -> Path:
    path = tmp_path_factory.mktemp("signals") / "t.npz"
    result = run_eplb("synth", "--out", path, "--steps", "40", "--layers", "8", "--experts", "64", "--top-k", "4",
                      "--tokens-per-step", "512", "--quiet")
    assert result.returncode == 0, result.stderr
    return path


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_place_with_a_huge_cpsat_budget_stops_within_two_seconds(tmp_path, trace, signum):
    proc = _start(["-v", "place", "--trace", trace, "--gpus", "16", "--slots-per-gpu", "5", "--policy", "cpsat",
                   "--work-limit", "100000", "--out", tmp_path / "p.json"], tmp_path)
    _wait_for_line(proc, "steps x")  # the trace is read: the fit starts now
    time.sleep(0.7)
    status, took, stderr = _stop_and_time(proc, signum)
    assert status == 128 + signum and took < 2.0, (status, took, stderr)
    assert "Traceback" not in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and not any((tmp_path / "tmp").iterdir())


def test_advise_with_a_huge_budget_stops_within_two_seconds_and_leaves_no_temporary_folder(tmp_path, trace):
    model = trace.parent / "model.json"
    model.write_text('{"model": {"num_routed_experts": 64, "top_k": 4}}')
    proc = _start(["advise", "--trace", trace, "--model", model, "--work-limit", "3600", "--ep-sizes", "16",
                   "--slots-per-gpu", "5", "--layers", "8", "--scenarios", "none"], tmp_path)
    time.sleep(3.0)  # past the simulator's imports: the replay's fits are running
    status, took, stderr = _stop_and_time(proc, signal.SIGTERM)
    assert status == 128 + signal.SIGTERM and took < 2.0, (status, took, stderr)
    assert "Traceback" not in stderr, stderr
    assert not any((tmp_path / "tmp").iterdir())
