"""SGLang's `physical_to_logical_map` [M, P]: a placement's rows put at the model layers SGLang indexes them by, and
the `--init-expert-location` file that holds it (`save_sglang_mapping`).

Legend: M the model's decoder layers, L its MoE layers (the placement's), P slots, E logical experts.

SGLang (0.5.23) reads the map of `--init-expert-location` as given (`ExpertLocationMetadata.init_by_mapping`) and
looks a layer's row up by its absolute decoder layer id (`ExpertLocationDispatchInfo.init_new(layer_id)`), so the map
needs one row per decoder layer: 61 for DeepSeek-V3, whose layers 0-2 are dense. It checks neither the row count nor
which layer holds experts: a 58-row map from a 58-MoE-layer trace loads, serves layer 3 with the placement fitted to
layer 0, and indexes past its end at layers 58-60.

A dense layer has no experts, but SGLang builds every row's tables all the same: each id must be a logical expert
in [0, E) (`_compute_logical_to_all_physical_map` indexes a list of E by it; -1 would wrap to expert E - 1) and
every expert needs a slot (`compute_logical_to_rank_dispatch_physical_map` asserts no -1 in its per-rank table). Its
dense rows here are what SGLang's own `init_trivial` puts in every row: slot p holds expert p % E.

The project's placement file is not SGLang's: SGLang passes every key of the `--init-expert-location` JSON to
`ExpertLocationMetadata.init_by_mapping(**data)`, which takes only `physical_to_logical_map` and so refuses the
placement file's `schema_version`. `save_sglang_mapping` writes that one key.
"""

import json
import os

import numpy as np

from placement.errors import PlacementFormatError
from placement.placement_model import Placement
from traces.atomic_file import write_text_atomically
from traces.model_layers import ModelLayers


def sglang_physical_to_logical_map(placement: Placement, model_layers: ModelLayers) -> np.ndarray:
    """[M, P] int64: row `model_layers.moe_layer_ids[l]` is the placement's layer l, a dense layer's row p % E.

    Raises `PlacementFormatError` when the placement's L layers are not the model's MoE layers in number.
    """
    if placement.num_layers != model_layers.num_moe_layers:
        raise PlacementFormatError(
            f"the placement has {placement.num_layers} layers but model_layers ({model_layers.describe()}) has "
            f"{model_layers.num_moe_layers} MoE layers; fit the placement on a trace of the model's MoE layers, or "
            f"name the model's layers to match")
    num_slots = placement.cluster.num_slots
    phy2log_MP = np.tile(np.arange(num_slots, dtype=np.int64) % placement.num_experts, (model_layers.num_layers, 1))
    phy2log_MP[list(model_layers.moe_layer_ids)] = placement.phy2log_LP
    return phy2log_MP


def save_sglang_mapping(placement: Placement, path: str | os.PathLike, model_layers: ModelLayers) -> None:
    """Write SGLang's `--init-expert-location` file atomically: `{"physical_to_logical_map": [M, P]}`, nothing
    else, the placement's L layers at `model_layers.moe_layer_ids` of the model's M layers
    (`sglang_physical_to_logical_map`; `PlacementFormatError` when L is not the model's MoE layer count)."""
    data = {"physical_to_logical_map": sglang_physical_to_logical_map(placement, model_layers).tolist()}
    write_text_atomically(path, json.dumps(data, separators=(",", ":")) + "\n")
