"""Fixtures for every package's tests: a command started in a session of its own, so that a test can find every
process the command starts, at any depth, through /proc (their session id is the command's process id), and no
test leaks one: the fixture kills whatever is left of each session at the end.
"""

import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

PROC = "/proc"


class Session:
    """A command running as the leader of a new session (`start_new_session`), and the processes of that session."""

    def __init__(self, args: list[str], **popen_kwargs) -> None:
        self.process = subprocess.Popen(args, start_new_session=True, **popen_kwargs)
        self.sid = self.process.pid

    def members(self) -> dict[int, str]:
        """The session's processes that still run (zombies left out: they run nothing): pid -> command line."""
        found = {}
        for name in os.listdir(PROC):
            if not name.isdigit():
                continue
            try:
                with open(f"{PROC}/{name}/stat") as stat:
                    # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses
                    state, _, _, session = stat.read().rsplit(")", 1)[1].split()[:4]
                with open(f"{PROC}/{name}/cmdline", "rb") as cmdline:
                    command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, ValueError):  # ended while we looked
                continue
            if int(session) == self.sid and state not in "ZX":
                found[int(name)] = command
        return found

    def wait_for(self, ready: Callable[[dict[int, str]], bool], timeout_s: float) -> dict[int, str]:
        """Poll `members()` until `ready(members)`; return them, or fail with what runs after `timeout_s`."""
        end = time.monotonic() + timeout_s
        while True:
            members = self.members()
            if ready(members):
                return members
            if time.monotonic() > end or self.process.poll() is not None:
                raise AssertionError(f"the session never got ready (leader exit code {self.process.poll()}); "
                                     f"running: {members}")
            time.sleep(0.1)

    def survivors_after(self, seconds: float) -> dict[int, str]:
        """The session's processes still running `seconds` from now (returns early once there are none)."""
        end = time.monotonic() + seconds
        while (members := self.members()) and time.monotonic() < end:
            time.sleep(0.1)
        return members

    def kill_all(self) -> None:
        for pid in self.members():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def new_session():
    """Start a command in a session of its own: `new_session(args, **popen_kwargs) -> Session`; every process of
    every session started is killed when the test ends."""
    if not os.path.exists(f"{PROC}/self/stat"):
        pytest.skip("finds a command's processes through /proc (Linux)")
    started: list[Session] = []

    def start(args: list[str], **popen_kwargs) -> Session:
        started.append(Session(args, **popen_kwargs))
        return started[-1]

    yield start
    for session in started:
        session.kill_all()
