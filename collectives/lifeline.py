"""Child processes that end with their parent, however the parent ends: an exception, a signal, SIGKILL, `os._exit`.

A parent killed outright (SIGKILL, the OOM killer) runs no cleanup; a child it started would be re-parented to
init and live on, idle, holding its memory, threads and sockets. So every child this project starts (the ranks of
`run_local_group`, the rebalancer's solver helper) calls `end_with_parent` first thing, with the two values its
parent took from `parent_of_child` in the thread that started it:

- on Linux, the kernel's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) kills the child the moment its
  parent ends, even while the child is stopped or busy in native code. The kernel sends it when the *thread* that
  started the child ends, not the process, so it is asked for only when the parent started the child from its
  main thread (which CPython ends only with the process);
- on every POSIX OS, a watchdog thread compares the parent's id with `os.getppid()` every WATCH_PERIOD_S: an orphan
  is re-parented (to init or a subreaper), so a changed id means the parent is gone, and the child leaves at once
  (`os._exit`: its own cleanup may wait on the parent, which cannot answer).

The parent's id is checked once right after the signal is asked for: the kernel sends it only on a death that comes
later, and the parent may have ended while the child started. A child also ignores SIGINT: Ctrl-C reaches the
whole foreground process group, and the parent decides what ends and stops its children itself.

The parent's side is `exit_on_signals`: SIGTERM and SIGINT unwind its main thread (`SystemExit`), so that the
`finally` blocks that stop its children run, and it exits with the shell's status for the signal (128 + its
number) instead of a traceback.

Only the standard library is imported here, so that a process that must not import torch (the solver's helper) can
use this module.
"""

import ctypes
import os
import signal
import sys
import threading
import time

WATCH_PERIOD_S = 0.5  # how often the watchdog looks at the parent's id: the longest an orphan outlives its parent
ORPHANED_EXIT_CODE = 1  # the exit status of a child whose parent is gone (nobody is left to read it)
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def parent_of_child() -> tuple[int, bool]:
    """In the parent, in the thread that starts a child: (this process's id, whether this thread is the main thread),
    the arguments of the child's `end_with_parent`."""
    return os.getpid(), threading.current_thread() is threading.main_thread()


def end_with_parent(parent_pid: int, started_from_main_thread: bool, period_s: float = WATCH_PERIOD_S) -> None:
    """In a child, first thing: end this process (`os._exit`) when the process `parent_pid` ends, and at once if it
    has already ended; ignore SIGINT from now on (when called from the main thread, which alone may set handlers).

    Args:
        parent_pid: the parent's process id, as the parent saw it (`parent_of_child`).
        started_from_main_thread: the parent started this child from its main thread, so that the kernel's
            parent-death signal, sent when that thread ends, comes only when the whole parent ends.
        period_s: how often the watchdog thread checks the parent's id.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if started_from_main_thread:
        ask_for_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(ORPHANED_EXIT_CODE)
    threading.Thread(target=_watch_parent, args=(parent_pid, period_s), name="end-with-parent", daemon=True).start()


def ask_for_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when the thread that started it ends (Linux); True if it will."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                          ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):  # no libc to load, or no prctl in it: the watchdog alone remains
        return False


def exit_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """In a parent's main thread: make each of `signums` raise `SystemExit(128 + signal number)` once, so that the
    `finally` blocks that stop its children run and it exits quietly with the shell's status for the signal; a
    second such signal, during that cleanup, takes its default action (its children end with it regardless)."""

    def stop(signum: int, frame) -> None:
        signal.signal(signum, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    for signum in signums:
        signal.signal(signum, stop)


def _watch_parent(parent_pid: int, period_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(period_s)
    os._exit(ORPHANED_EXIT_CODE)
