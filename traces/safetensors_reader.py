"""The tensors of a `.safetensors` file through the `safetensors` package's numpy API, behind one-line errors.

The package checks the header against the file before any tensor is read (a header of at most 100 MiB, tensors that
follow one another and end where the file does, so a header cannot claim more bytes than the file holds) and maps
the file rather than reading it whole; this module turns its errors into `TraceFormatError`s that name the file and
say what to do, and refuses the dtypes numpy lacks (BF16, FP8). The TensorRT-LLM expert-statistic reader
(`traces/trtllm_statistics.py`) is its user.

`read_header` alone reads the JSON header itself (8 bytes of length, then the JSON): to list a file's tensors the
package maps the whole file, and a mapping counts against an address-space limit (`ulimit -v`, RLIMIT_AS) though it
costs no memory, so a small file claiming gigabytes would fail there with an allocation error before the callers'
bounds on what the header claims (`routing_trace.check_read_shape`) could refuse it in one line.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from traces.errors import TraceFormatError

MAX_HEADER_BYTES = 100 * 2**20  # the limit the safetensors package itself sets on the JSON header
# The safetensors dtype names numpy reads; BF16 and the FP8 kinds have no numpy dtype and are refused.
NUMPY_DTYPES = ("BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64")


def read_header(file: Path) -> dict[str, dict]:
    """name -> {"dtype": the safetensors dtype name, "shape": [int, ...]} of every tensor of `file`, as its header
    claims them, with nothing mapped and no tensor read; the package checks the claims against the file when the
    tensors are read (`iter_tensors`).

    Raises:
        TraceFormatError: the file is not a safetensors file (the message names the file and what is wrong).
    """
    size = file.stat().st_size
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise TraceFormatError(f"{file.name} is not a safetensors file: its first 8 bytes give a header of "
                                   f"{length} bytes in a file of {size}")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise TraceFormatError(f"{file.name} is not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise TraceFormatError(f"{file.name} is not a safetensors file: its header is a JSON "
                               f"{type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    entries = {}
    for name, entry in header.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and isinstance(entry.get("shape"), list)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["shape"])):
            raise TraceFormatError(f"{file.name}: tensor {name!r} has no dtype name and shape of non-negative "
                                   f"integers in the header; not a safetensors file")
        entries[name] = {"dtype": entry["dtype"], "shape": entry["shape"]}
    return entries


def iter_tensors(file: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, tensor) for every tensor of `file`, in the file's order, read one at a time (the file is mapped, never
    read whole).

    Raises:
        TraceFormatError: not a safetensors file, or a tensor of a dtype numpy lacks (BF16, FP8).
    """
    with _opened(file) as handle:
        for name in handle.keys():
            dtype = handle.get_slice(name).get_dtype()
            if dtype not in NUMPY_DTYPES:
                raise TraceFormatError(f"{file.name}: tensor {name!r} has dtype {dtype}; expected one of "
                                       f"{', '.join(NUMPY_DTYPES)}")
            yield name, _read(file, handle, name)


def read_tensors(file: Path) -> dict[str, np.ndarray]:
    """Every tensor of `file` as a numpy array of its shape (native byte order).

    Raises:
        TraceFormatError: as `iter_tensors`.
    """
    return dict(iter_tensors(file))


@contextmanager
def _opened(file: Path):
    try:
        with safe_open(str(file), framework="numpy") as handle:
            yield handle
    except SafetensorError as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise TraceFormatError(f"{file.name} is not a safetensors file ({reason}); it is truncated or was not written "
                               f"by the safetensors package: copy it again") from None


def _read(file: Path, handle, name: str) -> np.ndarray:
    try:
        tensor = handle.get_tensor(name)
    except (SafetensorError, OSError) as exc:  # the file changed under the map
        raise TraceFormatError(f"{file.name}: tensor {name!r} could not be read ({exc}); copy the file again") from None
    return tensor.astype(tensor.dtype.newbyteorder("="), copy=False)
