"""Fixtures for the `eplb` command-line tests: run the real entry point in a subprocess, and a small trace.

The small shape (60 steps x 3 layers x 32 experts, top-4, 256 tokens per step on 8 GPUs x 5 slots) keeps each
call well under a second.
"""

import contextlib
import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL_SYNTH = ("--steps", "60", "--layers", "3", "--experts", "32", "--top-k", "4", "--tokens-per-step", "256")
SMALL_CLUSTER = ("--gpus", "8", "--slots-per-gpu", "5")


def _eplb_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["MPLBACKEND"] = "Agg"
    return env


def _run_eplb(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m eplb.cli ARGS` in `cwd` (default: the repository root) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "eplb.cli", *map(str, args)],
        cwd=cwd or REPO_ROOT, env=_eplb_env(), capture_output=True, text=True, timeout=120,
    )


def _run_eplb_tty_stderr(*args: str) -> tuple[int, str]:
    """Run `python -m eplb.cli ARGS` with stderr on a pseudo-terminal (so progress bars may draw).

    Returns the exit status and everything written to stderr.
    """
    master, slave = pty.openpty()
    # A fresh pty reports 0 x 0 characters, and tqdm trims its bar to that width; give it a real size.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "eplb.cli", *map(str, args)], cwd=REPO_ROOT, env=_eplb_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="session")
def run_eplb():
    """`run_eplb(*args, cwd=None) -> CompletedProcess`: the real `eplb` entry point in a subprocess."""
    return _run_eplb


def _assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 2, stdout empty, stderr one non-empty line (no traceback) that contains `expected`."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, f"exit {result.returncode}; stderr: {result.stderr}"
    assert len(lines) == 1, f"stderr has {len(lines)} lines: {result.stderr!r}"
    assert lines[0].startswith("eplb") and expected in lines[0], f"{expected!r} not in {lines[0]!r}"
    assert result.stdout == "", f"stdout on error: {result.stdout!r}"


@pytest.fixture(scope="session")
def one_line_error():
    """`one_line_error(result, expected)`: assert exit 2 with one stderr line holding `expected`, no traceback."""
    return _assert_one_line_error


def _run_eplb_here(*args: str) -> subprocess.CompletedProcess:
    """`eplb.cli.main.main(ARGS)` in this process, its output captured: the same code path as the console script, without
    a Python start-up per call (for the long tables of bad inputs)."""
    from eplb.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = main([str(arg) for arg in args])
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code
    return subprocess.CompletedProcess(list(args), status, stdout.getvalue(), stderr.getvalue())


@pytest.fixture(scope="session")
def run_eplb_here():
    """`run_eplb_here(*args) -> CompletedProcess`: `eplb.cli.main.main` in this process, output captured."""
    return _run_eplb_here


@pytest.fixture(scope="session")
def run_eplb_tty_stderr():
    """`run_eplb_tty_stderr(*args) -> (status, stderr)`: the entry point with stderr on a pseudo-terminal."""
    return _run_eplb_tty_stderr


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory) -> Path:
    """A synthetic [60, 3, 32] trace written by `eplb synth`."""
    path = tmp_path_factory.mktemp("small") / "trace.npz"
    result = _run_eplb("synth", "--out", path, *SMALL_SYNTH, "--seed", "3", "--quiet")
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="session")
def small_placement(small_trace) -> Path:
    """A deepseek placement of `small_trace` on 8 GPUs x 5 slots, written by `eplb place`."""
    path = small_trace.parent / "placement.json"
    result = _run_eplb("place", "--trace", small_trace, *SMALL_CLUSTER, "--out", path, "--quiet")
    assert result.returncode == 0, result.stderr
    return path
