"""The CPU pacer: a paced process runs about its share of the time while pacing is on and all of it while off, is
left running when the watcher stops, a watcher switched on the moment it is started survives the switch, and a
watcher whose target was killed exits by itself within 5 s."""

import os
import signal
import subprocess
import sys
import time

import pytest

from eplb.rebalance.cpu_pacer import Pacer

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="pacing needs SIGSTOP (POSIX)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A child that starts its own watcher, spins for a while of wall time with pacing on, then off, and prints the CPU
# seconds it got in each.
SPINNER = """
import sys, time
sys.path.insert(0, {root!r})
from eplb.rebalance.cpu_pacer import Pacer

def spin(seconds):
    cpu, began = time.process_time(), time.monotonic()
    while time.monotonic() - began < seconds:
        pass
    return time.process_time() - cpu

pacer = Pacer({share})
time.sleep(0.5)  # the watcher's start-up
pacer.on()
paced = spin({seconds})
pacer.off()
free = spin({seconds})
pacer.close()
print(paced, free)
"""


def test_a_paced_process_runs_about_its_share_of_the_time_and_all_of_it_when_pacing_is_off():
    out = subprocess.run([sys.executable, "-c", SPINNER.format(root=ROOT, share=0.25, seconds=2.0)],
                         capture_output=True, text=True, timeout=60, check=True)
    paced, free = map(float, out.stdout.split())
    # The same 2 s of wall time paced at a quarter share, then unpaced: the paced CPU time is about a quarter of
    # the unpaced, whatever share of a core the machine's load leaves the process (a ratio, not a rate).
    assert free > 0
    assert 0.1 < paced / free < 0.5


def test_no_watcher_for_a_full_share_and_a_share_must_be_positive():
    pacer = Pacer(1.0)
    assert pacer.watcher is None
    pacer.on(), pacer.off(), pacer.close()
    with pytest.raises(ValueError, match="share must be > 0"):
        Pacer(0.0)


def test_a_watcher_whose_target_died_exits_by_itself():
    code = ("import sys; sys.path.insert(0, %r); from eplb.rebalance.cpu_pacer import Pacer; "
            "p = Pacer(0.2); p.on(); print(p.watcher.pid, flush=True); import time; time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code % ROOT], stdout=subprocess.PIPE, text=True)
    try:
        watcher_pid = int(parent.stdout.readline())
        time.sleep(0.5)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(watcher_pid):
            time.sleep(0.05)
        assert not _alive(watcher_pid)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_watcher_switched_on_the_moment_it_starts_survives_the_switch():
    pacer = Pacer(0.5)
    try:
        pacer.on()  # before the watcher took its signals, SIGUSR1's default action would end it
        time.sleep(0.3)
        assert pacer.watcher.poll() is None
    finally:
        pacer.close()


CLOSE_THEN_SPIN = """
import sys, time
sys.path.insert(0, {root!r})
from eplb.rebalance.cpu_pacer import Pacer

pacer = Pacer(0.1)
pacer.on()
time.sleep(0.3)
pacer.close()
cpu, began = time.process_time(), time.monotonic()
while time.monotonic() - began < 0.5:
    pass
print(time.process_time() - cpu)
"""


def test_close_leaves_the_process_running():
    # A process left stopped would never print: the timeout fails the test instead of hanging it.
    out = subprocess.run([sys.executable, "-c", CLOSE_THEN_SPIN.format(root=ROOT)], capture_output=True, text=True,
                         timeout=60, check=True)
    assert float(out.stdout) > 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
