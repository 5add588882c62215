"""Read and write routing traces in every supported format.

Formats (chosen by suffix and content):
- native `.npz`: array `counts` [T, L, E] plus `header_json` (a 0-d string array holding the TraceHeader);
- plain `.npy`: one array [T, L, E];
- SGLang expert-distribution dump `.pt`, stat mode (`logical_count`) or detail mode (`records`): the recorded steps
  and the MoE layers (`traces/sglang_dump.py`; what it leaves out is logged as a warning);
- top-k id log `.npz` (as the ESFT routing logs): arrays `<task>_topk_ids` [L, N, K], grouped into steps of
  `tokens_per_step` tokens; tasks are concatenated in file order unless `tasks` picks some;
- TensorRT-LLM expert-statistic dump: a directory holding `meta_info.json` and `rank<r>.safetensors`
  (`traces/trtllm_statistics.py`), the ranks' counts summed.

Every array's shape is read from its header and checked (`routing_trace.MAX_READ_VALUES`) before the array is: a
compressed `.npz` of a few kilobytes may claim gigabytes.
"""

import json
import logging
import os
import zipfile
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from traces.atomic_file import write_atomically
from traces.errors import TraceFormatError
from traces.routing_trace import MAX_READ_VALUES, RoutingTrace, TraceHeader, check_read_shape, validate_counts
from traces.sglang_dump import read_sglang_dump
from traces.topk_log import counts_from_topk_ids, topk_tasks
from traces.trtllm_statistics import META_FILE, load_trtllm_statistics

logger = logging.getLogger(__name__)
MAX_TEXT_BYTES = 1 << 20  # the most a text array (header_json) may hold
SUPPORTED = (".npz (counts or <task>_topk_ids), .npy [T, L, E], an SGLang .pt dump (logical_count or records), or a "
             "TensorRT-LLM expert-statistic directory")


def load_trace(
    path: str | os.PathLike,
    *,
    tokens_per_step: int | None = None,
    tasks: list[str] | None = None,
    num_experts: int | None = None,
) -> RoutingTrace:
    """Read a routing trace from `path`.

    Args:
        tokens_per_step: tokens per step; top-k id logs only (they need it), counts are grouped already.
        tasks: top-k id logs only: the tasks to read, each once (default: all, concatenated in file order).
        num_experts: top-k id logs only: E (default: the file's `num_experts` array if it has one, else the largest
            id in any task of the file + 1, so that every task of one file reads with the same E).
    """
    file = Path(path)
    if not file.is_file() and not file.is_dir():
        raise TraceFormatError(f"trace file not found: {file}; expected {SUPPORTED}")
    suffix = file.suffix.lower()
    _check_tasks(tasks)
    try:
        if file.is_dir():
            _check_counts_options(file, tokens_per_step, tasks, num_experts)
            return load_trtllm_statistics(file)
        if suffix == ".npz":
            return _load_npz(file, tokens_per_step, tasks, num_experts)
        if suffix in (".npy", ".pt"):
            _check_counts_options(file, tokens_per_step, tasks, num_experts)
        if suffix == ".npy":
            counts = np.load(file, allow_pickle=False, mmap_mode="r")  # the header alone, until the shape is checked
            _check_stored(counts.shape, counts.dtype, file.name)
            return RoutingTrace.from_counts(validate_counts(np.array(counts), f"{file.name}"), source=str(file))
        if suffix == ".pt":
            return _load_sglang_dump(file)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, RecursionError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        reason = _one_line(exc)
        if "pickle" in reason:  # numpy's advice to load it unsafely is not ours to give
            reason = "it holds Python objects (pickled data), not arrays of numbers"
        raise TraceFormatError(f"cannot read trace {file}: {reason}; expected {SUPPORTED}") from exc
    if suffix == ".safetensors" or file.name == META_FILE:
        raise TraceFormatError(f"{file} is one file of a TensorRT-LLM expert-statistic dump; give its directory "
                               f"{file.parent}")
    raise TraceFormatError(f"unknown trace format '{suffix}' for {file}; expected {SUPPORTED}")


def save_trace(trace: RoutingTrace, path: str | os.PathLike) -> None:
    """Write `trace` atomically: `.npz` keeps the header beside `counts`; `.npy` keeps only the counts."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix == ".npz":
        header = np.array(trace.header.model_dump_json())

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, counts=trace.counts_TLE, header_json=header)

    elif suffix == ".npy":

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.save(f, trace.counts_TLE)

    else:
        raise TraceFormatError(f"cannot write a trace as '{suffix}' ({file}); use a .npz or .npy file name")
    write_atomically(file, write)


def _check_tasks(tasks: list[str] | None) -> None:
    if tasks is None:
        return
    if not tasks or any(not task for task in tasks):
        raise TraceFormatError(f"tasks={','.join(tasks)!r} holds an empty name; name the tasks (e.g. law,intent)")
    repeated = sorted({task for task in tasks if tasks.count(task) > 1})
    if repeated:
        raise TraceFormatError(
            f"tasks={','.join(tasks)!r} names {', '.join(repeated)} more than once; name each task once"
        )


def _check_counts_options(
    file: Path, tokens_per_step: int | None, tasks: list[str] | None, num_experts: int | None
) -> None:
    """Refuse options that apply only to top-k id logs when `file` holds counts (they would be ignored)."""
    given = [f"{name}={value}" for name, value in (("tokens_per_step", tokens_per_step),
                                                   ("tasks", tasks and ",".join(tasks)),
                                                   ("num_experts", num_experts)) if value is not None]
    if given:
        raise TraceFormatError(
            f"{' and '.join(given)}: only top-k id logs (.npz with <task>_topk_ids) take this; {file.name} holds "
            f"counts already grouped into steps, so leave it out"
        )


def _load_npz(
    file: Path, tokens_per_step: int | None, tasks: list[str] | None, num_experts: int | None
) -> RoutingTrace:
    with np.load(file, allow_pickle=False) as data:
        keys = list(data.keys())
        stored = sum(_check_stored(*_member_header(data, key, file), f"{file.name}:{key}") for key in keys)
        if stored > MAX_READ_VALUES * 8:
            raise TraceFormatError(f"{file.name} holds {stored:,} bytes of arrays, more than the "
                                   f"{MAX_READ_VALUES * 8:,} a trace may read; split it into smaller files")
        if "counts" in keys:
            _check_counts_options(file, tokens_per_step, tasks, num_experts)
            counts = validate_counts(data["counts"], f"{file.name}:counts")
            if "header_json" in keys:
                try:
                    header = TraceHeader.model_validate(json.loads(str(data["header_json"])))
                except (ValidationError, json.JSONDecodeError) as exc:
                    raise TraceFormatError(f"{file.name}: invalid header_json: {_one_line(exc)}") from exc
                return RoutingTrace(counts, header)
            return RoutingTrace.from_counts(counts, source=str(file))
        available = topk_tasks(keys)
        if not available:
            raise TraceFormatError(
                f"{file.name} holds neither 'counts' nor '<task>_topk_ids' arrays (found {keys[:6]}); "
                f"expected {SUPPORTED}"
            )
        chosen = tasks or available
        missing = [t for t in chosen if t not in available]
        if missing:
            raise TraceFormatError(f"{file.name} has no task {missing}; available tasks: {', '.join(available)}")
        if tokens_per_step is None:
            raise TraceFormatError(f"{file.name} is a top-k id log: give tokens_per_step to group tokens into steps")
        every_task = {t: data[f"{t}_topk_ids"] for t in available}
        experts = num_experts or _experts_of_log(data, every_task, file)
        ids = [every_task[t] for t in chosen]
    top_k = ids[0].shape[-1] if ids[0].ndim == 3 else None
    counts = np.concatenate([counts_from_topk_ids(a, experts, tokens_per_step) for a in ids], axis=0)
    source = f"{file} tasks={','.join(chosen)} tokens_per_step={tokens_per_step}"
    return RoutingTrace.from_counts(counts, top_k=top_k, tokens_per_step=tokens_per_step, source=source)


def _member_header(data, key: str, file: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of array `key` of the open `.npz` `data`, from its header alone (nothing decompressed past it)."""
    with data.zip.open(f"{key}.npy") as member:
        version = np.lib.format.read_magic(member)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise TraceFormatError(f"{file.name}:{key} is in .npy format {version[0]}.{version[1]}; save it with "
                                   f"numpy.savez (format 1.0 or 2.0)")
        shape, _, dtype = read(member)
    return shape, dtype


def _check_stored(shape: tuple[int, ...], dtype: np.dtype, what: str) -> int:
    """The bytes an array of `shape` and `dtype` holds; `TraceFormatError` unless they are at most MAX_READ_VALUES
    values of at most 8 bytes each (checked before it is read)."""
    check_read_shape(shape, what)
    stored = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if stored > MAX_READ_VALUES * 8 or dtype.kind in "USV" and stored > MAX_TEXT_BYTES:
        raise TraceFormatError(f"{what} holds {stored:,} bytes of dtype {dtype}; expected numbers (or a header of "
                               f"at most {MAX_TEXT_BYTES:,} bytes)")
    return stored


def _experts_of_log(data, ids_by_task: dict[str, np.ndarray], file: Path) -> int:
    """E of a top-k id log: its `num_experts` array when present, else the largest id of any task + 1."""
    if "num_experts" in data:
        value = data["num_experts"]
        if value.shape != () or value.dtype.kind not in "iu" or int(value) < 1:
            raise TraceFormatError(f"{file.name}: num_experts must be one positive integer; found {value!r}")
        return int(value)
    for task, ids in ids_by_task.items():
        if ids.dtype.kind not in "iu":
            raise TraceFormatError(f"{file.name}: {task}_topk_ids must hold integer ids; found dtype {ids.dtype}")
    return max((int(ids.max()) for ids in ids_by_task.values() if ids.size), default=-1) + 1


def _load_sglang_dump(file: Path) -> RoutingTrace:
    """The recorded steps and MoE layers of an SGLang dump; the steps and dense layers left out, in one warning."""
    dump = read_sglang_dump(file)
    note = dump.dropped_note()
    if note:
        logger.warning("%s: %s", file.name, note)
    return dump.trace


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
