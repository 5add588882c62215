"""Read and write routing traces in every supported format.

Formats (chosen by suffix and content):
- native `.npz`: array `counts` [T, L, E] plus `header_json` (a 0-d string array holding the TraceHeader);
- plain `.npy`: one array [T, L, E];
- SGLang expert-distribution dump `.pt`: a dict holding `logical_count` [T, L, E] (or [L, E], read as one step);
- top-k id log `.npz` (as `../shared/data/esft-dsv2lite`): arrays `<task>_topk_ids` [L, N, K], grouped into steps of
  `tokens_per_step` tokens; tasks are concatenated in file order unless `tasks` picks some.
"""

import json
import os
import zipfile
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from traces.atomic_file import write_atomically
from traces.errors import TraceFormatError
from traces.routing_trace import RoutingTrace, TraceHeader, validate_counts
from traces.topk_log import counts_from_topk_ids, topk_tasks

SUPPORTED = ".npz (counts or <task>_topk_ids), .npy [T, L, E], or an SGLang .pt dump with logical_count"


def load_trace(
    path: str | os.PathLike,
    *,
    tokens_per_step: int | None = None,
    tasks: list[str] | None = None,
    num_experts: int | None = None,
) -> RoutingTrace:
    """Read a routing trace from `path`.

    Args:
        tokens_per_step: tokens per step, needed only for top-k id logs.
        tasks: for top-k id logs, the tasks to read (default: all, concatenated in file order).
        num_experts: for top-k id logs, E (default: the largest id + 1).
    """
    file = Path(path)
    if not file.is_file():
        raise TraceFormatError(f"trace file not found: {file}; expected {SUPPORTED}")
    suffix = file.suffix.lower()
    if tasks and suffix != ".npz":
        raise TraceFormatError(f"--task applies only to top-k id logs (.npz with <task>_topk_ids), not {file.name}")
    try:
        if suffix == ".npz":
            return _load_npz(file, tokens_per_step, tasks, num_experts)
        if suffix == ".npy":
            counts = np.load(file, allow_pickle=False)
            return RoutingTrace.from_counts(validate_counts(counts, f"{file.name}"), source=str(file))
        if suffix == ".pt":
            return _load_sglang_dump(file)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(f"cannot read trace {file}: {_one_line(exc)}; expected {SUPPORTED}") from exc
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


def _load_npz(
    file: Path, tokens_per_step: int | None, tasks: list[str] | None, num_experts: int | None
) -> RoutingTrace:
    with np.load(file, allow_pickle=False) as data:
        keys = list(data.keys())
        if "counts" in keys:
            if tasks:
                raise TraceFormatError(f"--task applies only to top-k id logs; {file.name} holds counts")
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
            raise TraceFormatError(f"{file.name} is a top-k id log: give --tokens-per-step to group tokens into steps")
        ids = [data[f"{t}_topk_ids"] for t in chosen]
    top_k = ids[0].shape[-1] if ids[0].ndim == 3 else None
    experts = num_experts or int(max(int(a.max()) for a in ids)) + 1
    counts = np.concatenate([counts_from_topk_ids(a, experts, tokens_per_step) for a in ids], axis=0)
    source = f"{file} tasks={','.join(chosen)} tokens_per_step={tokens_per_step}"
    return RoutingTrace.from_counts(counts, top_k=top_k, tokens_per_step=tokens_per_step, source=source)


def _load_sglang_dump(file: Path) -> RoutingTrace:
    # torch is needed only to unpickle SGLang's dump; it is imported here so `traces` stays numpy-only otherwise.
    import torch

    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many exception types for a bad file
        raise TraceFormatError(f"cannot read {file} as a torch file: {_one_line(exc)}") from exc
    if not isinstance(data, dict) or "logical_count" not in data:
        found = sorted(data.keys()) if isinstance(data, dict) else type(data).__name__
        raise TraceFormatError(f"{file.name} is not an SGLang expert-distribution dump: no 'logical_count' in {found}")
    counts = np.asarray(torch.as_tensor(data["logical_count"]).cpu().numpy())
    if counts.ndim == 2:
        counts = counts[None]
    return RoutingTrace.from_counts(validate_counts(counts, f"{file.name}:logical_count"), source=str(file))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
