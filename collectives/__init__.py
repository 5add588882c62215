"""A small communicator over torch.distributed for NCCL (CUDA), HCCL (Ascend, through torch_npu) and Gloo (CPU)."""

from collectives.backend import backend_for
from collectives.communicator import DEFAULT_TIMEOUT_S, Communicator, PendingExchange, init_communicator
from collectives.errors import BackendUnavailableError, CollectiveError, CollectiveTimeoutError
from collectives.local_group import free_port, run_local_group

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "BackendUnavailableError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "Communicator",
    "PendingExchange",
    "backend_for",
    "free_port",
    "init_communicator",
    "run_local_group",
]
