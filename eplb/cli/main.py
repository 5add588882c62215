"""The `eplb` command line: synthesise, place, score, replay and plot routing traces.

Every subcommand exits 0 on success and 2 on bad input, with one line on stderr that says what was wrong.
"""

import argparse
import logging
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError

from collectives.lifeline import exit_on_signals
from eplb.cli import advise_command, commands, demo, sim_command
from eplb.cli.arg_types import SEED_MAX, comma_separated, integer, number, one_of
from eplb.cli.commands import CPSAT_SEED, CPSAT_WORKERS
from eplb.cli.demo import DEMO_EXPERTS, DEMO_LAYERS
from eplb.cli.output_paths import check_paths
from eplb.cli.trtllm_output import layer_ids_arg
from placement import POLICIES, ROUTINGS, PlacementFormatError
from placement.cluster import MAX_GPUS, MAX_SLOTS_PER_GPU
from placement.patch_planner import PatchPace, PatchSettings
from traces import EplbError
from traces.model_layers import MAX_MODEL_LAYERS
from traces.synthetic import MAX_TRACE_VALUES
from traces.trtllm_statistics import TrtllmDumpError
from traces.atomic_file import all_or_nothing

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

# Library errors name parameters; the command line speaks of the flags a user types.
FLAG_OF_PARAMETER = {
    "num_gpus": "--gpus", "slots_per_gpu": "--slots-per-gpu", "gpus_per_node": "--gpus-per-node",
    "tokens_per_step": "--tokens-per-step", "num_experts": "--num-experts", "tasks": "--task",
    "time_limit_s": "--time-limit", "work_limit": "--work-limit", "nodes_per_group": "--nodes-per-group",
    "num_groups": "--groups", "groups": "--groups",
    "migration_cost": "--migration-cost", "drift_ratio": "--refit-on-drift", "every": "--every",
    "window": "--window", "lag": "--lag", "workers": "--workers",
}
# `eplb synth` names the trace's shape by other flags than the readers do.
SYNTH_FLAG_OF_PARAMETER = {
    "num_steps": "--steps", "num_layers": "--layers", "num_experts": "--experts", "top_k": "--top-k",
    "tokens_per_step": "--tokens-per-step", "zipf_exponent": "--zipf-exponent", "skew": "--skew",
    "tokens_per_request": "--tokens-per-request", "concentration": "--concentration",
    "prompt_tokens": "--prompt-tokens", "output_tokens": "--output-tokens", "request_trace": "--request-trace",
}


def _number(kind: Callable[[str], float], low: float, *, low_open: bool = False, high: float | None = None):
    """An argparse type: a finite number of `kind` >= low (> low when `low_open`) and <= high when given."""
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    limit = f" and <= {high:g}" if high is not None else ""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}{limit}; got {text!r}") from None
        too_high = high is not None and value > high
        if not math.isfinite(value) or value < low or (low_open and value == low) or too_high:
            raise argparse.ArgumentTypeError(f"must be {bound}{limit}; got {text}")
        return value

    return parse


POSITIVE_INT = _number(int, 1)
NON_NEGATIVE_INT = _number(int, 0)
POSITIVE_FLOAT = _number(float, 0, low_open=True)
NON_NEGATIVE_FLOAT = _number(float, 0)
GPUS = _number(int, 1, high=MAX_GPUS)
SLOTS_PER_GPU = _number(int, 1, high=MAX_SLOTS_PER_GPU)
DRIFT_RATIO = _number(float, 1, low_open=True)
BURST_FACTOR = _number(float, 1)
WORK_LIMIT = _number(float, 0, low_open=True, high=1e6)
TIME_LIMIT = _number(float, 0, low_open=True, high=86400)
SEED = _number(int, 0, high=SEED_MAX)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line on stderr and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors; no progress bar")


def _add_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="routing trace file (.npz, .npy, SGLang .pt, top-k id log) or "
                                                         "TensorRT-LLM expert-statistic directory")
    _add_topk_log(parser, "concatenated")
    parser.add_argument("--steps", default=None, metavar="START:STOP", help="use only these steps of the trace")


def _add_topk_log(parser: argparse.ArgumentParser, tasks: str) -> None:
    """The flags a top-k id log is read with; `tasks` says how several tasks are put in one stream."""
    parser.add_argument("--tokens-per-step", type=POSITIVE_INT, default=None,
                        help="top-k id logs only: tokens per step (e.g. 256 for the ESFT logs)")
    parser.add_argument("--task", default=None,
                        help=f"top-k id logs only: comma-separated tasks to read (default: all, {tasks})")
    parser.add_argument("--num-experts", type=POSITIVE_INT, default=None,
                        help="top-k id logs only: E, experts per layer (default: the largest id in any task + 1)")


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=GPUS, required=True,
                        help=f"G: GPUs (or NPUs) in the EP group (at most {MAX_GPUS})")
    parser.add_argument("--slots-per-gpu", type=SLOTS_PER_GPU, required=True,
                        help=f"S: expert slots per GPU (at most {MAX_SLOTS_PER_GPU})")
    parser.add_argument("--gpus-per-node", type=POSITIVE_INT, default=None,
                        help="GPUs per server, for node limits and per-node figures (default: with --current, its "
                             "own on as many GPUs; else 8 where --gpus fills whole 8-GPU servers; else 4 with "
                             "--trtllm-out, GB200 NVL72 trays; else, without --groups, the group as one node)")
    parser.add_argument("--policy", default="deepseek", choices=sorted(POLICIES),
                        help="placement policy (default deepseek: DeepSeek's EPLB greedy, equal split; cpsat: "
                             "OR-Tools CP-SAT fitted to the trace's steps; trivial: no balancing)")
    parser.add_argument("--groups", type=POSITIVE_INT, default=None,
                        help="expert groups (consecutive experts); deepseek: with groups %% nodes == 0 the "
                             "hierarchical policy runs; cpsat: with --nodes-per-group, node-limited placement")
    parser.add_argument("--nodes-per-group", type=POSITIVE_INT, default=None,
                        help="cpsat: most nodes one expert group's replicas may span (needs --groups)")
    _add_budget(parser, given_only=True)
    parser.add_argument("--workers", type=POSITIVE_INT, default=None,
                        help=f"cpsat: layers solved at once (default {CPSAT_WORKERS}; the placement does not depend on "
                             f"it)")
    parser.add_argument("--seed", type=SEED, default=None,
                        help=f"cpsat: solver and sampling seed (default {CPSAT_SEED})")
    parser.add_argument("--migration-cost", type=NON_NEGATIVE_FLOAT, default=0.0,
                        help="cpsat with --current: penalty per expert copy, in units of imbalance (default 0: off)")


def _add_budget(parser: argparse.ArgumentParser, default_work: float = 20.0, given_only: bool = False) -> None:
    """--work-limit and --time-limit; with `given_only` --work-limit stays None unless given (the policy's options
    apply the default, so that a flag given to a policy it does not apply to can be refused)."""
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--work-limit", type=WORK_LIMIT, default=None if given_only else default_work, metavar="UNITS",
                        help=f"cpsat: deterministic budget per fit for all layers, in work units of about a second of "
                             f"one core (default {default_work:g}); the same input gives the same placement in any "
                             f"process, under any load")
    budget.add_argument("--time-limit", type=TIME_LIMIT, default=None, metavar="SECONDS",
                        help="cpsat: a wall-clock budget per fit instead of --work-limit; the placement then depends "
                             "on the machine's speed and load")


def _add_routing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--routing", default="static", choices=ROUTINGS,
                        help="static: fixed replica weights; dynamic: each step re-split optimally; live: each step "
                             "split by the live router decode workers run (default static)")


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
    _add_advise_command(sub)
    _add_plot_command(sub)
    return parser


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    """`eplb demo`: its flags."""
    p = sub.add_parser("demo", help="the main job on an embedded default: synth, place, score, replay, plot",
                       description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="out/demo", help="where plots, trace and placement go (default out/demo)")
    most = MAX_TRACE_VALUES // (DEMO_LAYERS * DEMO_EXPERTS)
    p.add_argument("--steps", type=_number(int, 51, high=most), default=250,
                   help=f"steps of the synthetic trace (default 250, at most {most:,})")
    p.add_argument("--layers", type=_number(int, 1, high=DEMO_LAYERS), default=DEMO_LAYERS,
                   help=f"MoE layers of the synthetic traces (default {DEMO_LAYERS}, DeepSeek-V3's; fewer run faster)")
    _add_budget(p)
    _add_common(p)


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
    _add_common(p)


def _add_place_command(sub: argparse._SubParsersAction) -> None:
    """`eplb place`: its flags."""
    p = sub.add_parser("place", help="fit a placement to a trace and write the placement file")
    _add_trace(p)
    _add_cluster(p)
    _add_routing(p)
    p.add_argument("--out", required=True,
                   help="placement file to write (this project's JSON, with replica shares; SGLang refuses it: give "
                        "SGLang the --sglang-out file)")
    p.add_argument("--sglang-out", default=None, metavar="FILE",
                   help="also write the file SGLang's --init-expert-location takes: {physical_to_logical_map}, one "
                        "row per model layer (dense layers included) as SGLang indexes it; the layers come from an "
                        "SGLang dump, else from --sglang-num-layers and --sglang-first-moe-layer")
    p.add_argument("--sglang-num-layers", type=_number(int, 1, high=MAX_MODEL_LAYERS), default=None, metavar="N",
                   help="with --sglang-out: the model's decoder layers, num_hidden_layers of its config (61 for "
                        "DeepSeek-V3)")
    p.add_argument("--sglang-first-moe-layer", type=_number(int, 0, high=MAX_MODEL_LAYERS - 1), default=None,
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
    _add_common(p)


def _add_score_command(sub: argparse._SubParsersAction) -> None:
    """`eplb score`: its flags."""
    p = sub.add_parser("score", help="score a placement on a trace")
    p.add_argument("--placement", required=True, help="placement file written by `eplb place`")
    _add_trace(p)
    _add_routing(p)
    p.add_argument("--plot", default=None, help="also write per-GPU loads before/after as a PNG here")
    p.add_argument("--burst-factor", type=BURST_FACTOR, default=None, metavar="F",
                   help="also report the burst exposure: the imbalance under the best split while one expert's load "
                        "(the trace's mean) is F times as high, averaged over layers and experts, and the worst "
                        "(for example 4)")
    _add_metric_groups(p)
    _add_common(p)


def _add_replay_command(sub: argparse._SubParsersAction) -> None:
    """`eplb replay`: its flags."""
    p = sub.add_parser("replay", help="rolling replay: refit every N steps on the last W, score what follows")
    _add_trace(p)
    _add_cluster(p)
    _add_routing(p)
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
    _add_metric_groups(p)
    _add_common(p)


def _add_metric_groups(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metric-groups", type=POSITIVE_INT, default=None, metavar="N",
                        help="also report the per-routing-group metric (group/step): the experts cut into N contiguous "
                             "groups, as the model's router groups them (DeepSeek-V3: 8); replay takes --groups when "
                             "this is not given")


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
    p.add_argument("--tpot-slo-ms", type=_number(float, 0, low_open=True, high=10_000), default=None,
                   help="with --capacity: the decode target, ms per output token (overrides capacity.tpot_slo_ms)")
    p.add_argument("--ttft-slo-s", type=_number(float, 0, low_open=True, high=3600), default=None,
                   help="with --capacity: the longest prefill batch, seconds (overrides capacity.ttft_slo_s)")
    p.add_argument("--curve", type=_number(float, 0, low_open=True, high=10_000), nargs="*", default=None,
                   metavar="MS", help="with --capacity: also the decode latency-throughput curve, the capacity at "
                                      "each of these TPOT targets (default 10 15 20 30 40 50 70 100 150 ms)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="with --capacity: also plot the decode curve (TPOT against tokens/s per card) to this file")
    _add_scenarios(p, "also run each figure over", "with --capacity: ")
    _add_common(p)


def _add_scenarios(parser: argparse.ArgumentParser, what: str, scope: str = "") -> None:
    """--scenarios, --bursts and --seeds: the traffic cases a figure is run over (`sim.scenarios`)."""
    parser.add_argument("--scenarios", default="single-dataset,production-mix", metavar="NAMES",
                        help=f"{scope}{what} these traffic scenarios (comma-separated: single-dataset, the fitted "
                             "skew; production-mix, the skew of ESFT's tasks pooled; production-mix-olmoe, OLMoE's "
                             "domains pooled) and print the range beside the central figure (default %(default)s; "
                             "none: the central figure alone)")
    parser.add_argument("--bursts", default="on,off", metavar="ON,OFF",
                        help=f"{scope}the scenarios with bursts on, off or both (default %(default)s)")
    parser.add_argument("--seeds", type=_number(int, 1, high=20), default=3,
                        help=f"{scope}seeds of each scenario (default %(default)s)")


def _add_advise_command(sub: argparse._SubParsersAction) -> None:
    """`eplb advise`: its flags (the card is checked by the command: the simulator's modules load only there)."""
    p = sub.add_parser("advise", help="how many GPUs and redundant experts to deploy, from a trace, model, card and "
                                      "latency target", description=advise_command.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=None,
                   help="decode routing trace, any file `eplb replay` reads (default: a synthetic 61 x 256 trace "
                        "of independent tokens); a top-k id log with --tokens-per-step, its tasks interleaved so "
                        "that every window holds the same mix")
    _add_topk_log(p, "interleaved")
    p.add_argument("--current", type=_layout, default=None, metavar="GxS", dest="current_layout",
                   help="the layout serving now, GPUs x slots per GPU (for example 144x2): its row, the pick's gain "
                        "over it (a range over the traffic scenarios) and the break-even imbalance")
    p.add_argument("--model", default=None, metavar="CONFIG",
                   help="a simulator config (YAML or JSON) whose model section is the served model (default: "
                        "DeepSeek-V3's shape, FP8)")
    p.add_argument("--card", default="H800",
                   help="the decode GPU or NPU, a simulator hardware profile: H800, H100, H20, Ascend910C, L20 "
                        "(default H800)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--tokens-per-user", type=number(0, low_open=True, high=10_000), default=20.0,
                        help="the speed each user must see, output tokens/s (default 20: TPOT 50 ms)")
    target.add_argument("--tpot-ms", type=number(0, low_open=True, high=10_000), default=None,
                        help="the TPOT target, ms per output token (instead of --tokens-per-user)")
    p.add_argument("--context", type=integer(1, 10_000_000), default=4096,
                   help="tokens in each sequence's KV cache (default 4096)")
    p.add_argument("--mtp", action="store_true", help="decode with one MTP draft token (DeepSeek-V3's acceptance)")
    _add_advise_layouts(p)
    _add_advise_prefill(p)
    _add_advise_costs(p)
    _add_advise_engine_files(p)
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw tokens/s per GPU and the imbalance against redundant experts to this file")
    _add_scenarios(p, "rerun the pick, the layouts within 5%% of it and --current over")
    _add_common(p)


def _add_advise_layouts(p: argparse.ArgumentParser) -> None:
    """`eplb advise`: the layouts it tries and how each is replayed."""
    p.add_argument("--ep-sizes", type=comma_separated(integer(1, MAX_GPUS)),
                   default=[32, 64, 72, 128, 144, 160, 256], metavar="G,G,...",
                   help="EP sizes to try (default 32,64,72,128,144,160,256)")
    p.add_argument("--slots-per-gpu", type=comma_separated(integer(1, MAX_SLOTS_PER_GPU)),
                   default=list(range(1, 13)), metavar="S,S,...",
                   help="expert slots per GPU to try (default 1-12); a pair is tried when it holds every expert "
                        "and at most --max-redundant more")
    p.add_argument("--max-redundant", type=integer(0, 100_000), default=128,
                   help="the most redundant experts a layout may have (default 128)")
    p.add_argument("--redundant", type=comma_separated(integer(0, 100_000)), default=None, metavar="R,R,...",
                   help="only layouts with these redundant expert counts (each EP size with the slots per GPU that "
                        "give them)")
    p.add_argument("--node-limits", type=comma_separated(one_of(("none", "groups"))), default=["none", "groups"],
                   metavar="L,L,...",
                   help="try layouts without node limits (none) and with them (groups: every expert group on one "
                        "node, where the groups are a multiple of the nodes; DeepSeek's hierarchical rule, which "
                        "vLLM and SGLang apply there by themselves), decode and prefill (default none,groups)")
    p.add_argument("--layers", type=integer(1, 512), default=8,
                   help="evenly spaced layers of the trace replayed for each layout (default 8; the imbalance is "
                        "their mean)")
    p.add_argument("--refit-every", type=integer(1, 100_000), default=50,
                   help="steps between refits, as your rebalancer runs (default 50)")
    p.add_argument("--window", type=integer(1, 100_000), default=50, help="steps each fit sees (default 50)")
    p.add_argument("--work-limit", type=number(0, low_open=True, high=3600), default=None,
                   help="cpsat's deterministic budget per fit of the replayed layers (default 0.25 a layer)")
    p.add_argument("--max-batch-per-gpu", type=integer(1, 4096), default=256,
                   help="sequences per GPU at most, the engine's batch cap (default 256)")


def _layout(text: str) -> tuple[int, int]:
    """'GxS' -> (G, S): GPUs and slots per GPU of a layout."""
    try:
        gpus, slots = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPUsxSLOTS such as 144x2; got {text!r}") from None
    if not (1 <= gpus <= MAX_GPUS and 1 <= slots <= MAX_SLOTS_PER_GPU):
        raise argparse.ArgumentTypeError(f"{text}: GPUs must be in [1, {MAX_GPUS}] and slots per GPU in [1, "
                                         f"{MAX_SLOTS_PER_GPU}]")
    return gpus, slots


def _add_advise_prefill(p: argparse.ArgumentParser) -> None:
    """`eplb advise`'s prefill flags."""
    p.add_argument("--ttft-s", type=number(0, low_open=True, high=3600), default=None,
                   help="also advise prefill instances: the longest a prefill batch may take, seconds")
    p.add_argument("--prompt-tokens", type=integer(1, 1_000_000), default=4096,
                   help="with --ttft-s: mean prompt length (default 4096)")
    p.add_argument("--cached-share", type=number(0, high=0.99), default=0.0,
                   help="with --ttft-s: share of each prompt read from the KV cache, not computed (default 0)")
    p.add_argument("--prefill-nodes", type=comma_separated(integer(1, 16)), default=[1, 2, 4, 8],
                   metavar="N,N,...", help="with --ttft-s: prefill instance sizes in 8-GPU nodes, at most 16 (each a "
                                           "replay of batches of up to 16,384 tokens a GPU; default 1,2,4,8)")
    p.add_argument("--prefill-redundant", type=comma_separated(integer(0, 4096)), default=[0, 32],
                   metavar="R,R,...", help="with --ttft-s: redundant experts of a prefill instance (default 0,32)")


def _add_advise_costs(p: argparse.ArgumentParser) -> None:
    """`eplb advise`'s load and price flags."""
    p.add_argument("--load", type=number(0, low_open=True, high=1e12), default=None, metavar="TOKENS_PER_S",
                   help="decode output tokens/s to serve: each row then says how many GPUs it needs")
    p.add_argument("--price-per-gpu-hour", type=number(0, high=1e6), default=None, metavar="USD",
                   help="USD a GPU-hour, for the cost of a million output tokens (default: the card's profile "
                        "price, where it has one)")


def _add_advise_engine_files(p: argparse.ArgumentParser) -> None:
    """`eplb advise`'s engine-file flags (as `eplb place`'s, for the recommended layout)."""
    p.add_argument("--sglang-out", default=None, metavar="FILE",
                   help="also write the recommended layout's SGLang --init-expert-location file, fitted on the whole "
                        "trace (layers from an SGLang dump, else --sglang-num-layers and --sglang-first-moe-layer)")
    p.add_argument("--sglang-num-layers", type=POSITIVE_INT, default=None, metavar="N",
                   help="with --sglang-out: the model's decoder layers (61 for DeepSeek-V3)")
    p.add_argument("--sglang-first-moe-layer", type=NON_NEGATIVE_INT, default=None, metavar="K",
                   help="with --sglang-out: the model's first MoE layer (3 for DeepSeek-V3)")
    p.add_argument("--trtllm-out", default=None, metavar="YAML",
                   help="also write the recommended layout's TensorRT-LLM moe_load_balancer.yaml, fitted on the "
                        "whole trace")
    p.add_argument("--trtllm-layers", type=layer_ids_arg, default=None, metavar="IDS",
                   help="with --trtllm-out: the decoder-layer index of each MoE layer of the trace (3-60 for "
                        "DeepSeek-V3; default: a TensorRT-LLM dump's)")
    p.add_argument("--trtllm-mtp-layers", type=layer_ids_arg, default=None, metavar="IDS",
                   help="with --trtllm-out, to serve with MTP: the MTP layers' ids TensorRT-LLM also looks up (61 for "
                        "DeepSeek-V3), each holding the trace's last layer's placement unless the trace recorded it")


def _add_plot_command(sub: argparse._SubParsersAction) -> None:
    """`eplb plot`: its flags."""
    p = sub.add_parser("plot", help="write figures for a trace (and a placement)")
    _add_trace(p)
    p.add_argument("--placement", default=None, help="placement file: adds per-GPU loads before/after")
    p.add_argument("--out-dir", default="out/plots", help="directory for the PNG files (default out/plots)")
    _add_common(p)


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
        if not _is_input_error(exc):
            raise  # a bug, not bad input: its traceback is what a report needs
        print(f"eplb {args.command}: error: {_message(exc, args.command)}", file=sys.stderr)
        return 2
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)


def _message(exc: Exception, command: str) -> str:
    """The one line that tells the user what was wrong with the input behind `exc`."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    message = _one_line(exc)
    # The simulator's errors name its config keys, and a placement file's or a TensorRT-LLM dump's errors their keys,
    # which no flag sets.
    if command != "sim" and not isinstance(exc, (PlacementFormatError, TrtllmDumpError)):
        message = _as_flags(message, command)
    return message


PROJECT_ROOTS = tuple(str(Path(__file__).resolve().parents[2] / package) + os.sep
                      for package in ("eplb", "placement", "traces", "collectives", "sim"))


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


def _is_input_error(exc: Exception) -> bool:
    """Whether `exc` reports bad input: one of the project's typed errors, a pydantic validation of a file or
    config, an OSError, or a ValueError the project's own checks raised. A ValueError raised inside a library the
    project calls is a bug to report with its traceback, not a message for the user."""
    if isinstance(exc, (EplbError, ValidationError, OSError)):
        return True
    if not isinstance(exc, ValueError):
        return False
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is None or frame.tb_frame.f_code.co_filename.startswith(PROJECT_ROOTS)


def _as_flags(message: str, command: str) -> str:
    """`message` with each parameter name (`num_gpus`, `window=3`) replaced by the flag that sets it."""
    table = SYNTH_FLAG_OF_PARAMETER if command in ("synth", "demo") else FLAG_OF_PARAMETER
    # A name with an underscore is a parameter wherever it stands, except inside brackets or quotes (a shape such as
    # `[num_experts]`, a file's key such as `'num_experts'`); a plain word (`window`) only right before `=`, or
    # before `:` opening the message (pydantic's "field: reason").
    pattern = r"(?<![\w-])(%s)(?==)|^(%s)(?=:)|(?<![\w\-\['\"])(%s)(?![\w\]'\"])" % (
        "|".join(re.escape(k) for k in table if "_" not in k),
        "|".join(re.escape(k) for k in table if "_" not in k),
        "|".join(re.escape(k) for k in table if "_" in k),
    )
    return re.sub(pattern, lambda m: table[m.group(1) or m.group(2) or m.group(3)], message)


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        # A validator's own ValueError reads better without pydantic's "Value error, " prefix.
        msg = str(first.get("ctx", {}).get("error", first["msg"])) if first["type"] == "value_error" else first["msg"]
        return f"{where}: {msg}" if where else msg
    return " ".join(str(exc).split())

