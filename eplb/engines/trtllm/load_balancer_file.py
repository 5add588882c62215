"""TensorRT-LLM's `moe_load_balancer.yaml` from a placement: what `moe_config.load_balancer` (or, in older
versions, `moe_load_balancer`) names in the LLM API options.

Legend: L layers, E logical experts, G ranks (TensorRT-LLM's `ep_size`), S slots per rank, P = G * S slots.

The file, as TensorRT-LLM parses it (`yaml.safe_load`, then `MoeLoadBalancerConfig(**data)`, whose fields are these
three: `tensorrt_llm/llmapi/llm_args.py`, formerly `tensorrt_llm/_torch/model_config.py`):

```
num_slots: P                      # slots of all ranks; TensorRT-LLM requires P % ep_size == 0
layer_updates_per_iter: 0         # layers re-placed per iteration: 0 keeps this placement (offline balancing)
initial_global_assignments:       # {layer id: [P expert ids]}: slot p holds that expert and lives on rank p // S
  3: [138, 81, ...]
```

The layer ids are the model's decoder-layer indices of its MoE layers (`layer_idx`: 3 to 60 for DeepSeek-V3), the
keys `get_layer_initial_global_assignments(layer_idx)` looks up; each MoE layer checks its list has P entries,
P >= E, and that the set of ids is exactly 0 .. E - 1 (`tensorrt_llm/_torch/modules/fused_moe/`). TensorRT-LLM
splits an expert's tokens equally over its replicas, so the file carries no replica shares;
`eplb.engines.trtllm.report` scores a placement that way.

MTP layers: served with multi-token prediction, TensorRT-LLM also looks up each MTP layer's MoE, numbered on from the
decoder layers (61 for DeepSeek-V3, whose decoder layers are 0-60), and stops with `KeyError` when the file lacks its
key. `mtp_layer_ids` names them: an MTP layer the placement was fitted on (a dump recorded with MTP on holds its
statistics) keeps its own row; any other holds the row of the placement's last non-MTP layer as a stand-in, which the
file's comment says.
"""

import math
import os
from collections.abc import Sequence

import yaml

from placement.errors import PlacementFormatError
from placement.placement_model import Placement
from traces.atomic_file import write_text_atomically
from traces.model_layers import MAX_MODEL_LAYERS


def trtllm_config(placement: Placement, layer_ids: Sequence[int], mtp_layer_ids: Sequence[int] = ()) -> dict:
    """The file's content as a dict: `num_slots` (P), `initial_global_assignments` ({layer_ids[l]: phy2log_LP[l] as
    a list of P ints}, and each MTP layer's key: see `mtp_stand_ins`) and `layer_updates_per_iter` (0).

    Args:
        layer_ids: [L] the model's layer index of each of the placement's layers, ascending.
        mtp_layer_ids: the model's MTP layers TensorRT-LLM also looks up when it serves with MTP (61 for
            DeepSeek-V3); empty without MTP.

    Raises:
        PlacementFormatError: `layer_ids` does not name the placement's L layers with distinct ascending ids >= 0, or
            `mtp_layer_ids` names a layer that is neither one of them nor above them.
    """
    ids = [int(layer) for layer in layer_ids]
    if len(ids) != placement.num_layers:
        raise PlacementFormatError(f"layer_ids names {len(ids)} layers but the placement has {placement.num_layers}; "
                                   f"give one TensorRT-LLM layer id per layer of the placement")
    if ids and (ids[0] < 0 or any(b <= a for a, b in zip(ids, ids[1:]))):
        raise PlacementFormatError(f"layer_ids {ids[:6]}... must be distinct ids >= 0 in ascending order (the "
                                   f"placement's layers follow the model's)")
    assignments = {layer: row.tolist() for layer, row in zip(ids, placement.phy2log_LP)}
    for mtp, source in mtp_stand_ins(ids, mtp_layer_ids).items():
        assignments[mtp] = list(assignments[source])
    return {
        "num_slots": placement.cluster.num_slots,
        "initial_global_assignments": assignments,
        "layer_updates_per_iter": 0,
    }


def mtp_stand_ins(layer_ids: Sequence[int], mtp_layer_ids: Sequence[int]) -> dict[int, int]:
    """{MTP layer id: the layer id whose placement it holds} for each of `mtp_layer_ids` that is not one of
    `layer_ids` (those keep the placement fitted on their own statistics): the last of `layer_ids` that is not an
    MTP layer. TensorRT-LLM numbers MTP layers after the decoder layers, so each such id is above every layer id.

    Raises:
        PlacementFormatError: an MTP layer id is neither one of `layer_ids` nor above them, is repeated, or every
            layer of `layer_ids` is an MTP layer (no decoder layer to stand in).
    """
    mtp = [int(layer) for layer in mtp_layer_ids]
    ids = [int(layer) for layer in layer_ids]
    if len(set(mtp)) != len(mtp):
        raise PlacementFormatError(f"mtp_layer_ids {mtp[:6]} repeats a layer; name each MTP layer once")
    missing = sorted(set(mtp) - set(ids))
    decoder = [layer for layer in ids if layer not in set(mtp)]
    if not missing:
        return {}
    if not decoder:
        raise PlacementFormatError(f"mtp_layer_ids {mtp[:6]} names every layer of the placement; an MTP layer without "
                                   f"statistics takes the last decoder layer's placement, and there is none")
    if missing[0] <= max(ids):
        raise PlacementFormatError(
            f"mtp_layer_ids names layer {missing[0]}, which is neither a layer of the placement ({ids[0]}..{ids[-1]}) "
            f"nor above its last; TensorRT-LLM numbers MTP layers after the decoder layers (61 for DeepSeek-V3)")
    return {layer: decoder[-1] for layer in missing}


def trtllm_yaml(placement: Placement, layer_ids: Sequence[int], mtp_layer_ids: Sequence[int] = ()) -> str:
    """`trtllm_config` as YAML text (pyyaml's `safe_dump`): integer layer keys, each layer's list on one line, a
    comment naming the `ep_size` the slots are grouped for (TensorRT-LLM takes `ep_size` from its launch, not from
    this file), and a comment for each MTP layer saying where its placement comes from."""
    config = trtllm_config(placement, layer_ids, mtp_layer_ids)
    cluster = placement.cluster
    lines = [f"# TensorRT-LLM MoeLoadBalancerConfig written by eplb: serve with ep_size {cluster.num_gpus} "
             f"({cluster.num_gpus} ranks x {cluster.slots_per_gpu} slots); slot p lives on rank p // "
             f"{cluster.slots_per_gpu}"]
    stand_ins = mtp_stand_ins(layer_ids, mtp_layer_ids)
    for mtp in sorted(int(layer) for layer in mtp_layer_ids):
        lines.append(f"# MTP layer {mtp}: a stand-in, layer {stand_ins[mtp]}'s placement (the trace holds no "
                     f"statistics of layer {mtp}; record with MTP on to fit it)" if mtp in stand_ins else
                     f"# MTP layer {mtp}: fitted on its own statistics in the trace")
    body = {key: config[key] for key in ("num_slots", "layer_updates_per_iter", "initial_global_assignments")}
    # Flow style for the leaves only (each layer's list on one line, however long), keys in this order.
    text = yaml.safe_dump(body, default_flow_style=None, sort_keys=False, width=math.inf)
    return "\n".join(lines) + "\n" + text


def save_trtllm_config(placement: Placement, path: str | os.PathLike, layer_ids: Sequence[int],
                       mtp_layer_ids: Sequence[int] = ()) -> None:
    """Write `trtllm_yaml(placement, layer_ids, mtp_layer_ids)` to `path` atomically."""
    write_text_atomically(path, trtllm_yaml(placement, layer_ids, mtp_layer_ids))


def parse_layer_ids(text: str) -> tuple[int, ...]:
    """Layer ids from text: comma-separated ids or inclusive ranges, ascending ('3-60', '1,3,5', '0-26,27'), each
    a model layer id below `MAX_MODEL_LAYERS` (checked before a range is expanded).

    Raises:
        ValueError: the text is not such a list (the message says what was expected).
    """
    ids: list[int] = []
    shown = text if len(text) <= 40 else text[:37] + "..."
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdecimal() or not low.isascii() or dash and not (high.isdecimal() and high.isascii()):
            raise ValueError(f"expected layer ids or ranges such as 3-60 or 1,3,5; got {shown!r}")
        if max(len(low), len(high)) > 6 or max(int(low), int(high or 0)) >= MAX_MODEL_LAYERS:
            raise ValueError(f"layer ids are a model's layers, below {MAX_MODEL_LAYERS}; got {shown!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"range {item.strip()} runs backwards; write it as {last}-{first}")
        ids.extend(range(first, last + 1))
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"layer ids {shown!r} must ascend, each once (the trace's layers follow the model's)")
    return tuple(ids)
