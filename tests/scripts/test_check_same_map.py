"""`scripts/check_same_map.py`: bad flags refused in one line with exit 2 before any process starts, and a signal to
the parent alone ends every process it started (its children watch it)."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_same_map.py"
BAD_FLAGS = [["--work-limit", "nan"], ["--work-limit", "-1"], ["--work-limit", "0"], ["--work-limit", "inf"],
             ["--work-limit", "1e300"], ["--time-limit", "-5"], ["--time-limit", "1e300"], ["--processes", "1"],
             ["--processes", "1000"], ["--busy", "-1"], ["--work-limit", "1", "--time-limit", "1"],
             ["--json", "README.md"], ["--no-such-flag"]]


@pytest.mark.parametrize("flags", BAD_FLAGS, ids=[" ".join(f) for f in BAD_FLAGS])
def test_a_bad_flag_is_refused_in_one_line(load_script, capsys, monkeypatch, flags):
    check = load_script("check_same_map")
    monkeypatch.chdir(SCRIPT.parents[1])  # README.md is the repository's own
    with pytest.raises(SystemExit) as exit_info:
        check.main(flags)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def _children_up(members: dict[int, str]) -> bool:
    """The parent, its busy loop and both map processes are running."""
    return sum("--one" in command for command in members.values()) == 2 and len(members) >= 4


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_to_the_parent_alone_ends_every_process_it_started(new_session, signum):
    session = new_session([sys.executable, str(SCRIPT), "--processes", "2", "--busy", "1", "--work-limit", "0.1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session.wait_for(_children_up, timeout_s=60)
    session.process.send_signal(signum)
    session.process.wait(timeout=30)
    assert session.survivors_after(10.0) == {}
