"""SGLang's expert-distribution dumps read as a routing trace plus the model's layer layout (SGLang 0.5.23,
`sglang/srt/eplb/expert_distribution.py`).

Legend: T steps (forward passes), M the model's decoder layers, L its MoE layers, E logical experts, P physical
slots, N tokens, K top-k.

SGLang's recorder (`--expert-distribution-recorder-mode`, written by `/dump_expert_distribution_record` into
`SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`) writes one of two `.pt` files:

- stat mode (`stat`, `stat_approx`): `{"rank", "logical_count": [T, M, E], "average_utilization_rate_over_window"}`,
  summed over every rank, written by rank 0. T is the recorder's buffer: a circular buffer of
  `--expert-distribution-recorder-buffer-size` steps (1000 by default) that is zero in every slot no step has filled
  since recording started, or with a negative size exactly the steps recorded. Once the buffer wraps its rows are
  not in time order.
- detail mode (`per_pass`, `per_token`): `{"records": [one dict per forward pass], "last_physical_to_logical_map":
  [M, P]}`, one file per rank. A record holds `forward_pass_id` and `global_physical_count` [M, P], what this rank
  counted per physical slot (its own tokens with top-k recording; only its own slots' share under DeepEP), and in
  per_token mode `topk_ids_of_layer` [M, N, K] of physical slot ids (-1 unused). Slots become logical experts
  through the dump's map, the one serving when it was written.

Both index layers by the model's absolute layer id over all M decoder layers; a dense layer routes nothing and stays
zero. The reader keeps the steps that routed any token (an all-zero step is an unfilled buffer slot or an idle pass,
and scoring it would count a perfectly balanced step that never ran) and the layers that routed any token (the MoE
layers), and returns which model layers those are, as SGLang's `--init-expert-location` map needs them.

A `.pt` file is a pickle: it is read with `weights_only=True` (tensors, numbers and containers only), and only under
a torch without a published bypass of that (`MIN_SAFE_TORCH`). Before any tensor is built from it, the file is checked
to stay small: torch's zip layout with every record stored, not compressed, in the bytes the file has; then every
tensor the reader uses counted at its full size (an expanded view or records that share one storage claim more bytes
than the file holds, and are refused); expert ids below the map's slots; the counts' shape and sum within the
trace's bounds (`routing_trace.MAX_READ_VALUES`, `MAX_TOTAL_TOKENS`).
"""

import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError
from traces.model_layers import ModelLayers
from traces.routing_trace import MAX_TOTAL_TOKENS, RoutingTrace, check_read_shape, validate_counts

# weights_only=True has published bypasses below torch 2.6 (CVE-2025-32434) and below 2.10 (CVE-2026-24747): a
# pickle is read only under a torch at or above this.
MIN_SAFE_TORCH = "2.10"


@dataclass(frozen=True)
class SglangDump:
    """What an SGLang dump holds, as this project reads it.

    Attributes:
        trace: [T, L, E] counts of the recorded steps and the MoE layers only.
        model_layers: the model's M layers and which L of them are MoE layers (trace layer l is model layer
            `model_layers.moe_layer_ids[l]`).
        zero_steps_dropped: steps of the file with no token in any layer, left out.
        mode: "stat" (`logical_count`) or "detail" (`records`).
    """

    trace: RoutingTrace
    model_layers: ModelLayers
    zero_steps_dropped: int
    mode: str

    def dropped_note(self) -> str | None:
        """One line saying what the reader left out, or None when it kept every step and layer."""
        parts = []
        if self.zero_steps_dropped:
            total = self.zero_steps_dropped + self.trace.num_steps
            why = "unfilled slots of SGLang's circular buffer" if self.mode == "stat" else "passes with no token"
            parts.append(f"dropped {self.zero_steps_dropped} of {total} steps with no token ({why})")
        dense = self.model_layers.dense_layer_ids
        if dense:
            parts.append(f"{len(dense)} dense layers with no token ({_ids(dense)}); read as "
                         f"{self.model_layers.describe()}")
        return "; ".join(parts) or None


def read_sglang_dump(path: str | os.PathLike) -> SglangDump:
    """Read an SGLang expert-distribution dump (stat or detail mode); raise `TraceFormatError` naming what is wrong."""
    # torch is needed only to unpickle SGLang's dump; it is imported here so `traces` stays numpy-only otherwise.
    import torch

    file = Path(path)
    check_torch_for_pickles(torch.__version__)
    _check_archive(file)
    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many exception types for a bad file
        raise TraceFormatError(f"cannot read {file} as a torch file: {_torch_reason(exc)}") from exc
    if isinstance(data, dict) and "logical_count" in data:
        _check_claimed_bytes(file, [_tensor(data["logical_count"], file, "logical_count")])
        counts_TME, mode = _stat_counts(data["logical_count"], file), "stat"
    elif isinstance(data, dict) and "records" in data:
        counts_TME, mode = _detail_counts(data, file), "detail"
    else:
        found = sorted(map(str, data.keys())) if isinstance(data, dict) else type(data).__name__
        raise TraceFormatError(f"{file.name} is not an SGLang expert-distribution dump: no 'logical_count' (stat mode) "
                               f"or 'records' (detail mode) in {found}")
    counts_TME = validate_counts(counts_TME, f"{file.name}:{'logical_count' if mode == 'stat' else 'records'}")
    recorded = counts_TME.sum(axis=(1, 2)) > 0
    if not recorded.any():
        raise TraceFormatError(f"{file.name} holds no recorded step: all {len(recorded)} steps are zero; record with "
                               f"traffic running, between /start_expert_distribution_record and "
                               f"/dump_expert_distribution_record")
    counts_TME = counts_TME[recorded]
    moe_layer_ids = tuple(int(i) for i in np.flatnonzero(counts_TME.sum(axis=(0, 2)) > 0))
    layers = ModelLayers(counts_TME.shape[1], moe_layer_ids)
    trace = RoutingTrace.from_counts(counts_TME[:, list(moe_layer_ids)], source=f"{file} (SGLang {mode} dump)")
    return SglangDump(trace, layers, int((~recorded).sum()), mode)


def check_torch_for_pickles(version: str) -> None:
    """Raise `TraceFormatError` unless torch `version` reads a pickle with weights_only=True safely (at least
    MIN_SAFE_TORCH)."""
    from torch.torch_version import TorchVersion

    if TorchVersion(version) < MIN_SAFE_TORCH:
        raise TraceFormatError(f"reading a .pt dump (a pickle) needs torch >= {MIN_SAFE_TORCH}: torch {version} has "
                               f"published bypasses of weights_only=True (CVE-2025-32434 below 2.6, CVE-2026-24747 "
                               f"below 2.10); upgrade torch (pip install 'torch>={MIN_SAFE_TORCH}')")


def _check_archive(file: Path) -> None:
    """Raise unless `file` is torch's zip layout (what torch.save writes) with every record stored uncompressed in the
    file's own bytes: then loading it allocates no more than the file holds."""
    expected = "an SGLang dump is what torch.save writes (a zip archive of stored records)"
    try:
        size = file.stat().st_size
        with zipfile.ZipFile(file) as archive:
            records = archive.infolist()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise TraceFormatError(f"cannot read {file} as a torch file: {_one_line(exc)}; {expected}") from None
    squeezed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED or r.compress_size != r.file_size]
    if squeezed:
        raise TraceFormatError(f"{file.name}: record {squeezed[0][:60]!r} is compressed; {expected}")
    claimed = sum(r.file_size for r in records)
    if claimed > size:
        raise TraceFormatError(f"{file.name}: its records claim {claimed:,} bytes but the file holds {size:,}; "
                               f"{expected}")


def _check_claimed_bytes(file: Path, tensors: list) -> None:
    """Raise unless the tensors the reader will turn into arrays, each at its full size, fit in the file's bytes: a
    tensor expanded from a small storage, or many records that share one, claim more than the file holds."""
    claimed = sum(t.numel() * t.element_size() for t in tensors)
    size = file.stat().st_size
    if claimed > size:
        raise TraceFormatError(f"{file.name}: its tensors claim {claimed:,} bytes at full size but the file holds "
                               f"{size:,} (expanded views or records sharing one storage); save each record's tensors "
                               f"on their own (tensor.clone()), as SGLang's recorder does")


def _tensor(value, file: Path, key: str):
    """`value` if it is a tensor of numbers (not bool), else `TraceFormatError` naming `key` (a nested list could
    stand for any number of values, so none is taken)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TraceFormatError(f"{file.name}: {key} must be a tensor; found a {type(value).__name__}")
    if value.dtype == torch.bool or value.is_complex():
        raise TraceFormatError(f"{file.name}: {key} must hold integer counts or ids; found dtype {value.dtype}")
    return value


def _stat_counts(value, file: Path) -> np.ndarray:
    """[T, M, E] from a stat dump's `logical_count` ([M, E] is read as one step)."""
    counts = _array(value, file, "logical_count must be a tensor [steps, layers, experts] of counts")
    counts = counts[None] if counts.ndim == 2 else counts
    check_read_shape(counts.shape, f"{file.name}:logical_count")
    return counts


def _detail_counts(data: dict, file: Path) -> np.ndarray:
    """[T, M, E] from a detail dump: each record's physical slot counts summed onto the logical experts."""
    records = data["records"]
    if "last_physical_to_logical_map" not in data:
        raise TraceFormatError(f"{file.name}: last_physical_to_logical_map must be a tensor [layers, slots] of expert "
                               f"ids; found none")
    phy2log = _tensor(data["last_physical_to_logical_map"], file, "last_physical_to_logical_map")
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
        raise TraceFormatError(f"{file.name}: records must be a non-empty list of one dict per forward pass; record "
                               f"with traffic running before dumping")
    _check_claimed_bytes(file, [phy2log] + [_record_tensor(record, file) for record in records])
    phy2log_MP = _array(phy2log, file, "last_physical_to_logical_map must be a tensor [layers, slots] of expert ids")
    if phy2log_MP.ndim != 2 or phy2log_MP.size == 0 or phy2log_MP.dtype.kind not in "iu" or phy2log_MP.min() < 0:
        raise TraceFormatError(f"{file.name}: last_physical_to_logical_map must be [layers, slots] expert ids >= 0; "
                               f"found shape {phy2log_MP.shape}, dtype {phy2log_MP.dtype}")
    num_layers, num_slots = phy2log_MP.shape
    if phy2log_MP.max() >= num_slots:
        raise TraceFormatError(f"{file.name}: last_physical_to_logical_map holds expert id {phy2log_MP.max()} but has "
                               f"{num_slots} slots a layer; every expert has a slot, so ids are below {num_slots}")
    num_experts = int(phy2log_MP.max()) + 1
    check_read_shape((len(records), num_layers, num_experts), f"{file.name} (records x layers x experts)")
    ordered = sorted(records, key=lambda record: _pass_id(record, file))
    # Slot p of layer m adds to entry m * E + phy2log[m, p] of the step's flattened [M, E] counts.
    flat_index_MP = np.arange(num_layers)[:, None] * num_experts + phy2log_MP
    counts_TME = np.zeros((len(ordered), num_layers, num_experts), dtype=np.int64)
    total = 0.0  # every count is at most the total: below MAX_TOTAL_TOKENS, no sum wraps around int64
    for step, record in enumerate(ordered):
        physical_MP = _physical_count(record, num_layers, num_slots, file)
        total += float(physical_MP.sum(dtype=np.float64))
        if total > MAX_TOTAL_TOKENS:
            raise TraceFormatError(f"{file.name}: its records count more than 2^53 tokens ({MAX_TOTAL_TOKENS:.3g}); "
                                   f"token counts must stay exact in int64 and float64")
        np.add.at(counts_TME[step].reshape(-1), flat_index_MP, physical_MP.astype(np.int64))
    return counts_TME


def _record_tensor(record: dict, file: Path):
    """The tensor of `record` the reader counts: `global_physical_count`, else `topk_ids_of_layer`."""
    for key in ("global_physical_count", "topk_ids_of_layer"):
        if key in record:
            return _tensor(record[key], file, key)
    raise TraceFormatError(f"{file.name}: a record holds neither global_physical_count nor topk_ids_of_layer; found "
                           f"{sorted(map(str, record))[:8]}")


def _pass_id(record: dict, file: Path) -> int:
    value = record.get("forward_pass_id")
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceFormatError(f"{file.name}: a record's forward_pass_id must be an integer; found {value!r:.40}")
    return value


def _physical_count(record: dict, num_layers: int, num_slots: int, file: Path) -> np.ndarray:
    """[M, P] int64: the record's `global_physical_count`, or its `topk_ids_of_layer` [M, N, K] counted per slot."""
    if "global_physical_count" in record:
        counts = _array(record["global_physical_count"], file, "global_physical_count must be a tensor [layers, slots]")
        if counts.shape != (num_layers, num_slots) or counts.dtype.kind not in "iu" or (counts < 0).any() or \
                (counts.size and counts.max() > MAX_TOTAL_TOKENS):
            raise TraceFormatError(f"{file.name}: global_physical_count must be [{num_layers}, {num_slots}] counts "
                                   f"(layers x slots of last_physical_to_logical_map); found shape {counts.shape}, "
                                   f"dtype {counts.dtype}")
        return counts
    if "topk_ids_of_layer" in record:
        ids = _array(record["topk_ids_of_layer"], file, "topk_ids_of_layer must be a tensor [layers, tokens, top-k]")
        if ids.ndim != 3 or ids.shape[0] != num_layers or ids.dtype.kind not in "iu" or \
                (ids.size and (ids.max() >= num_slots or ids.min() < -1)):
            raise TraceFormatError(f"{file.name}: topk_ids_of_layer must be [{num_layers}, tokens, top-k] slot ids "
                                   f"below {num_slots}, or -1 for no pick; found shape {ids.shape}, dtype {ids.dtype}"
                                   + (f", ids {ids.min()} to {ids.max()}" if ids.ndim == 3 and ids.size else ""))
        flat = ids.reshape(num_layers, -1)
        return np.stack([np.bincount(row[row >= 0], minlength=num_slots) for row in flat]).astype(np.int64)
    raise TraceFormatError(f"{file.name}: a record holds neither global_physical_count nor topk_ids_of_layer; found "
                           f"{sorted(map(str, record))[:8]}")


def _array(value, file: Path, expected: str) -> np.ndarray:
    """`value` (a tensor or nested lists) as a numpy array, or `TraceFormatError` with `expected`."""
    import torch

    try:
        return np.asarray(torch.as_tensor(value).cpu().numpy())
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TraceFormatError(f"{file.name}: {expected}; found a {type(value).__name__}") from exc


def _ids(ids) -> str:
    ids = list(ids)
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"layer {ids[0]}" if len(ids) == 1 else f"layers {ids[0]}-{ids[-1]}"
    return "layers " + ", ".join(map(str, ids[:6])) + (", ..." if len(ids) > 6 else "")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _torch_reason(exc: BaseException) -> str:
    """Why torch could not load a file, in one clean line: terminal colour codes removed, and of a weights_only
    refusal only what was refused (torch's advice to load it unsafely is not ours to give)."""
    text = _ANSI.sub("", str(exc))
    if "Weights only load failed" in text:
        found = [part for part in re.split(r"\n\s*\n", text) if part.strip() and "weights_only" not in part
                 and "Weights only" not in part and not part.strip().startswith("Check the documentation")]
        detail = " ".join(" ".join(found).split()).split(". ")[0][:200] or "a Python object"  # what, not torch's advice
        return (f"it holds Python objects beyond tensors, numbers and containers ({detail}); it was not read: an "
                f"SGLang dump holds none")
    return " ".join(text.split())[:300] or type(exc).__name__


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
