"""Errors of the communicator: every failed or timed-out collective raises one of these on every surviving rank."""

from traces.errors import EplbError


class CollectiveError(EplbError):
    """A collective or point-to-point transfer failed: a peer died, closed its connection, or the backend broke."""


class RankDiedError(CollectiveError):
    """A rank's process ended without a word (killed, or crashed in native code): what a local group's launcher
    reports for it (`local_group.run_local_group`). `rank` is the rank, `exitcode` its process's exit code (-9:
    SIGKILL)."""

    def __init__(self, rank: int, exitcode: int | None) -> None:
        super().__init__(f"rank {rank} died (exit code {exitcode})")
        self.rank, self.exitcode = rank, exitcode

    def __reduce__(self):
        return type(self), (self.rank, self.exitcode)


class CollectiveTimeoutError(CollectiveError):
    """A collective did not complete within the communicator's timeout: a peer hangs or never joined."""


class BackendUnavailableError(EplbError):
    """The backend a device needs cannot be used here (for example HCCL without the `torch_npu` package)."""
