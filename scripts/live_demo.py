"""Does a W-process Gloo EP group decode with this project's placement and routing, rebalance, and survive a kill?

It synthesises skewed, drifting routing traffic (`traces.synthetic`), fits a `cpsat` placement on the first
--fit-steps steps, then runs --steps decode steps on W processes: every layer gates its tokens (the gate follows
the synthetic traffic), picks replicas inside the group (--routing), dispatches and combines over Gloo, and checks
its output against the dense single-process layer. It prints, last, one JSON object under --json with: steps,
world_size, routing, max_abs_err_vs_dense, imbalance_measured (max / mean of the rows each rank computed, mean over
steps and layers), imbalance_planned (the same from the quotas), tokens_lost, seconds_per_step_mean, placement.

With --rebalance-every R and/or --fail-rank K [--fail-at-step N] it runs the loop with a `Rebalancer`: the traffic
shifts at --shift-at-step (a new mix of experts; default half of R), a rebalance starts every R steps (or when the
imbalance drifts), moves the weights in chunks between steps and switches every rank at once; rank K's process is
killed outright (SIGKILL) in the middle of step N (or, with --fail-at-start, as the rebalancers start) and the
survivors recover and finish the run. The JSON object then also holds imbalance_before, imbalance_after,
rebalances (and rebalances_kept: fits not worth moving to), bytes_moved, requests_requeued, failed_rank and
lost_ranks (the ranks that died, the demo's or any killed from outside, in order),
decode_steps_waiting_on_rebalance, step_time_p99_ratio and what they rest on (see
`eplb.harness.rebalancing_summary.summarize_rebalancing`). A run that cannot go on (a rank that dies without a
rebalancer, or one lost whose experts lived nowhere else, before host copies of them existed) exits 1, its JSON
object then `stopped` (the reason), `stopped_rank`, `failed_rank` and `lost_ranks` (the ranks that died),
`world_size` and `ranks_finished`.

A bad flag value exits 2 with one line on stderr, before any process starts. The ranks and the solver's helper end
with this process however it ends; SIGTERM or SIGINT stops them and exits 128 + the signal's number.

Usage: python scripts/live_demo.py [--world-size 4] [--steps 20] [--routing dynamic] [--layers 2] [--json]
       [--rebalance-every R] [--fail-rank K [--fail-at-step N | --fail-at-start]] [--rebalance-policy P]
       [--rebalance-good-enough X] [--rebalance-min-gain G] [--solve-cpu-share F] [--max-bytes-per-step B]
       [--patch-every STEPS] [--shift-at-step N] [--step-times FILE]
"""

import argparse
import json
import os
import sys


from collectives import backend_for, exit_on_signals, run_local_group, start_local_group_server
from collectives.errors import BackendUnavailableError, RankDiedError
from collectives.local_group import root_cause_order
from eplb.cli.arg_types import SEED_MAX, integer, json_output, number
from eplb.cli.flags import OneLineParser
from eplb.live import ROUTING_MODES, MoELayerConfig
from eplb.rebalance.config import RebalanceConfig
from eplb.harness.rebalancing_loop import Faults, LoopReport, run_rebalancing_loop, shifting_traffic_setup
from eplb.harness.rebalancing_summary import group_step_times, summarize_rebalancing
from eplb.harness.synthetic_decode import DecodeSetup, run_decode_loop, summarize
from placement import ClusterSpec, fit_placement
from placement.cluster import MAX_GPUS, MAX_SLOTS_PER_GPU
from placement.patch_planner import PatchSettings
from traces import EplbError
from traces.atomic_file import write_text_atomically
from traces.synthetic import SyntheticConfig, generate_trace

WEIGHT_BYTES = 4  # the experts' weights are float32


# Bounds on the demo's size: far beyond what a CPU demo runs, yet each one's memory and time stay finite.
MAX_STEPS = 100_000
MAX_LAYERS = 256
MAX_EXPERTS = 4096
MAX_TOKENS_PER_STEP = 1 << 20
MAX_HIDDEN_SIZE = 1 << 16
MAX_SECONDS = 86_400.0  # one day: any budget or timeout beyond it is a typo
MAX_BYTES_PER_STEP = 1 << 40
MAX_DEMO_BYTES = 16 << 30  # the ranks' weights and activations together (each rank builds the dense reference)


RANKS_PER_CORE = 8  # rank processes a core can start and keep stepping without a rank timing out
RANK_BYTES = 512 << 20  # one rank process with torch loaded


def machine_ranks() -> int:
    """The most ranks this machine runs as processes at once: RANKS_PER_CORE a core, RANK_BYTES of memory each."""
    cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = RANK_BYTES * RANKS_PER_CORE * cores
    return max(1, min(RANKS_PER_CORE * cores, memory // RANK_BYTES))


def build_parser() -> argparse.ArgumentParser:
    """The demo's flags, each value checked on its own (`check_args` checks them together)."""
    seconds = number(0, low_open=True, high=MAX_SECONDS)
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=integer(1, MAX_GPUS), default=4,
                        help="W: ranks (one per GPU) in the EP group")
    parser.add_argument("--steps", type=integer(1, MAX_STEPS), default=20, help="decode steps to run (default 20)")
    parser.add_argument("--routing", default="dynamic", choices=ROUTING_MODES, help="replica choice (default dynamic)")
    parser.add_argument("--layers", type=integer(1, MAX_LAYERS), default=2, help="MoE layers (default 2)")
    parser.add_argument("--experts", type=integer(1, MAX_EXPERTS), default=32,
                        help="E: routed experts per layer (default 32)")
    parser.add_argument("--top-k", type=integer(1, MAX_EXPERTS), default=4,
                        help="K: experts per token (<= E; default 4)")
    parser.add_argument("--slots-per-gpu", type=integer(1, MAX_SLOTS_PER_GPU), default=None,
                        help="S (W x S >= E; default E / W + 2)")
    parser.add_argument("--tokens-per-step", type=integer(1, MAX_TOKENS_PER_STEP), default=256,
                        help="tokens of the whole group per step")
    parser.add_argument("--hidden-size", type=integer(1, MAX_HIDDEN_SIZE), default=64,
                        help="D (>= experts; default 64)")
    parser.add_argument("--fit-steps", type=integer(1, MAX_STEPS), default=30,
                        help="steps the placement is fitted on (default 30)")
    parser.add_argument("--time-limit", type=seconds, default=2.0, help="cpsat budget, seconds (default 2)")
    parser.add_argument("--seed", type=integer(0, SEED_MAX), default=0, help="seed of traffic and weights (default 0)")
    parser.add_argument("--timeout", type=seconds, default=10.0,
                        help="each collective's timeout, seconds (default 10)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cpu: a Gloo group; cuda: an NCCL group, one GPU per rank (default cpu)")
    parser.add_argument("--rebalance-every", type=integer(1, MAX_STEPS), default=None, metavar="R",
                        help="rebalance the running group every R steps (and on drift)")
    parser.add_argument("--rebalance-policy", default="cpsat", choices=("cpsat", "deepseek"),
                        help="policy of the rebalances (default cpsat)")
    parser.add_argument("--rebalance-time-limit", type=seconds, default=0.5,
                        help="cpsat budget of each rebalance, seconds (default 0.5)")
    parser.add_argument("--rebalance-good-enough", type=number(1, high=2, or_exactly=0), default=1.001, metavar="X",
                        help="cpsat stops a layer's search once a candidate fits the window to max/mean X (default "
                             "1.001; 0: search for the whole budget)")
    parser.add_argument("--rebalance-min-gain", type=number(0, high=1), default=0.005, metavar="G",
                        help="switch only to a fit that beats the placement serving by G on the window (relative; "
                             "default 0.005; 0: always)")
    parser.add_argument("--solve-in", default="process", choices=("process", "thread"),
                        help="where rank 0 solves: a helper process (default) or a thread")
    parser.add_argument("--solve-cpu-share", type=number(0, low_open=True, high=1), default=1.0, metavar="F",
                        help="share of the time the solver's helper process may run, in (0, 1] (default 1: not "
                             "paced)")
    parser.add_argument("--max-bytes-per-step", type=integer(1, MAX_BYTES_PER_STEP), default=512 << 10,
                        help="expert bytes a rank sends or receives between two steps (default 512 KiB)")
    parser.add_argument("--patch-every", type=integer(0, MAX_STEPS), default=PatchSettings().every, metavar="STEPS",
                        help="with a rebalancer: a burst patch every STEPS steps between refits (a few slots moved "
                             "to the experts the last steps overload; default %(default)s; 0: none)")
    parser.add_argument("--shift-at-step", type=integer(0, MAX_STEPS), default=None, metavar="N",
                        help="with a rebalancer: the step at which the traffic's expert mix changes (default: half "
                             "of --rebalance-every, at most a third of --steps, so that the first attempt's window "
                             "sees it; without --rebalance-every a third of --steps)")
    parser.add_argument("--fail-rank", type=integer(0, MAX_GPUS - 1), default=None, metavar="K",
                        help="kill rank K's process (SIGKILL)")
    parser.add_argument("--fail-at-step", type=integer(0, MAX_STEPS), default=None, metavar="N",
                        help="the step rank K dies in (default: half way)")
    parser.add_argument("--fail-at-start", action="store_true",
                        help="rank K dies as the rebalancers start instead (its peers building their host copies)")
    parser.add_argument("--step-times", type=json_output(), default=None, metavar="FILE",
                        help="with a rebalancer: also write each step's time (slowest rank), whether a rebalance was "
                             "in progress, its phase and group size, as JSON to FILE (written whole or not at all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last, nothing else")
    return parser


def slots_per_gpu(args: argparse.Namespace) -> int:
    """S: --slots-per-gpu, or by default E / W + 2."""
    return args.slots_per_gpu or args.experts // args.world_size + 2


def demo_bytes(args: argparse.Namespace) -> int:
    """Bytes the ranks hold together, roughly: each rank's copy of every layer's experts (three fp32 matrices of
    D x 2D) and a step's activations (a few fp32 [tokens, 2D] buffers)."""
    experts = args.layers * args.experts * 3 * args.hidden_size * 2 * args.hidden_size * 4
    activations = 8 * args.tokens_per_step * 2 * args.hidden_size * 4
    return args.world_size * (experts + activations)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check the flags against each other; a mistake exits 2 with one line (`parser.error`), before anything runs."""
    if args.top_k > args.experts:
        parser.error(f"--top-k must be <= --experts (a token picks K different experts); got {args.top_k} > "
                     f"{args.experts}")
    if args.hidden_size < args.experts:
        parser.error("--hidden-size must be >= --experts (the gate reads the first E dimensions)")
    if demo_bytes(args) > MAX_DEMO_BYTES:
        parser.error(f"the demo would need {demo_bytes(args) / 2**30:.0f} GiB of weights and activations over its "
                     f"ranks (at most {MAX_DEMO_BYTES >> 30}); lower --layers, --experts, --hidden-size, "
                     f"--tokens-per-step or --world-size")
    most = machine_ranks()
    if args.world_size > most:
        parser.error(f"--world-size {args.world_size} is more ranks than this machine runs at once (at most {most}: "
                     f"{RANKS_PER_CORE} a core over {os.cpu_count() or 1} cores, {RANK_BYTES >> 20} MiB of memory "
                     f"a rank); lower --world-size, or run on a machine with more cores")
    slots = slots_per_gpu(args)
    if args.world_size * slots < args.experts:
        parser.error(f"--world-size x --slots-per-gpu must be >= --experts (every expert needs a slot); got "
                     f"{args.world_size} x {slots} < {args.experts}")
    if slots > MAX_SLOTS_PER_GPU:
        parser.error(f"--slots-per-gpu (default E / W + 2 = {slots}) must be <= {MAX_SLOTS_PER_GPU}; give it "
                     f"or raise --world-size")
    try:
        backend_for(args.device)
    except BackendUnavailableError as exc:
        parser.error(str(exc))
    rebalancing = args.rebalance_every is not None or args.fail_rank is not None
    row_bytes = 2 * args.hidden_size * WEIGHT_BYTES  # one row of an expert's widest matrix (F = 2 D)
    if rebalancing and args.max_bytes_per_step < row_bytes:
        parser.error(f"--max-bytes-per-step must be >= one row of an expert's weights ({2 * WEIGHT_BYTES} x "
                     f"--hidden-size = {row_bytes} bytes); got {args.max_bytes_per_step}")
    if args.solve_cpu_share < 1 and args.solve_in != "process":
        parser.error("--solve-cpu-share below 1 needs --solve-in process (a thread cannot be paused)")
    if args.fail_rank is not None and not 0 <= args.fail_rank < args.world_size:
        parser.error(f"--fail-rank must be a rank in [0, {args.world_size}); got {args.fail_rank}")
    if args.fail_rank is not None and args.world_size < 2:
        parser.error("--fail-rank needs --world-size >= 2 (someone must survive)")
    if args.fail_at_step is not None and args.fail_rank is None:
        parser.error("--fail-at-step needs --fail-rank")
    if args.fail_at_start and (args.fail_rank is None or args.fail_at_step is not None):
        parser.error("--fail-at-start needs --fail-rank and replaces --fail-at-step; drop one")
    if args.shift_at_step is not None and args.rebalance_every is None and args.fail_rank is None:
        parser.error("--shift-at-step needs --rebalance-every or --fail-rank (the shifting traffic is the "
                     "rebalancing loop's)")
    if args.shift_at_step is not None and args.shift_at_step >= args.steps:
        parser.error(f"--shift-at-step must be in [0, --steps={args.steps}); got {args.shift_at_step}")
    if args.fail_at_step is not None and not 0 <= args.fail_at_step < args.steps:
        parser.error(f"--fail-at-step must be in [0, --steps={args.steps}); got {args.fail_at_step}")
    if args.step_times is not None and args.rebalance_every is None and args.fail_rank is None:
        parser.error("--step-times needs --rebalance-every or --fail-rank (the times are the rebalancing loop's)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    # A rank that dies makes the others' c10d log warnings on stderr (store sockets timing out), one per socket; what
    # happened is the one JSON object's and the one line's to say. The ranks inherit this from their fork server, which
    # reads it as it imports torch (set TORCH_CPP_LOG_LEVEL=INFO to see them).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    start_local_group_server()  # the ranks' fork server imports torch while this process fits the placement
    if args.rebalance_every is not None or args.fail_rank is not None:
        return rebalancing_demo(args)
    slots = slots_per_gpu(args)
    trace = generate_trace(SyntheticConfig(num_steps=args.fit_steps + args.steps, num_layers=args.layers,
                                           num_experts=args.experts, top_k=args.top_k,
                                           tokens_per_step=args.tokens_per_step, seed=args.seed))
    counts = trace.counts_TLE
    cluster = ClusterSpec(num_gpus=args.world_size, slots_per_gpu=slots, gpus_per_node=args.world_size)
    placement = fit_placement("cpsat", counts[: args.fit_steps], cluster, time_limit_s=args.time_limit,
                              routing="static" if args.routing == "static" else "dynamic", seed=args.seed)
    config = MoELayerConfig(hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
                            num_experts=args.experts, top_k=args.top_k)
    share = counts[args.fit_steps :] / (args.tokens_per_step * args.top_k)
    setup = DecodeSetup(config, placement, share, args.tokens_per_step, args.routing, args.seed)
    reports = run_local_group(run_decode_loop, args.world_size, setup, args.steps, timeout_s=args.timeout,
                              deadline_s=60 + 10 * args.steps, device=args.device, allow_failures=True)
    if any(isinstance(r, BaseException) for r in reports):  # a rank died or failed: without a rebalancer, no recovery
        return report_stopped(args, reports, excused=())
    result = {**summarize(reports, args.routing), "device": args.device,
              "placement": {"policy": "cpsat", "gpus": args.world_size, "slots_per_gpu": slots}}
    if not args.json:
        print(f"{args.world_size} ranks x {slots} slots, {args.layers} layers x {args.experts} experts, "
              f"top-{args.top_k}, {args.tokens_per_step} tokens per step, routing {args.routing}:")
        for key in ("imbalance_measured", "imbalance_planned", "max_abs_err_vs_dense", "tokens_lost",
                    "seconds_per_step_mean"):
            print(f"  {key}: {result[key]:.6g}")
    print(json.dumps(result, sort_keys=True))
    return 0


def shift_step(args: argparse.Namespace) -> int:
    """The step the traffic shifts at: --shift-at-step, or half of --rebalance-every (the first attempt's window
    then holds both mixes, and its fit is worth moving to), or a third of --steps."""
    if args.shift_at_step is not None:
        return args.shift_at_step
    return min(args.rebalance_every // 2, args.steps // 3) if args.rebalance_every else args.steps // 3


def rebalancing_demo(args) -> int:
    """The loop with a rebalancer, shifting traffic and an optional killed rank; prints the JSON object last."""
    slots = slots_per_gpu(args)
    setup = shifting_traffic_setup(args.world_size, args.steps, experts=args.experts, top_k=args.top_k,
                                   tokens=args.tokens_per_step, hidden=args.hidden_size, layers=args.layers,
                                   fit_steps=args.fit_steps, slots=slots, routing=args.routing,
                                   time_limit_s=args.time_limit, seed=args.seed, shift_step=shift_step(args))
    interval = args.rebalance_every or 10 * args.steps  # without --rebalance-every only drift and recovery refit
    rebalance = RebalanceConfig(window=max(4, min(interval, 50)), interval=interval, policy=args.rebalance_policy,
                                time_limit_s=args.rebalance_time_limit, solve_in=args.solve_in,
                                good_enough=args.rebalance_good_enough or None,
                                min_gain=args.rebalance_min_gain,
                                solve_cpu_share=args.solve_cpu_share,
                                routing="static" if args.routing == "static" else "dynamic",
                                max_bytes_per_step=args.max_bytes_per_step,
                                patches=PatchSettings(every=args.patch_every) if args.patch_every else None,
                                transfer_timeout_s=min(5.0, args.timeout / 2))
    fail_at = args.fail_at_step if args.fail_at_step is not None else args.steps // 2
    faults = Faults(kills=((args.fail_rank, fail_at),) if args.fail_rank is not None and not args.fail_at_start
                    else (), kill_at_start=args.fail_rank if args.fail_at_start else None)
    reports = run_local_group(run_rebalancing_loop, args.world_size, setup, args.steps, rebalance, faults,
                              timeout_s=args.timeout, deadline_s=120 + 10 * args.steps, allow_failures=True,
                              device=args.device)
    # A rank the survivors recovered from (the demo's --fail-rank, or one killed from outside) is no error: the
    # survivors served on without it. In the order the group lost them.
    lost = list(dict.fromkeys(rank for r in reports if isinstance(r, LoopReport) for rec in r.recoveries
                              for rank in rec["lost_ranks"]))
    excused = {args.fail_rank, *lost} - {None}
    if any(isinstance(r, BaseException) and rank not in excused for rank, r in enumerate(reports)) or \
            not any(isinstance(r, LoopReport) for r in reports):
        return report_stopped(args, reports, excused)
    # The rank that died first, planned or killed from outside (all of them, in order: lost_ranks).
    failed_rank = lost[0] if lost else args.fail_rank
    result = {**summarize_rebalancing(reports, setup, failed_rank), "device": args.device, "lost_ranks": lost,
              "placement": {"policy": "cpsat", "gpus": args.world_size, "slots_per_gpu": slots},
              "rebalance": rebalance.model_dump(), "traffic_shift_step": shift_step(args)}
    if not args.json:
        print(f"{args.world_size} ranks x {slots} slots, {args.layers} layers x {args.experts} experts, "
              f"top-{args.top_k}, {args.tokens_per_step} tokens per step, routing {args.routing}, rebalance every "
              f"{args.rebalance_every}, rank {args.fail_rank} killed at step "
              f"{fail_at if args.fail_rank is not None else '-'}:")
        for key in ("imbalance_before", "imbalance_after", "rebalances", "bytes_moved", "max_abs_err_vs_dense",
                    "tokens_lost", "requests_requeued", "decode_steps_waiting_on_rebalance", "step_time_p99_ratio",
                    "seconds_from_kill_to_first_step"):
            print(f"  {key}: {result[key]}")
    print(json.dumps(result, sort_keys=True))
    if args.step_times is not None:
        try:
            write_text_atomically(args.step_times, json.dumps({"steps": group_step_times(reports)}) + "\n")
        except EplbError as exc:  # a disk that filled or turned read-only during the run: the result is printed
            print(f"live_demo: {exc}", file=sys.stderr)
            return 2
    return 1 if result["tokens_lost"] else 0


def report_stopped(args, reports: list, excused) -> int:
    """A run that cannot go on: one line on stderr and, under --json, the one JSON object (`stopped`, the reason;
    `stopped_rank`, whose error it is: a rank's own error first, then a rank that died, then a collective that failed
    because of it; `failed_rank` and `lost_ranks`, the ranks that died, planned or not; `world_size`,
    `ranks_finished`). Exit 1."""
    failures = [(rank, r) for rank, r in enumerate(reports) if isinstance(r, BaseException) and rank not in excused]
    rank, error = min(failures, key=lambda f: (root_cause_order(f[1]), f[0])) if failures else (None,
                                                                                               "no rank finished")
    died = [rank for rank, r in enumerate(reports) if isinstance(r, RankDiedError)]
    failed_rank = died[0] if died else args.fail_rank
    reason = " ".join(str(error).split())[:300]
    print(f"live_demo: rank {rank} failed: {reason}", file=sys.stderr)
    if args.json:  # the run stopped: the one JSON object says why, and that nothing it reports was measured
        print(json.dumps({"stopped": reason, "stopped_rank": rank, "world_size": args.world_size,
                          "failed_rank": failed_rank, "lost_ranks": died,
                          "ranks_finished": sum(not isinstance(r, BaseException) for r in reports)}, sort_keys=True))
    return 1


if __name__ == "__main__":
    exit_on_signals()  # SIGTERM, SIGINT: unwind, so that the ranks are stopped, and exit 128 + the signal's number
    sys.exit(main())
