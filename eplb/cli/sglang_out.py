"""`eplb place --sglang-out`: which model layers the SGLang map's rows are, from the trace or from two flags.

SGLang indexes its map by decoder layer over the model's `num_hidden_layers` (`eplb/engines/sglang/expert_map.py`). An
SGLang dump records that layout (its layer axis is every decoder layer; the dense ones route nothing); other traces
count MoE layers only, so `--sglang-num-layers` and `--sglang-first-moe-layer` name it. Anything that does not add up is
refused before the fit, in one line naming the flags: the flags and an SGLang dump's layout before the trace is read (so
no note of the reader's comes before the error), the trace's layer count once it is.
"""

import argparse
from pathlib import Path

from traces import RoutingTrace, TraceFormatError
from traces.model_layers import MAX_MODEL_LAYERS, ModelLayers
from traces.sglang_dump import read_sglang_dump

EXAMPLES = "61 and 3 for DeepSeek-V3 and R1, 48 and 0 for Qwen3-30B-A3B"


def sglang_model_layers(args: argparse.Namespace) -> ModelLayers | None:
    """The layout `--sglang-out` writes rows for (None without --sglang-out); `TraceFormatError` naming the flags when
    they are incomplete, disagree with an SGLang dump's own layout, or are missing for a trace that records none."""
    num_layers, first = args.sglang_num_layers, args.sglang_first_moe_layer
    if args.sglang_out is None:
        if num_layers is not None or first is not None:
            raise TraceFormatError("--sglang-num-layers and --sglang-first-moe-layer shape the --sglang-out file; add "
                                   "--sglang-out FILE or drop them")
        return None
    if not str(args.sglang_out).endswith(".json"):
        raise TraceFormatError(f"--sglang-out {args.sglang_out} must end in .json: SGLang reads --init-expert-location "
                               f"from a file only by that suffix (other text it parses as JSON itself)")
    if (num_layers is None) != (first is None):
        missing = "--sglang-first-moe-layer" if first is None else "--sglang-num-layers"
        raise TraceFormatError(f"--sglang-num-layers and --sglang-first-moe-layer go together; add {missing} "
                               f"({EXAMPLES})")
    if num_layers is not None and num_layers > MAX_MODEL_LAYERS:
        raise TraceFormatError(f"--sglang-num-layers {num_layers} is more decoder layers than a model has; give the "
                               f"model config's num_hidden_layers, at most {MAX_MODEL_LAYERS} ({EXAMPLES})")
    if first is not None and first >= num_layers:
        raise TraceFormatError(f"--sglang-first-moe-layer {first} must be below --sglang-num-layers {num_layers}")
    named = None if first is None else ModelLayers.from_first_moe_layer(first, num_layers)
    recorded = read_sglang_dump(args.trace).model_layers if Path(args.trace).suffix.lower() == ".pt" else None
    if named is not None and recorded is not None and named != recorded:
        raise TraceFormatError(f"--sglang-num-layers {num_layers} --sglang-first-moe-layer {first} name "
                               f"{named.describe()}, but the SGLang dump {Path(args.trace).name} records "
                               f"{recorded.describe()}; drop both flags to use the dump's")
    layers = named or recorded
    if layers is None:
        raise TraceFormatError(f"--sglang-out needs the model's layers, which {Path(args.trace).name} does not record; "
                               f"add --sglang-num-layers N --sglang-first-moe-layer K (num_hidden_layers and the "
                               f"first MoE layer of the model's config: {EXAMPLES})")
    return layers


def check_sglang_layers(args: argparse.Namespace, layers: ModelLayers | None, trace: RoutingTrace) -> None:
    """`TraceFormatError` naming the flags unless the trace's L layers are the MoE layers `layers` names."""
    if layers is None or layers.num_moe_layers == trace.num_layers:
        return
    num_layers, first = args.sglang_num_layers, args.sglang_first_moe_layer  # only flags can disagree with a trace
    fix = num_layers - trace.num_layers
    hint = f"--sglang-first-moe-layer {fix}" if fix >= 0 else f"--sglang-num-layers of at least {trace.num_layers}"
    raise TraceFormatError(f"the trace has {trace.num_layers} MoE layers but --sglang-num-layers {num_layers} "
                           f"--sglang-first-moe-layer {first} name {layers.num_moe_layers} (SGLang indexes its map "
                           f"by model layer: a shifted map serves every layer another's experts); give {hint}")
