"""The `eplb` command line: synthesise, place, score, replay and plot routing traces.

Every subcommand exits 0 on success and 2 on bad input, with one line on stderr that says what was wrong.
"""

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from collectives.lifeline import exit_on_signals
from eplb.cli import advise_command, commands, demo, flags, sim_command
from eplb.cli.advise_flags import add_advise_command
from eplb.cli.arg_types import (BURST_FACTOR, DRIFT_RATIO, NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT,
                                POSITIVE_INT, SEED, bounded)
from eplb.cli.demo import DEMO_EXPERTS, DEMO_LAYERS
from eplb.cli.error_lines import is_input_error, message
from eplb.cli.flags import OneLineParser
from eplb.cli.output_paths import check_paths
from eplb.cli.trtllm_output import layer_ids_arg
from placement.patch_planner import PatchPace, PatchSettings
from traces.atomic_file import all_or_nothing
from traces.model_layers import MAX_MODEL_LAYERS
from traces.synthetic import MAX_TRACE_VALUES

DESCRIPTION = """\
Expert-parallel load balancer for mixture-of-experts decode.

A routing trace counts the tokens each logical expert receives per step and layer ([T, L, E]). A placement
says which expert each of the G x S slots of the EP group holds, and each replica's share of its expert's
tokens. Imbalance is max / mean tokens per GPU, per step and layer; 1.0 is perfect.

Traces: .npz with `counts` [T, L, E] (written by `eplb synth`), .npy [T, L, E], SGLang dumps (.pt, stat or
detail mode: recorded steps and MoE layers kept), top-k id logs (.npz with `<task>_topk_ids` [L, N, K], needs
--tokens-per-step), or
TensorRT-LLM expert-statistic directories ($EXPERT_STATISTIC_PATH: meta_info.json, rank<r>.safetensors).
"""

EPILOG = """\
examples:
  eplb demo
  eplb synth --out trace.npz --steps 2000 --layers 61 --experts 256 --top-k 8 --tokens-per-step 8192 --seed 0
  eplb place --trace trace.npz --gpus 64 --slots-per-gpu 5 --out placement.json --plot gpu_loads.png
  eplb score --placement placement.json --trace trace.npz --routing dynamic --json
  eplb replay --trace trace.npz --gpus 64 --slots-per-gpu 5 --policy deepseek --every 50 --window 50 --plot replay.png
  eplb synth --out requests.npz --requests decode --steps 400 --layers 8 --tokens-per-step 8192
  # a top-k id log of real routing (ESFT's, converted from deepseek-ai/ESFT's results/expert_scores: docs/cli.md)
  eplb place --trace esft_vanilla_lite_routing.npz --tokens-per-step 256 \\
      --task law --gpus 16 --slots-per-gpu 5 --out esft.json
"""


DEEPSEEK_V3_EXPERT_BYTES = 3 * 7168 * 2048

def build_parser() -> argparse.ArgumentParser:
    """The `eplb` parser: global flags, then one subparser per subcommand (in the order `--help` lists them)."""
    parser = OneLineParser(prog="eplb", description=DESCRIPTION, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what each step read, fitted and wrote to stderr (before the subcommand)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    _add_demo_command(sub)
    _add_synth_command(sub)
    _add_place_command(sub)
    _add_score_command(sub)
    _add_replay_command(sub)
    _add_sim_command(sub)
    add_advise_command(sub)
    _add_plot_command(sub)
    return parser


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    """`eplb demo`: its flags."""
    p = sub.add_parser("demo", help="the main job on an embedded default: synth, place, score, replay, plot",
                       description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="out/demo", help="where plots, trace and placement go (default out/demo)")
    most = MAX_TRACE_VALUES // (DEMO_LAYERS * DEMO_EXPERTS)
    p.add_argument("--steps", type=bounded(int, 51, high=most), default=250,
                   help=f"steps of the synthetic trace (default 250, at most {most:,})")
    p.add_argument("--layers", type=bounded(int, 1, high=DEMO_LAYERS), default=DEMO_LAYERS,
                   help=f"MoE layers of the synthetic traces (default {DEMO_LAYERS}, DeepSeek-V3's; fewer run faster)")
    flags.add_budget(p)
    flags.add_common(p)


def _add_synth_command(sub: argparse._SubParsersAction) -> None:
    """`eplb synth`: its flags."""
    p = sub.add_parser("synth", help="write a synthetic decode routing trace")
    p.add_argument("--out", required=True, help="output trace (.npz keeps the header, .npy only counts)")
    p.add_argument("--steps", type=POSITIVE_INT, default=2000, help="T: decode steps (default 2000)")
    p.add_argument("--layers", type=POSITIVE_INT, default=61, help="L: MoE layers (default 61)")
    p.add_argument("--experts", type=POSITIVE_INT, default=256, help="E: logical experts per layer (default 256)")
    p.add_argument("--top-k", type=POSITIVE_INT, default=8, help="K: experts per token (default 8)")
    p.add_argument("--tokens-per-step", type=POSITIVE_INT, default=8192, help="N: tokens per step (default 8192)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed (default 0)")
    p.add_argument("--popularity", default="lognormal", choices=("lognormal", "zipf"),
                   help="popularity shape: lognormal (tuned by --skew) or zipf (tuned by --zipf-exponent)")
    p.add_argument("--skew", type=NON_NEGATIVE_FLOAT, default=None,
                   help="lognormal only: sigma of expert popularity (default 0.8)")
    p.add_argument("--zipf-exponent", type=NON_NEGATIVE_FLOAT, default=None,
                   help="zipf only: exponent s of popularity rank**-s (default 1.0)")
    p.add_argument("--requests", default=None, choices=("prefill", "decode"),
                   help="request-level traffic instead of independent tokens: prefill batches of whole prompts "
                        "(chunked) or decode steps under continuous batching; requests keep their own experts")
    p.add_argument("--concentration", type=POSITIVE_FLOAT, default=None,
                   help="--requests only: Dirichlet concentration of a request's expert preferences (default "
                        "158, measured on ESFT; smaller: requests keep more to their own experts)")
    p.add_argument("--prompt-tokens", type=POSITIVE_FLOAT, default=None,
                   help="--requests only: mean prompt length (default 4096)")
    p.add_argument("--output-tokens", type=POSITIVE_FLOAT, default=None,
                   help="--requests only: mean output length (default 512)")
    p.add_argument("--tokens-per-request", type=POSITIVE_INT, default=None,
                   help="--requests decode only: tokens a request adds a step, 1 + accepted drafts (default 1)")
    p.add_argument("--request-trace", default=None,
                   help="--requests only: Mooncake .jsonl or Azure .csv trace whose prompt and output lengths the "
                        "requests take (default: lognormal lengths)")
    p.add_argument("--plot", default=None, help="also write a load heatmap PNG here")
    flags.add_common(p)


def _add_place_command(sub: argparse._SubParsersAction) -> None:
    """`eplb place`: its flags."""
    p = sub.add_parser("place", help="fit a placement to a trace and write the placement file")
    flags.add_trace(p)
    flags.add_cluster(p)
    flags.add_routing(p)
    p.add_argument("--out", required=True,
                   help="placement file to write (this project's JSON, with replica shares; SGLang refuses it: give "
                        "SGLang the --sglang-out file)")
    p.add_argument("--sglang-out", default=None, metavar="FILE",
                   help="also write the file SGLang's --init-expert-location takes: {physical_to_logical_map}, one "
                        "row per model layer (dense layers included) as SGLang indexes it; the layers come from an "
                        "SGLang dump, else from --sglang-num-layers and --sglang-first-moe-layer")
    p.add_argument("--sglang-num-layers", type=bounded(int, 1, high=MAX_MODEL_LAYERS), default=None, metavar="N",
                   help="with --sglang-out: the model's decoder layers, num_hidden_layers of its config (61 for "
                        "DeepSeek-V3)")
    p.add_argument("--sglang-first-moe-layer", type=bounded(int, 0, high=MAX_MODEL_LAYERS - 1), default=None,
                   metavar="K",
                   help="with --sglang-out: the model's first MoE layer, first_k_dense_replace of a DeepSeek config "
                        "(3 for DeepSeek-V3; 0 where every layer is MoE); the trace's layers are layers K to N - 1")
    p.add_argument("--trtllm-out", default=None, metavar="YAML",
                   help="also write TensorRT-LLM's moe_load_balancer.yaml (num_slots, initial_global_assignments, "
                        "layer_updates_per_iter 0) for ep_size = --gpus, for its moe_config.load_balancer")
    p.add_argument("--trtllm-layers", type=layer_ids_arg, default=None, metavar="IDS",
                   help="with --trtllm-out: the model's decoder-layer index of each MoE layer of the trace, which "
                        "TensorRT-LLM keys the file by (e.g. 3-60 for DeepSeek-V3; 1,3,5 lists them; default: the "
                        "layers a TensorRT-LLM dump recorded, needed for any other trace)")
    p.add_argument("--trtllm-mtp-layers", type=layer_ids_arg, default=None, metavar="IDS",
                   help="with --trtllm-out, to serve with MTP: the MTP layers' ids, which TensorRT-LLM also looks up "
                        "(61 for DeepSeek-V3); one the trace recorded keeps its own placement, any other holds the "
                        "trace's last layer's placement as a stand-in, as the file's comment says")
    p.add_argument("--plot", default=None, help="also write per-GPU loads before/after as a PNG here")
    p.add_argument("--current", default=None,
                   help="placement file now serving: relabel the new placement's GPUs and slots to move the fewest "
                        "experts, and report the copies and bytes moved")
    p.add_argument("--bytes-per-expert", type=POSITIVE_INT, default=DEEPSEEK_V3_EXPERT_BYTES,
                   help="bytes of one expert's weights in one layer (default %(default)s: DeepSeek-V3, "
                        "3 x 7168 x 2048 FP8)")
    flags.add_common(p)


def _add_score_command(sub: argparse._SubParsersAction) -> None:
    """`eplb score`: its flags."""
    p = sub.add_parser("score", help="score a placement on a trace")
    p.add_argument("--placement", required=True, help="placement file written by `eplb place`")
    flags.add_trace(p)
    flags.add_routing(p)
    p.add_argument("--plot", default=None, help="also write per-GPU loads before/after as a PNG here")
    p.add_argument("--burst-factor", type=BURST_FACTOR, default=None, metavar="F",
                   help="also report the burst exposure: the imbalance under the best split while one expert's load "
                        "(the trace's mean) is F times as high, averaged over layers and experts, and the worst "
                        "(for example 4)")
    flags.add_metric_groups(p)
    flags.add_common(p)


def _add_replay_command(sub: argparse._SubParsersAction) -> None:
    """`eplb replay`: its flags."""
    p = sub.add_parser("replay", help="rolling replay: refit every N steps on the last W, score what follows")
    flags.add_trace(p)
    flags.add_cluster(p)
    flags.add_routing(p)
    p.add_argument("--every", type=POSITIVE_INT, required=True, help="refit every N steps")
    p.add_argument("--window", type=POSITIVE_INT, required=True, help="fit on the last W steps")
    p.add_argument("--lag", type=NON_NEGATIVE_INT, default=0, metavar="STEPS",
                   help="steps from the end of a fit window until its placement serves (solve and weight transfer "
                        "time over the step time; default 0: at once)")
    p.add_argument("--refit-on-drift", type=DRIFT_RATIO, default=None, metavar="RATIO",
                   help="also refit at once when a served step's imbalance exceeds RATIO times the fitted one, on "
                        "the steps since that step (for example 1.4; default: fixed cadence only)")
    p.add_argument("--forecast", choices=("trend", "none"), default="trend",
                   help="trend (default): where the window's own later steps confirm a trend, fit each placement "
                        "on its window moved along each expert's load trend to the steps it will serve (--lag and "
                        "--every set how far), else on the window as it is (windows under 8 steps, noise, a level "
                        "shift such as a switch of task); none: always fit the window as it is")
    p.add_argument("--patch-every", type=NON_NEGATIVE_INT, default=PatchSettings().every, metavar="STEPS",
                   help="between refits, patch the serving placement every STEPS steps with the live rebalancer's "
                        "planner: drift swaps toward the last steps' mix, kept until the next refit, and a few replica "
                        f"slots per layer moved to the experts the last {PatchSettings().window} steps overload "
                        "(default %(default)s; 0: no patches)")
    p.add_argument("--patch-lag", type=NON_NEGATIVE_INT, default=PatchPace().lag, metavar="STEPS",
                   help="steps from the last step a patch sees until it serves (its job, weight rounds and switch; "
                        "a live group's pace: docs/rebalancing.md; default %(default)s)")
    p.add_argument("--patch-burst-lag", type=NON_NEGATIVE_INT, default=None, metavar="STEPS",
                   help="the layers whose burst moves come or go serve STEPS after the steps a patch saw, ahead of "
                        "its other layers at --patch-lag, as a live patch switches its layers as their weights land "
                        "(within (--patch-lag - --patch-every, --patch-lag]; default: all at --patch-lag)")
    p.add_argument("--drift-swaps", type=NON_NEGATIVE_INT, default=PatchSettings().drift_swaps, metavar="N",
                   help="with patches, up to N swaps of two experts' replica sets per layer and patch toward the mix "
                        f"of the last {PatchSettings().drift_window} steps seen (ring layouts, as cpsat fits them; "
                        "default %(default)s; 0: none)")
    p.add_argument("--drift-stride", type=POSITIVE_INT, default=PatchSettings().drift_stride, metavar="K",
                   help="with drift swaps, each layer gets them in every K-th patch, the layers taking turns "
                        "(default %(default)s)")
    p.add_argument("--refit-blocks-patches", action="store_true",
                   help="start no patch while a refit is in flight (from its fit until it serves, --lag steps), as "
                        "a live group runs them; the last patch serves on until the refit lands (default: patches "
                        "go on while refits solve and move)")
    p.add_argument("--plot", default=None, help="also write imbalance over time as a PNG here")
    flags.add_metric_groups(p)
    flags.add_common(p)


def _add_sim_command(sub: argparse._SubParsersAction) -> None:
    """`eplb sim`: its flags."""
    p = sub.add_parser("sim", help="simulate the serving cluster: vision, prefill with KV cache tiers, decode EP units",
                       description=sim_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=("validate",), default=None,
                   help="validate: instead of a run, print every published anchor (sim/anchors/) beside the "
                        "simulator's figure, with its role (fitted, predicted, identity), error and command")
    p.add_argument("--refit", action="store_true",
                   help="with validate: refit the declared calibration's constants (sim/calibration.yaml) from their "
                        "fitted anchors and print them beside the file's")
    p.add_argument("--anchors", default=None, metavar="PATH",
                   help="with validate: an anchors file of the same format (default: "
                        "sim/anchors/anchors.yaml)")
    p.add_argument("--write", action="store_true",
                   help="with validate --refit: rewrite sim/calibration.yaml with the refitted values (atomically)")
    p.add_argument("--config", default=None,
                   help="simulator config, YAML or JSON (default: the embedded one: a minute of synthetic traffic "
                        "through one 128-card decode unit, 16 prefill nodes and 4 vision cards)")
    p.add_argument("--out-dir", default=None, help="also write report.json and the figures here")
    p.add_argument("--days", type=float, default=None,
                   help="days to simulate, for a config with a fleet section (overrides its fleet.days; for "
                        "example sim/configs/deepseek-feb2025-day.yaml)")
    p.add_argument("--capacity", action="store_true",
                   help="instead of a run: raise the load until the latency targets bind and report per-card decode "
                        "and prefill tokens/s there (the config's capacity section sets the operating point)")
    p.add_argument("--tpot-slo-ms", type=bounded(float, 0, low_open=True, high=10_000), default=None,
                   help="with --capacity: the decode target, ms per output token (overrides capacity.tpot_slo_ms)")
    p.add_argument("--ttft-slo-s", type=bounded(float, 0, low_open=True, high=3600), default=None,
                   help="with --capacity: the longest prefill batch, seconds (overrides capacity.ttft_slo_s)")
    p.add_argument("--curve", type=bounded(float, 0, low_open=True, high=10_000), nargs="*", default=None,
                   metavar="MS", help="with --capacity: also the decode latency-throughput curve, the capacity at "
                                      "each of these TPOT targets (default 10 15 20 30 40 50 70 100 150 ms)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="with --capacity: also plot the decode curve (TPOT against tokens/s per card) to this file")
    flags.add_scenarios(p, "also run each figure over", "with --capacity: ")
    flags.add_common(p)


def _add_plot_command(sub: argparse._SubParsersAction) -> None:
    """`eplb plot`: its flags."""
    p = sub.add_parser("plot", help="write figures for a trace (and a placement)")
    flags.add_trace(p)
    p.add_argument("--placement", default=None, help="placement file: adds per-GPU loads before/after")
    p.add_argument("--out-dir", default="out/plots", help="directory for the PNG files (default out/plots)")
    flags.add_common(p)


HANDLERS = {
    "demo": demo.cmd_demo,
    "synth": commands.cmd_synth,
    "place": commands.cmd_place,
    "score": commands.cmd_score,
    "replay": commands.cmd_replay,
    "plot": commands.cmd_plot,
    "sim": sim_command.cmd_sim,
    "advise": advise_command.cmd_advise,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `eplb` console script; returns the exit status.

    Every path is checked before any work (no output may name an input or another output), and the command's
    files are written together at its end: a command that fails leaves no file behind.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if argv is None:  # the console script: SIGTERM unwinds as Ctrl-C does, so no temporary file is left behind
        exit_on_signals((signal.SIGTERM,))
    previous_handler, interrupted = _note_interrupts()
    try:
        check_paths(args)
        with all_or_nothing():
            return HANDLERS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if interrupted:  # whatever a library raised once Ctrl-C cut into it, the user stopped the command
            return 130
        if not is_input_error(exc):
            raise  # a bug, not bad input: its traceback is what a report needs
        print(f"eplb {args.command}: error: {message(exc, args.command)}", file=sys.stderr)
        return 2
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)


def _note_interrupts() -> tuple[object, list[int]]:
    """Make Ctrl-C raise KeyboardInterrupt as usual and also record it in the returned list (non-empty once it
    came), so that an error a library raises after being cut short is not taken for bad input. Returns the handler
    it replaced (None off the main thread, where no handler can be set) and the list."""
    interrupted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return None, interrupted

    def on_interrupt(signum: int, frame) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, on_interrupt), interrupted


