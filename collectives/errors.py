"""Errors of the communicator: every failed or timed-out collective raises one of these on every surviving rank."""

from traces.errors import EplbError


class CollectiveError(EplbError):
    """A collective or point-to-point transfer failed: a peer died, closed its connection, or the backend broke."""


class CollectiveTimeoutError(CollectiveError):
    """A collective did not complete within the communicator's timeout: a peer hangs or never joined."""


class BackendUnavailableError(EplbError):
    """The backend a device needs cannot be used here (for example HCCL without the `torch_npu` package)."""
