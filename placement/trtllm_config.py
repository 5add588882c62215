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
`placement.trtllm_report` scores a placement that way.
"""

import os
from collections.abc import Sequence

from placement.errors import PlacementFormatError
from placement.placement_model import Placement
from traces.atomic_file import write_text_atomically
from traces.model_layers import MAX_MODEL_LAYERS


def trtllm_config(placement: Placement, layer_ids: Sequence[int]) -> dict:
    """The file's content as a dict: `num_slots` (P), `initial_global_assignments` ({layer_ids[l]: phy2log_LP[l] as
    a list of P ints}) and `layer_updates_per_iter` (0).

    Args:
        layer_ids: [L] the model's layer index of each of the placement's layers, ascending.

    Raises:
        PlacementFormatError: `layer_ids` does not name the placement's L layers with distinct ascending ids >= 0.
    """
    ids = [int(layer) for layer in layer_ids]
    if len(ids) != placement.num_layers:
        raise PlacementFormatError(f"layer_ids names {len(ids)} layers but the placement has {placement.num_layers}; "
                                   f"give one TensorRT-LLM layer id per layer of the placement")
    if ids and (ids[0] < 0 or any(b <= a for a, b in zip(ids, ids[1:]))):
        raise PlacementFormatError(f"layer_ids {ids[:6]}... must be distinct ids >= 0 in ascending order (the "
                                   f"placement's layers follow the model's)")
    return {
        "num_slots": placement.cluster.num_slots,
        "initial_global_assignments": {layer: row.tolist() for layer, row in zip(ids, placement.phy2log_LP)},
        "layer_updates_per_iter": 0,
    }


def trtllm_yaml(placement: Placement, layer_ids: Sequence[int]) -> str:
    """`trtllm_config` as YAML text: integer layer keys, each layer's list on one line, and a comment naming the
    `ep_size` the slots are grouped for (TensorRT-LLM takes `ep_size` from its launch, not from this file)."""
    config = trtllm_config(placement, layer_ids)
    cluster = placement.cluster
    lines = [f"# TensorRT-LLM MoeLoadBalancerConfig written by eplb: serve with ep_size {cluster.num_gpus} "
             f"({cluster.num_gpus} ranks x {cluster.slots_per_gpu} slots); slot p lives on rank p // "
             f"{cluster.slots_per_gpu}",
             f"num_slots: {config['num_slots']}",
             f"layer_updates_per_iter: {config['layer_updates_per_iter']}",
             "initial_global_assignments:"]
    lines += [f"  {layer}: [{', '.join(map(str, experts))}]"
              for layer, experts in config["initial_global_assignments"].items()]
    return "\n".join(lines) + "\n"


def save_trtllm_config(placement: Placement, path: str | os.PathLike, layer_ids: Sequence[int]) -> None:
    """Write `trtllm_yaml(placement, layer_ids)` to `path` atomically."""
    write_text_atomically(path, trtllm_yaml(placement, layer_ids))


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
