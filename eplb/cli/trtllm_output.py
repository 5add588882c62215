"""What `eplb place` and `eplb score` add for TensorRT-LLM: `--trtllm-out` (its `moe_load_balancer.yaml`, keyed by
the model's layer ids) and `report_load_statistics.py`'s imbalance-ratio beside this project's figures.

Layer ids: TensorRT-LLM keys `initial_global_assignments` by decoder-layer index (3 to 60 for DeepSeek-V3's 58 MoE
layers). A TensorRT-LLM dump names them (`traces.trtllm_statistics`); any other trace needs `--trtllm-layers`.
Served with MTP, TensorRT-LLM also looks up the MTP layers (61 for DeepSeek-V3): `--trtllm-mtp-layers` adds their keys
(`eplb.engines.trtllm.load_balancer_file.mtp_stand_ins` says which placement each holds).
"""

import argparse

import numpy as np

from placement import Placement
from placement.errors import PlacementFormatError
from eplb.engines.trtllm.load_balancer_file import mtp_stand_ins, parse_layer_ids, save_trtllm_config
from eplb.engines.trtllm.report import projected_imbalance_ratio, recorded_imbalance_ratio
from traces import EplbError, RoutingTrace
from traces.trtllm_statistics import is_trtllm_dump, layer_span, read_dump_layout

FIGURE = "TensorRT-LLM imbalance-ratio (report_load_statistics.py: max / mean - 1 per iteration, averaged)"


def layer_ids_arg(text: str) -> tuple[int, ...]:
    """argparse type of `--trtllm-layers`: '3-60', '1,3,5' ..."""
    try:
        return parse_layer_ids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def trtllm_layer_ids(args: argparse.Namespace, trace: RoutingTrace) -> tuple[int, ...] | None:
    """The layer ids `--trtllm-out` keys its file by (None without `--trtllm-out`): the dump's when the trace is a
    TensorRT-LLM dump, else `--trtllm-layers`, one per layer of the trace. Checked before any fit.

    Raises:
        EplbError: one line naming the flags: --trtllm-layers or --trtllm-mtp-layers without --trtllm-out,
            --trtllm-layers missing, of another count than the trace's layers, or other than the layers the dump
            recorded; an MTP layer id neither among those layers nor above them.
    """
    given = args.trtllm_layers
    mtp = getattr(args, "trtllm_mtp_layers", None)
    if not args.trtllm_out:
        for flag, value in (("--trtllm-layers", given), ("--trtllm-mtp-layers", mtp)):
            if value is not None:
                raise EplbError(f"{flag} applies only with --trtllm-out; add --trtllm-out moe_load_balancer.yaml or "
                                f"drop {flag}")
        return None
    layer_ids = _trace_layer_ids(args, trace, given)
    try:
        mtp_stand_ins(layer_ids, mtp or ())
    except PlacementFormatError as exc:  # it names the library's parameter; the user typed the flag
        raise EplbError(str(exc).replace("mtp_layer_ids", "--trtllm-mtp-layers")) from None
    return layer_ids


def _trace_layer_ids(args: argparse.Namespace, trace: RoutingTrace, given: tuple[int, ...] | None) -> tuple[int, ...]:
    """The layer id of each layer of the trace: the dump's, or `--trtllm-layers` (checked against the trace)."""
    if is_trtllm_dump(args.trace):
        recorded = read_dump_layout(args.trace).layer_ids
        if given is not None and given != recorded:
            raise EplbError(f"--trtllm-layers {layer_span(given)} differs from the layers the TensorRT-LLM dump "
                            f"{args.trace} recorded ({layer_span(recorded)}); drop --trtllm-layers to use the dump's")
        return recorded
    if given is None:
        raise EplbError(f"--trtllm-out needs --trtllm-layers: TensorRT-LLM keys each layer by its decoder-layer index "
                        f"and {args.trace} does not say them; give them (e.g. --trtllm-layers 3-60 for DeepSeek-V3)")
    if len(given) != trace.num_layers:
        raise EplbError(f"--trtllm-layers {layer_span(given)} names {len(given)} layers but the trace has "
                        f"{trace.num_layers}; give one id per MoE layer of the trace")
    return given


def write_trtllm(args: argparse.Namespace, placement: Placement, counts_TLE: np.ndarray,
                 layer_ids: tuple[int, ...]) -> tuple[dict, str]:
    """Write `--trtllm-out`; return its JSON keys and its line of the table: the file, its ep_size, the MTP layers'
    keys (`trtllm_mtp_layers`; `trtllm_mtp_stand_ins`: {MTP layer: the layer whose placement it holds}, for those the
    trace has no statistics of), and the TensorRT-LLM figure of `placement` on the fitted steps (its equal split over
    replicas, as TensorRT-LLM routes)."""
    mtp = tuple(getattr(args, "trtllm_mtp_layers", None) or ())
    save_trtllm_config(placement, args.trtllm_out, layer_ids, mtp)
    stand_ins = mtp_stand_ins(layer_ids, mtp)
    ratio = projected_imbalance_ratio(placement, counts_TLE)
    result = {"trtllm_out": str(args.trtllm_out), "trtllm_layers": list(layer_ids), "trtllm_imbalance_ratio": ratio}
    mtp_text = ""
    if mtp:
        result.update({"trtllm_mtp_layers": list(mtp),
                       "trtllm_mtp_stand_ins": {str(layer): source for layer, source in stand_ins.items()}})
        mtp_text = "; MTP " + ", ".join(f"{layer} (layer {stand_ins[layer]}'s placement, a stand-in)"
                                        if layer in stand_ins else f"{layer} (its own statistics)" for layer in mtp)
    line = (f"wrote {args.trtllm_out}: serve with ep_size {placement.cluster.num_gpus}, layers "
            f"{layer_span(layer_ids)}{mtp_text}; {FIGURE} on the fitted steps: {_figure(ratio)}\n")
    return result, line


def trtllm_scores(args: argparse.Namespace, placement: Placement, counts_TLE: np.ndarray) -> tuple[dict, str]:
    """For a TensorRT-LLM dump (else nothing): `report_load_statistics.py`'s figure on it as recorded (ranks = its
    rank files) and with `placement` (`--projection_eplb_config_path` on the file `--trtllm-out` writes)."""
    if not is_trtllm_dump(args.trace):
        return {}, ""
    ranks = read_dump_layout(args.trace).num_ranks
    recorded = recorded_imbalance_ratio(counts_TLE, ranks)
    projected = projected_imbalance_ratio(placement, counts_TLE)
    result = {"trtllm_recorded_imbalance_ratio": recorded, "trtllm_recorded_ranks": ranks,
              "trtllm_imbalance_ratio": projected}
    text = (f"\n{FIGURE}:\n  as recorded ({ranks} rank files): {_figure(recorded)}; with this placement "
            f"(--projection_eplb_config_path, ep_size {placement.cluster.num_gpus}): {_figure(projected)}")
    return result, text


def _figure(ratio: float | None) -> str:
    return "n/a (no layer has tokens in every iteration, or the ids do not split evenly over the ranks)" \
        if ratio is None else f"{ratio:.4f}"
