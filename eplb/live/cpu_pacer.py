"""A cap on the CPU share of the background solve: a tiny watcher process pauses the solver's helper process
(SIGSTOP) and resumes it (SIGCONT) in a fixed cycle while a job runs.

Where decode ranks fill every core (several ranks per core on a CPU host), any runnable background work delays the
ranks' wake-ups between collectives, whatever its priority (nice or SCHED_IDLE alike), for as long as it is
runnable; a cap bounds that time, at the cost of a longer solve. A host with cores to spare (a GPU host) wants no
cap. The watcher is its own process, started by path so that it imports nothing of this package (a few
milliseconds to start), started by the helper for itself, and it never leaves the helper paused: it resumes it and
exits when asked to stop (SIGTERM), or at once when the helper is gone.

Run as a script: python cpu_pacer.py TARGET_PID SHARE PERIOD_S
"""

import os
import signal
import subprocess
import sys
import time

PERIOD_S = 0.02  # one pause-and-resume cycle: short against a decode step, long against a context switch


def start_pacer(share: float, period_s: float = PERIOD_S) -> subprocess.Popen | None:
    """Start pacing this process to `share` of each `period_s` (None for a share of 1 or more: nothing to do).

    Raises:
        ValueError: share is not positive, or this OS cannot pause a process (no SIGSTOP).
    """
    if share <= 0:
        raise ValueError(f"share must be > 0; got {share:g}")
    if share >= 1:
        return None
    if not hasattr(signal, "SIGSTOP"):
        raise ValueError("a CPU share below 1 needs SIGSTOP/SIGCONT (a POSIX OS); set the share to 1")
    return subprocess.Popen([sys.executable, "-S", "-I", os.path.abspath(__file__), str(os.getpid()), repr(share),
                             repr(period_s)], stdin=subprocess.DEVNULL, close_fds=True)


def stop_pacer(pacer: subprocess.Popen | None, timeout_s: float = 5.0) -> None:
    """Stop a pacer; its target is running when this returns (the pacer resumes it on the way out)."""
    if pacer is None:
        return
    pacer.terminate()
    try:
        pacer.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pacer.kill()
        pacer.wait()


def pace(target_pid: int, share: float, period_s: float) -> None:
    """Let `target_pid` run `share` of each `period_s`, until SIGTERM or until the target is gone; leave it
    running. The target is this process's parent (the helper starts its own pacer): once it has died, this
    process has another parent, which is how a target that is a zombie (killed, not yet reaped) is noticed."""
    stopping = False

    def request_stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    running_s, paused_s = share * period_s, (1 - share) * period_s
    try:
        while not stopping and os.getppid() == target_pid:
            time.sleep(running_s)
            if stopping or os.getppid() != target_pid:
                break
            os.kill(target_pid, signal.SIGSTOP)
            time.sleep(paused_s)
            os.kill(target_pid, signal.SIGCONT)
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(target_pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    pace(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
