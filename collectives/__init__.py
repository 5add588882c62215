"""A small communicator over torch.distributed for NCCL (CUDA), HCCL (Ascend, through torch_npu) and Gloo (CPU).

The names are imported on first access (PEP 562), so that a process that needs no torch (the rebalancer's solver
helper) can import `collectives.lifeline` without it.
"""

from traces.lazy_exports import lazy_getattr

_NAMES = {  # name -> the module that defines it
    "DEFAULT_TIMEOUT_S": "collectives.communicator",
    "Communicator": "collectives.communicator",
    "PendingExchange": "collectives.communicator",
    "init_communicator": "collectives.communicator",
    "BackendUnavailableError": "collectives.errors",
    "CollectiveError": "collectives.errors",
    "CollectiveTimeoutError": "collectives.errors",
    "backend_for": "collectives.backend",
    "end_with_parent": "collectives.lifeline",
    "exit_on_signals": "collectives.lifeline",
    "parent_of_child": "collectives.lifeline",
    "free_port": "collectives.local_group",
    "run_local_group": "collectives.local_group",
    "start_local_group_server": "collectives.local_group",
}

__all__ = sorted(_NAMES)


__getattr__ = lazy_getattr(__name__, _NAMES)
