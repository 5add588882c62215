"""A cap on the CPU share of the background solve: a tiny watcher process pauses the solver's helper process
(SIGSTOP) and resumes it (SIGCONT) in a fixed cycle while a job runs.

Where decode ranks fill every core (several ranks per core on a CPU host), any runnable background work delays the
ranks' wake-ups between collectives, whatever its priority (nice or SCHED_IDLE alike), for as long as it is
runnable; a cap bounds that time, at the cost of a longer solve. A host with cores to spare (a GPU host) wants no
cap. The watcher is its own process, started once by the helper for itself (by path, so that it imports nothing
of this package), and idle between jobs: the helper switches the pacing on (SIGUSR1) when a job starts and off
(SIGUSR2) when it ends, so a job's start costs no process start-up beside decode. The watcher never leaves the
helper paused: it resumes it whenever pacing stops, and exits when asked (SIGTERM) or when the helper is gone (within
IDLE_CHECK_S, however the helper ended); it ignores SIGINT, which Ctrl-C sends the whole process group, and leaves
that to the processes above it.

Run as a script: python cpu_pacer.py TARGET_PID SHARE PERIOD_S (it prints a line once it takes the switches)
"""

import os
import signal
import subprocess
import sys

PERIOD_S = 0.02  # one pause-and-resume cycle: short against a decode step, long against a context switch
IDLE_CHECK_S = 1.0  # how often an idle watcher checks that its target lives
ON, OFF, STOP = signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM


class Pacer:
    """The helper's handle on its watcher: `on()` when a job starts, `off()` when it ends (the helper is running
    when `off` returns: the watcher resumes it within one cycle), `close()` at the end.

    Args:
        share: the share of each cycle the helper may run, in (0, 1); 1 or more: no watcher, and on/off do nothing.

    Raises:
        ValueError: share is not positive, or this OS cannot pause a process (no SIGSTOP).
    """

    def __init__(self, share: float, period_s: float = PERIOD_S) -> None:
        if share <= 0:
            raise ValueError(f"share must be > 0; got {share:g}")
        self.watcher: subprocess.Popen | None = None
        if share >= 1:
            return
        if not hasattr(signal, "SIGSTOP"):
            raise ValueError("a CPU share below 1 needs SIGSTOP/SIGCONT (a POSIX OS); set the share to 1")
        self.watcher = subprocess.Popen([sys.executable, "-S", "-I", os.path.abspath(__file__), str(os.getpid()),
                                         repr(share), repr(period_s)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, close_fds=True)
        # Wait for the watcher to take its signals (a line, or its end): until then a switch would kill it (the
        # default action of SIGUSR1), and the helper would go unpaced.
        with self.watcher.stdout:
            self.watcher.stdout.readline()

    def on(self) -> None:
        self._signal(ON)

    def off(self) -> None:
        self._signal(OFF)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the watcher; the helper is left running."""
        if self.watcher is None:
            return
        stop_process(self.watcher, timeout_s)
        self.watcher = None

    def _signal(self, signum: int) -> None:
        if self.watcher is not None and self.watcher.poll() is None:
            self.watcher.send_signal(signum)


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """Ask `process` to end (SIGTERM), kill it if it has not within `timeout_s`, and reap it."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def pace(target_pid: int, share: float, period_s: float) -> None:
    """The watcher: while switched on, let `target_pid` run `share` of each `period_s`; leave it running when
    switched off, asked to stop, or the target is gone. The target is this process's parent (the helper starts its
    own watcher): once it has died this process has another parent, which is how a target that is a zombie
    (killed, not yet reaped) is noticed. Signals are taken synchronously (`sigtimedwait`), so a switch takes effect
    at once, also in the middle of a pause."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {ON, OFF, STOP})
    try:
        os.write(sys.stdout.fileno(), b"ready\n")  # the switches can come now (the pacer waits for this line)
    except OSError:  # the helper is gone already
        return
    active = False
    running_s, paused_s = share * period_s, (1 - share) * period_s

    def wait(seconds: float) -> int | None:
        info = signal.sigtimedwait({ON, OFF, STOP}, seconds)
        return None if info is None else info.si_signo

    try:
        while os.getppid() == target_pid:
            got = wait(running_s if active else IDLE_CHECK_S)
            if got is None and active:
                os.kill(target_pid, signal.SIGSTOP)
                got = wait(paused_s)
                os.kill(target_pid, signal.SIGCONT)
            if got == STOP:
                return
            if got is not None:
                active = got == ON
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(target_pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    pace(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
