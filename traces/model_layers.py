"""Which of a model's decoder layers are MoE layers: the layout an engine's expert map is indexed by.

A routing trace counts MoE layers only (L of them); SGLang indexes `physical_to_logical_map` by the model's absolute
layer id over all `num_hidden_layers`, dense layers included. DeepSeek-V3: 61 layers, the first 3 dense
(`first_k_dense_replace`), so trace layer l is model layer l + 3, and a map row per model layer has 61 rows.
"""

from dataclasses import dataclass

from traces.errors import TraceFormatError

# The most decoder layers a model may have (the largest MoE models have about a hundred): a layer count or a layer id
# read from a file or a flag is checked against it before anything is sized by it.
MAX_MODEL_LAYERS = 1024


@dataclass(frozen=True)
class ModelLayers:
    """A model's decoder layers and which of them hold experts.

    Attributes:
        num_layers: the model's decoder layers (`num_hidden_layers` of its config), dense ones included.
        moe_layer_ids: [L] increasing model layer ids of the MoE layers; trace layer l is model layer
            `moe_layer_ids[l]`.
    """

    num_layers: int
    moe_layer_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        ids = self.moe_layer_ids
        if not isinstance(self.num_layers, int) or isinstance(self.num_layers, bool) or \
                not 1 <= self.num_layers <= MAX_MODEL_LAYERS:
            raise TraceFormatError(f"num_layers must be an integer in [1, {MAX_MODEL_LAYERS}] (a model's decoder "
                                   f"layers); got {self.num_layers!r}")
        if not ids or any(not 0 <= i < self.num_layers for i in ids) or list(ids) != sorted(set(ids)):
            raise TraceFormatError(f"moe_layer_ids must be increasing layer ids in [0, num_layers={self.num_layers}); "
                                   f"got {_span(ids)}")

    @classmethod
    def from_first_moe_layer(cls, first_moe_layer: int, num_layers: int) -> "ModelLayers":
        """Dense layers 0 .. first_moe_layer - 1, MoE layers from there to the last (DeepSeek's and Qwen3-MoE's
        layout: `first_k_dense_replace` dense layers first)."""
        if not 0 <= first_moe_layer < num_layers:
            raise TraceFormatError(f"first_moe_layer={first_moe_layer} must be below num_layers={num_layers} "
                                   f"(the model's first MoE layer and its layer count)")
        return cls(num_layers, tuple(range(first_moe_layer, num_layers)))

    @property
    def num_moe_layers(self) -> int:
        """L: the MoE layers, the trace's layer count."""
        return len(self.moe_layer_ids)

    @property
    def dense_layer_ids(self) -> tuple[int, ...]:
        """The model layer ids without experts."""
        moe = set(self.moe_layer_ids)
        return tuple(i for i in range(self.num_layers) if i not in moe)

    def describe(self) -> str:
        """One phrase for messages: '61 layers, MoE layers 3-60'."""
        return f"{self.num_layers} layers, MoE layers {_span(self.moe_layer_ids)}"


def _span(ids) -> str:
    """'3-60' for a run of consecutive ids, else the ids listed (the first few)."""
    ids = list(ids)
    if ids and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    shown = ", ".join(map(str, ids[:6]))
    return f"[{shown}{', ...' if len(ids) > 6 else ''}]"
