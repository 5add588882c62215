"""Read the integer and float tensors of a `.safetensors` file with numpy alone.

The layout (huggingface/safetensors, "Format"): 8 bytes, a little-endian unsigned 64-bit header length N; N bytes of
UTF-8 JSON mapping each tensor's name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets into the bytes
after the header), with an optional `"__metadata__"` object of strings; then the tensors' bytes, little-endian,
row-major. Reading it here keeps `traces` free of torch and of the `safetensors` package; the TensorRT-LLM
expert-statistic reader (`traces/trtllm_statistics.py`) is its user.

The header is checked against the file before any tensor is read, as the safetensors package checks it: the
tensors' byte ranges follow one another without gap or overlap and end exactly where the file does, so a header
cannot claim more bytes than the file holds. Tensors are read one at a time (`iter_tensors`), never the whole file.
"""

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError

# safetensors dtype names -> numpy dtypes (little-endian); BF16 and the FP8 kinds have no numpy dtype and are refused.
DTYPES = {
    "BOOL": np.dtype("?"), "U8": np.dtype("u1"), "I8": np.dtype("i1"), "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"), "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
}
MAX_HEADER_BYTES = 100 * 2**20  # the limit the safetensors package itself sets on the JSON header


def read_header(file: Path) -> dict[str, dict]:
    """The tensors' entries of `file`'s JSON header: name -> {"dtype", "shape", "data_offsets"} ("__metadata__"
    left out), each checked to hold exactly its shape's bytes, the entries to tile the file's data bytes.

    Raises:
        TraceFormatError: the file is not a safetensors file (the message names the file and what is wrong).
    """
    header, _ = _header_and_start(file)
    return header


def read_tensors(file: Path) -> dict[str, np.ndarray]:
    """Every tensor of `file` as a numpy array of its shape (a copy, native byte order).

    Raises:
        TraceFormatError: not a safetensors file, or a tensor of a dtype numpy lacks (BF16, FP8).
    """
    return dict(iter_tensors(file))


def iter_tensors(file: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, tensor) for every tensor of `file`, in header order, read one at a time (the whole file never is).

    Raises:
        TraceFormatError: as `read_tensors`.
    """
    header, start = _header_and_start(file)
    with open(file, "rb") as handle:
        for name, entry in header.items():
            if entry["dtype"] not in DTYPES:
                raise TraceFormatError(f"{file.name}: tensor {name!r} has dtype {entry['dtype']}; expected one of "
                                       f"{', '.join(DTYPES)}")
            begin, end = entry["data_offsets"]
            handle.seek(start + begin)
            raw = handle.read(end - begin)
            if len(raw) != end - begin:
                raise TraceFormatError(f"{file.name} ended inside tensor {name!r}: it changed while being read")
            array = np.frombuffer(raw, dtype=DTYPES[entry["dtype"]]).reshape(entry["shape"])
            yield name, array.astype(array.dtype.newbyteorder("="))


def _header_and_start(file: Path) -> tuple[dict[str, dict], int]:
    """(tensor entries, offset of the data in the file)."""
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
    data_bytes = size - 8 - length
    for name, entry in header.items():
        _check_entry(file, name, entry, data_bytes)
    _check_tiling(file, header, data_bytes)
    return header, 8 + length


def _check_tiling(file: Path, header: dict[str, dict], data_bytes: int) -> None:
    """Raise unless the entries' byte ranges follow one another from 0 without gap or overlap and end at
    `data_bytes` (what the safetensors package requires): no byte is claimed twice, none left over."""
    ranges = sorted((entry["data_offsets"][0], entry["data_offsets"][1], name) for name, entry in header.items())
    at = 0
    for begin, end, name in ranges:
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves bytes [{at}, {begin}) unclaimed"
            raise TraceFormatError(f"{file.name}: tensor {name!r} at bytes [{begin}, {end}) {what}; a safetensors "
                                   f"file's tensors follow one another; re-save it with the safetensors package")
        at = end
    if at != data_bytes:
        raise TraceFormatError(f"{file.name}: its tensors end at byte {at} of {data_bytes} data bytes; a safetensors "
                               f"file ends with its last tensor; re-save it with the safetensors package")


def _check_entry(file: Path, name: str, entry, data_bytes: int) -> None:
    """Raise unless `entry` names a dtype, a shape of non-negative ints and offsets holding exactly its bytes."""
    where = f"{file.name}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise TraceFormatError(f"{where} lacks dtype, shape or data_offsets in the header; not a safetensors file")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(entry["dtype"], str):
        raise TraceFormatError(f"{where} has dtype {entry['dtype']!r}; expected a name such as I64")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise TraceFormatError(f"{where} has shape {shape!r}; expected a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets):
        raise TraceFormatError(f"{where} has data_offsets {offsets!r}; expected [begin, end]")
    begin, end = offsets
    itemsize = DTYPES[entry["dtype"]].itemsize if entry["dtype"] in DTYPES else None
    if not begin <= end <= data_bytes or (itemsize is not None and end - begin != math.prod(shape) * itemsize):
        raise TraceFormatError(f"{where} spans bytes [{begin}, {end}) of {data_bytes} for shape {shape} of "
                               f"{entry['dtype']}; the file is truncated or not a safetensors file")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
