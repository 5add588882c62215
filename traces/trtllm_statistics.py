"""Read TensorRT-LLM's expert-statistic dumps as routing traces.

Legend: T recorded iterations, L MoE layers, E experts (slots, for a run under a load balancer), R ranks.

TensorRT-LLM records them when `EXPERT_STATISTIC_ITER_RANGE=START-STOP` is set
(`tensorrt_llm/_torch/expert_statistic.py`): for each iteration START <= i < STOP and each MoE layer it counts, per
rank, the ids the router picked for that rank's tokens (`torch.bincount` of `token_selected_experts`, all top-k
picks, `minlength` the number of ids). When iteration STOP begins, each rank writes into `$EXPERT_STATISTIC_PATH`
(default `expert_statistic`):

- `rank<r>.safetensors`: one 1-D integer tensor [E] per recorded (iteration, layer), named `"<iteration>_<layer>"`;
- `meta_info.json` (rank 0 only): `{"num_experts": E, "num_experts_per_token": K}`.

`<layer>` is the model's decoder-layer index of the MoE layer (`layer_idx`: 3 to 60 for DeepSeek-V3, whose first 3
layers are dense; an MTP layer continues after the last decoder layer), the same index that keys
`initial_global_assignments` in `moe_load_balancer.yaml`. With a load balancer on, the counted ids are slot ids
and E is the number of slots (the comment at the `ExpertStatistic.maybe_add_info` call in
`tensorrt_llm/_torch/modules/fused_moe/`).

The reader sums the ranks' counts as `examples/wide_ep/ep_load_balancer/utils.py` (`load_expert_statistic`) does,
reads `rank<r>.safetensors` files only (not `rank<r>_raw.safetensors`, `cooccurrence_rank<r>.safetensors` or
other files some versions write beside them), and requires what that loader asserts: every iteration from the first
to the last, each with every layer, and here in every rank's file (a rank that recorded other layers or missed one
would leave its tokens out of some counts). A `rank<r>.safetensors` that is not a regular file (a folder, a FIFO, a
device) is refused, never skipped. Sizes are checked before anything is allocated: layer ids below
`MAX_MODEL_LAYERS`, the trace's T x L x E below `MAX_READ_VALUES`, each count and their sum within
`MAX_TOTAL_TOKENS` (the ranks' sum never wraps around int64).
"""

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError
from traces.model_layers import MAX_MODEL_LAYERS
from traces.routing_trace import MAX_TOTAL_TOKENS, RoutingTrace, check_read_shape, validate_counts
from traces.safetensors_reader import iter_tensors, read_header

META_FILE = "meta_info.json"
RANK_FILE = re.compile(r"rank(0|[1-9]\d*)\.safetensors")  # as TensorRT-LLM names them: no leading zeros
RECORD_KEY = re.compile(r"(0|[1-9]\d*)_(0|[1-9]\d*)")  # as TensorRT-LLM writes them: no leading zeros
INTEGER_DTYPES = ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")
EXPECTED = (f"a TensorRT-LLM expert-statistic directory ($EXPERT_STATISTIC_PATH) holding {META_FILE} and "
            f"rank<r>.safetensors with one integer tensor [num_experts] per '<iteration>_<layer>'")


class TrtllmDumpError(TraceFormatError):
    """A directory is not a TensorRT-LLM expert-statistic dump; the message names the dump's own files and keys
    (`num_experts`), which no flag of this project sets."""


@dataclass(frozen=True)
class DumpLayout:
    """What a dump holds, read from its headers alone.

    Attributes:
        layer_ids: [L] the model's layer index of each MoE layer, ascending (TensorRT-LLM's `layer_idx`).
        iterations: the T recorded iterations, consecutive.
        num_ranks: R, the `rank<r>.safetensors` files (r = 0 .. R - 1); `report_load_statistics.py`'s `ep_size`.
        num_experts: E, ids counted per layer (`meta_info.json`'s `num_experts`).
        top_k: K, ids each token picked (`num_experts_per_token`), if the file says.
    """

    layer_ids: tuple[int, ...]
    iterations: range
    num_ranks: int
    num_experts: int
    top_k: int | None


def is_trtllm_dump(path: str | Path) -> bool:
    """Whether `path` is a directory holding `meta_info.json` (what the readers take for a TensorRT-LLM dump)."""
    return Path(path).is_dir() and (Path(path) / META_FILE).is_file()


def read_dump_layout(directory: str | Path) -> DumpLayout:
    """The layout of the dump in `directory`, checked as `load_trtllm_statistics` needs it (headers only).

    Raises:
        TrtllmDumpError: one line saying what was expected and what was found (a `TraceFormatError`; a broken
            safetensors file raises `TraceFormatError` itself).
    """
    folder = Path(directory)
    num_experts, top_k = _read_meta(folder)
    files = _rank_files(folder)
    by_file = [{_record_of(file, key, entry, num_experts) for key, entry in read_header(file).items()}
               for file in files]
    records = set().union(*by_file)
    if not records:
        raise TrtllmDumpError(f"{folder}: no rank file holds a record; expected {EXPECTED}")
    iterations = sorted({iteration for iteration, _ in records})
    layers = sorted({layer for _, layer in records})
    expected = (iterations[-1] - iterations[0] + 1) * len(layers)
    if len(records) != expected:
        grid = ((i, layer) for i in range(iterations[0], iterations[-1] + 1) for layer in layers)
        iteration, layer = next(pair for pair in grid if pair not in records)
        raise TrtllmDumpError(
            f"{folder}: no rank file holds '{iteration}_{layer}' ({expected - len(records)} (iteration, layer) "
            f"records missing); expected every iteration {iterations[0]}..{iterations[-1]} with each of the "
            f"{len(layers)} layers, as TensorRT-LLM writes them")
    for file, own in zip(files, by_file):
        if own != records:
            iteration, layer = min(records - own)
            raise TrtllmDumpError(
                f"{folder}: {file.name} lacks '{iteration}_{layer}', which another rank file holds ({len(own)} "
                f"records against {len(records)} in all); every rank records the same iterations and layers, so copy "
                f"each rank's whole file")
    return DumpLayout(tuple(layers), range(iterations[0], iterations[-1] + 1), len(files), num_experts, top_k)


def load_trtllm_statistics(directory: str | Path) -> RoutingTrace:
    """The dump in `directory` as a routing trace: counts [T, L, E] int64, the ranks' counts summed, step t the
    iteration `layout.iterations[t]`, layer l the model's layer `layout.layer_ids[l]`.

    Raises:
        TraceFormatError: the directory is not the dump described in this module (one line, what was expected).
    """
    folder = Path(directory)
    layout = read_dump_layout(folder)
    first = layout.iterations.start
    layer_index = {layer: index for index, layer in enumerate(layout.layer_ids)}
    shape = (len(layout.iterations), len(layout.layer_ids), layout.num_experts)
    check_read_shape(shape, f"{folder} (iterations x layers x experts)")
    counts_TLE = np.zeros(shape, dtype=np.int64)
    total = 0.0  # every count is at most the total: below MAX_TOTAL_TOKENS, no sum wraps around int64
    for file in _rank_files(folder):
        for key, tensor in iter_tensors(file):
            iteration, layer = (int(part) for part in RECORD_KEY.fullmatch(key).groups())
            if tensor.size and tensor.min() < 0:
                raise TrtllmDumpError(f"{file.name}: tensor {key!r} holds a negative count ({tensor.min()}); "
                                       f"expected token counts >= 0")
            total += float(tensor.sum(dtype=np.float64))
            if total > MAX_TOTAL_TOKENS:
                raise TrtllmDumpError(f"{folder}: its counts sum to more than 2^53 tokens ({MAX_TOTAL_TOKENS:.3g}) "
                                       f"by {file.name}'s '{key}'; token counts must stay exact in int64 and "
                                       f"float64: scale them down")
            counts_TLE[iteration - first, layer_index[layer]] += tensor.astype(np.int64)
    source = (f"{folder} (TensorRT-LLM expert statistics: iterations {first}..{layout.iterations.stop - 1}, "
              f"layers {layer_span(layout.layer_ids)}, {layout.num_ranks} ranks)")
    return RoutingTrace.from_counts(validate_counts(counts_TLE, folder.name), top_k=layout.top_k, source=source)


def _read_meta(folder: Path) -> tuple[int, int | None]:
    """(num_experts, num_experts_per_token or None) from `meta_info.json`."""
    file = folder / META_FILE
    if not file.is_file():
        raise TrtllmDumpError(f"{folder} is a directory without {META_FILE}; expected {EXPECTED}")
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise TrtllmDumpError(f"{file} is not valid JSON ({' '.join(str(exc).split())}); expected "
                               f'{{"num_experts": E, "num_experts_per_token": K}}') from None
    if meta is None:
        raise TrtllmDumpError(f"{file} holds null: TensorRT-LLM recorded no iteration; set "
                               f"EXPERT_STATISTIC_ITER_RANGE to iterations the run reaches")
    if not isinstance(meta, dict) or not _is_positive(meta.get("num_experts")):
        raise TrtllmDumpError(f"{file} holds {str(meta)[:60]}; expected "
                               f'{{"num_experts": E, "num_experts_per_token": K}} with E a positive integer')
    top_k = meta.get("num_experts_per_token")
    if top_k is not None and not (_is_positive(top_k) and top_k <= meta["num_experts"]):
        raise TrtllmDumpError(f"{file}: num_experts_per_token is {top_k!r}; expected a positive integer up to "
                               f"'num_experts' ({meta['num_experts']})")
    return meta["num_experts"], top_k


def _rank_files(folder: Path) -> list[Path]:
    """`rank<r>.safetensors` for r = 0 .. R - 1, in rank order; raise if none, a rank is missing, or one is not a
    regular file (a folder, a FIFO, a device, a broken link: refused, never opened or skipped)."""
    by_rank = {int(match.group(1)): path for path in folder.iterdir() if (match := RANK_FILE.fullmatch(path.name))}
    if not by_rank:
        raise TrtllmDumpError(f"{folder} holds {META_FILE} but no rank<r>.safetensors; expected {EXPECTED}")
    for path in by_rank.values():
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except OSError as exc:
            raise TrtllmDumpError(f"{folder}: cannot read {path.name} ({exc.strerror}); copy every rank's "
                                   f"file") from None
        if not regular:
            raise TrtllmDumpError(f"{folder}: {path.name} is not a regular file (a folder, FIFO or device); each "
                                   f"rank's counts are a safetensors file: copy it")
    absent = next(rank for rank in range(len(by_rank) + 1) if rank not in by_rank)
    if absent < max(by_rank):
        raise TrtllmDumpError(f"{folder}: rank{absent}.safetensors is missing ({len(by_rank)} rank files, up to "
                               f"rank{max(by_rank)}); copy every rank's file, or the counts lose its tokens")
    return [by_rank[rank] for rank in sorted(by_rank)]


def _record_of(file: Path, key: str, entry: dict, num_experts: int) -> tuple[int, int]:
    """(iteration, layer) of one header entry, after checking it is an integer tensor [num_experts]."""
    match = RECORD_KEY.fullmatch(key)
    if match is None:
        raise TrtllmDumpError(f"{file.name} holds a tensor named {key!r}; expected names '<iteration>_<layer>' "
                               f"({EXPECTED})")
    if entry["dtype"] not in INTEGER_DTYPES or entry["shape"] != [num_experts]:
        raise TrtllmDumpError(f"{file.name}: tensor {key!r} is {entry['dtype']} {entry['shape']}; expected integer "
                               f"counts [{num_experts}] ({META_FILE}'s 'num_experts')")
    if int(match.group(2)) >= MAX_MODEL_LAYERS:
        raise TrtllmDumpError(f"{file.name}: tensor {key!r} names layer {match.group(2)[:20]}; expected a model "
                               f"layer id below {MAX_MODEL_LAYERS}")
    return int(match.group(1)), int(match.group(2))


def _is_positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def layer_span(ids: tuple[int, ...]) -> str:
    """'3-60' for consecutive ids, else the ids joined by commas."""
    if ids == tuple(range(ids[0], ids[-1] + 1)) and len(ids) > 1:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))
