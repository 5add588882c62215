"""The flags several `eplb` subcommands share, and the parser every command line here uses.

`OneLineParser` reports a usage mistake as one line and exit 2 (the scripts use it too); the `add_*` helpers add a
group of flags a subcommand shares with others (the trace it reads, the cluster it places on, the cpsat budget, the
traffic cases a figure is run over). Their value types are in `eplb.cli.arg_types`.
"""

import argparse

from eplb.cli.arg_types import (GPUS, NON_NEGATIVE_FLOAT, POSITIVE_INT, SEED, SLOTS_PER_GPU, TIME_LIMIT, WORK_LIMIT,
                                bounded)
from eplb.cli.commands import CPSAT_SEED, CPSAT_WORKERS
from placement import POLICIES, ROUTINGS
from placement.cluster import MAX_GPUS, MAX_SLOTS_PER_GPU


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line on stderr and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors; no progress bar")


def add_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="routing trace file (.npz, .npy, SGLang .pt, top-k id log) or "
                                                         "TensorRT-LLM expert-statistic directory")
    add_topk_log(parser, "concatenated")
    parser.add_argument("--steps", default=None, metavar="START:STOP", help="use only these steps of the trace")


def add_topk_log(parser: argparse.ArgumentParser, tasks: str) -> None:
    """The flags a top-k id log is read with; `tasks` says how several tasks are put in one stream."""
    parser.add_argument("--tokens-per-step", type=POSITIVE_INT, default=None,
                        help="top-k id logs only: tokens per step (e.g. 256 for the ESFT logs)")
    parser.add_argument("--task", default=None,
                        help=f"top-k id logs only: comma-separated tasks to read (default: all, {tasks})")
    parser.add_argument("--num-experts", type=POSITIVE_INT, default=None,
                        help="top-k id logs only: E, experts per layer (default: the largest id in any task + 1)")


def add_cluster(parser: argparse.ArgumentParser) -> None:
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
    add_budget(parser, given_only=True)
    parser.add_argument("--workers", type=POSITIVE_INT, default=None,
                        help=f"cpsat: layers solved at once (default {CPSAT_WORKERS}; the placement does not depend on "
                             f"it)")
    parser.add_argument("--seed", type=SEED, default=None,
                        help=f"cpsat: solver and sampling seed (default {CPSAT_SEED})")
    parser.add_argument("--migration-cost", type=NON_NEGATIVE_FLOAT, default=0.0,
                        help="cpsat with --current: penalty per expert copy, in units of imbalance (default 0: off)")


def add_budget(parser: argparse.ArgumentParser, default_work: float = 20.0, given_only: bool = False) -> None:
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


def add_routing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--routing", default="static", choices=ROUTINGS,
                        help="static: fixed replica weights; dynamic: each step re-split optimally; live: each step "
                             "split by the live router decode workers run (default static)")


def add_metric_groups(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metric-groups", type=POSITIVE_INT, default=None, metavar="N",
                        help="also report the per-routing-group metric (group/step): the experts cut into N contiguous "
                             "groups, as the model's router groups them (DeepSeek-V3: 8); replay takes --groups when "
                             "this is not given")


def add_scenarios(parser: argparse.ArgumentParser, what: str, scope: str = "") -> None:
    """--scenarios, --bursts and --seeds: the traffic cases a figure is run over (`sim.scenarios`)."""
    parser.add_argument("--scenarios", default="single-dataset,production-mix", metavar="NAMES",
                        help=f"{scope}{what} these traffic scenarios (comma-separated: single-dataset, the fitted "
                             "skew; production-mix, the skew of ESFT's tasks pooled; production-mix-olmoe, OLMoE's "
                             "domains pooled) and print the range beside the central figure (default %(default)s; "
                             "none: the central figure alone)")
    parser.add_argument("--bursts", default="on,off", metavar="ON,OFF",
                        help=f"{scope}the scenarios with bursts on, off or both (default %(default)s)")
    parser.add_argument("--seeds", type=bounded(int, 1, high=20), default=3,
                        help=f"{scope}seeds of each scenario (default %(default)s)")
