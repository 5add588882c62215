"""`collectives.lifeline`: a child ends with its parent killed outright, through the kernel's parent-death signal or
through its watchdog alone, and at once if the parent is gone before it asks; a parent with `exit_on_signals` runs
its cleanup on SIGTERM and exits 128 + 15, quietly."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.lifeline import ORPHANED_EXIT_CODE

ROOT = str(Path(__file__).resolve().parents[2])

# A parent that starts a child calling end_with_parent (from the parent's main thread, or from another thread that
# lives on), tells the test both are up, then waits to be killed. The child spins, holding the interpreter lock,
# as a busy rank would.
PARENT = """
import os, subprocess, sys, threading, time
sys.path.insert(0, {root!r})
from collectives.lifeline import parent_of_child

CHILD = '''
import sys
sys.path.insert(0, {root!r})
from collectives.lifeline import end_with_parent
end_with_parent(int(sys.argv[1]), sys.argv[2] == "1")
print("up", flush=True)
while True:
    pass
'''

def start():
    pid, main = parent_of_child()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(pid), str(int(main))], stdout=subprocess.PIPE)
    child.stdout.readline()
    print(child.pid, flush=True)

if {from_main_thread}:
    start()
else:
    threading.Thread(target=lambda: (start(), time.sleep(600))).start()
time.sleep(600)
"""


@pytest.mark.parametrize("from_main_thread", [True, False], ids=["parent-death-signal", "watchdog-alone"])
def test_a_child_ends_with_its_parent_killed_outright(new_session, from_main_thread):
    session = new_session([sys.executable, "-c", PARENT.format(root=ROOT, from_main_thread=from_main_thread)],
                          stdout=subprocess.PIPE, text=True)
    child_pid = int(session.process.stdout.readline())
    assert child_pid in session.members()
    if from_main_thread:  # stopped, the child's watchdog cannot run: only the kernel's signal can end it
        os.kill(child_pid, signal.SIGSTOP)
    session.process.kill()
    session.process.wait()
    assert session.survivors_after(5.0) == {}


def test_a_child_whose_parent_is_already_gone_leaves_at_once():
    # The parent named is not this child's parent: as if it had died before the child asked for the signal.
    code = f"import sys; sys.path.insert(0, {ROOT!r}); from collectives.lifeline import end_with_parent; " \
           "end_with_parent(1, True); print('still here')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == ORPHANED_EXIT_CODE and result.stdout == ""


def test_sigterm_runs_the_parents_cleanup_and_exits_143_without_a_traceback(new_session):
    code = f"""
import sys, time
sys.path.insert(0, {ROOT!r})
from collectives.lifeline import exit_on_signals
exit_on_signals()
try:
    print("up", flush=True)
    time.sleep(60)
finally:
    print("cleaned up", flush=True)
"""
    session = new_session([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert session.process.stdout.readline() == "up\n"
    os.kill(session.process.pid, signal.SIGTERM)
    out, err = session.process.communicate(timeout=30)
    assert session.process.returncode == 128 + signal.SIGTERM
    assert out == "cleaned up\n" and err == ""

