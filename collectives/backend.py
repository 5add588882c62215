"""Which torch.distributed backend serves a device: CUDA -> NCCL, Ascend NPU -> HCCL, CPU -> Gloo.

`torch_npu` (Huawei's Ascend adapter, which registers the `npu` device and the HCCL backend) is imported only when
an NPU is asked for, so CPU and CUDA users never need it.
"""

import importlib

import torch

from collectives.errors import BackendUnavailableError

BACKEND_OF_DEVICE_TYPE = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}


def backend_for(device: torch.device | str) -> str:
    """The backend name for `device` ("cuda", "cuda:3", "npu:0", "cpu"); raises for other device types."""
    try:
        kind = "npu" if str(device).startswith("npu") else torch.device(device).type
    except RuntimeError:
        kind = str(device)
    if kind not in BACKEND_OF_DEVICE_TYPE:
        raise BackendUnavailableError(
            f"device {device!s} has no collective backend here; expected one of: cuda (NCCL), npu (HCCL), cpu (Gloo)"
        )
    if kind == "npu":
        require_torch_npu()
    elif kind == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(f"device {device!s} needs CUDA, which this torch build or machine lacks")
    return BACKEND_OF_DEVICE_TYPE[kind]


def require_torch_npu() -> None:
    """Import `torch_npu` (it registers the `npu` device and HCCL), or say how to get it."""
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        raise BackendUnavailableError(
            "device npu needs the torch_npu package (Huawei Ascend's PyTorch adapter, which provides HCCL): "
            "install the torch_npu build that matches your torch and CANN versions"
        ) from exc
