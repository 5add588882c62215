"""The CPU pacer: a paced process runs about its share of the time, is left running when the pacer stops, and the
pacer exits by itself when its target is gone."""

import os
import signal
import subprocess
import sys
import time

import pytest

from eplb.live.cpu_pacer import start_pacer, stop_pacer

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="pacing needs SIGSTOP (POSIX)")

# A child that starts its own pacer, spins for a while of wall time, and prints the CPU seconds it got meanwhile.
SPINNER = """
import sys, time
sys.path.insert(0, {root!r})
from eplb.live.cpu_pacer import start_pacer, stop_pacer
cpu = time.process_time()
pacer = start_pacer({share})
began = time.monotonic()
while time.monotonic() - began < {seconds}:
    pass
stop_pacer(pacer)
print(time.process_time() - cpu)
"""


def cpu_seconds_of_spinner(share: float, seconds: float) -> float:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-c", SPINNER.format(root=root, share=share, seconds=seconds)],
                         capture_output=True, text=True, timeout=60, check=True)
    return float(out.stdout.split()[-1])


def test_a_paced_process_runs_about_its_share_of_the_time():
    paced = cpu_seconds_of_spinner(0.25, 2.0)
    # 2 s of wall time at a quarter share: about 0.5 s of CPU; unpaced it would be about 2 s. The bounds leave room
    # for a busy machine.
    assert 0.2 < paced < 1.2


def test_no_pacer_for_a_full_share_and_a_share_must_be_positive():
    assert start_pacer(1.0) is None
    with pytest.raises(ValueError, match="share must be > 0"):
        start_pacer(0.0)


def test_the_target_is_left_running_and_a_pacer_whose_target_died_exits():
    # The pacer paces its parent: here a shell that sleeps; once the shell is killed the pacer must exit alone.
    code = ("import sys; sys.path.insert(0, %r); from eplb.live.cpu_pacer import start_pacer; "
            "p = start_pacer(0.2); print(p.pid, flush=True); import time; time.sleep(60)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    parent = subprocess.Popen([sys.executable, "-c", code % root], stdout=subprocess.PIPE, text=True)
    try:
        pacer_pid = int(parent.stdout.readline())
        time.sleep(0.3)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pacer_pid):
            time.sleep(0.05)
        assert not _alive(pacer_pid)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_stop_leaves_the_process_running():
    pacer = start_pacer(0.1)
    try:
        time.sleep(0.2)
    finally:
        stop_pacer(pacer)
    began = time.process_time()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    assert time.process_time() - began > 0.2  # not paused: it got (nearly) all of the 0.3 s


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
