"""What does the live decode layer cost a step, and rebalancing and a killed rank, on a W-process Gloo group?

1. Per-step cost of the layer with load recording and dynamic routing, against the same layer with static routing
   and no recorder (the cheapest way to run it), measured in the same processes, variants interleaved, several
   repeats after a warm-up: the median wall seconds per decode step (all layers) of the slowest rank, and the
   median CPU seconds per step of a rank's process (mean over ranks), the work itself: with more ranks than
   cores, wall time mostly measures how the ranks share the cores. The replica choice runs compiled, as a decode
   worker runs it (`--eager` to compare).
2. Imbalance measured in the loop (max / mean of the rows each rank computed) for each routing mode, on the same
   traffic and placement.
3. Rebalancing while decoding (`--section rebalance`): a W-rank loop whose traffic shifts a third of the way in,
   rebalanced every `--rebalance-every` steps by `cpsat` in the background (its helper process capped at
   `--solve-cpu-share` of the time): decode step time (slowest rank) while a rebalance is in progress against steps
   without one (p50, p99; a few hundred steps on each side, as a p99 needs), the same by what the rebalancer did
   before the step (start, solving, answer broadcast, a round of weights, switch), experts moved per rebalance against a
   placement-oblivious (slot-by-slot) remap of the same target, the lag from the end of the fit window to the
   switch (steps and seconds: what `eplb replay --lag` should be given), and, in a second run, the time from a
   rank's SIGKILL to the first step the survivors complete, against the collective timeout.
4. The live demo's documented command (docs/benchmarks.md, "The demo, many runs, against a placebo") run `--runs`
   times, each as a user runs it (`--section demo-runs`): each run's step_time_p99_ratio (120 steps: its p99s rest
   on a step or two each), how many runs come under 1.10, the ratio over the steps of every run pooled (with an
   interval that resamples whole runs), the tail by phase, and a placebo: the same loop with a rebalancer that
   never rebalances, its steps labelled as each run's were.
5. The machine's own slow steps (`--section noise`), against which the rebalance section's p99 figures read: the
   share of steps over 1.5x the median and p99 / median, for the same W-rank decode loop with no rebalancer (no
   helper, no heartbeat), and for a fixed piece of single-threaded compute timed in 1 and in W processes at once.
6. Planning a rebalance's weight moves at the full shape (`--section plan`: 58 layers x 256 experts on 64 GPUs x 5
   slots, DeepSeek-V3 experts, D = 7168, F = 2048, fp8, 64 MB per rank per step; a greedy placement replaced by a
   greedy fit on other traffic): the plan's time (what every rank used to spend at one decode step, now the
   helper's, beside the solve), its encoding, and what a rank spends at that step now (decoding its own part)
   against decoding the whole plan, in the same process.
7. The documented demo commands with a killed rank (docs/benchmarks.md, "The demo's commands with a killed rank";
   the first is docs/live-layer.md's, "Live demo"), `--runs` times each (`--section demo-switches`): how many runs
   switched before the step the rank is killed in to a placement that served better than the start placement on
   the same steps; `--busy N` runs N CPU-bound processes beside each run (other work on the host).
8. Host copies at the full shape (`--section host-copies`: 61 layers x 256 experts on 64 GPUs x 5 slots and 128 x 3,
   greedy and cpsat placements of synthetic traffic): for each number of ranks that may die at once
   (`failures_tolerated` 1-3), the host copies a rank keeps (mean and most over ranks, all layers) and their bytes
   with DeepSeek-V3's experts (D = 7168, F = 2048, three matrices: 44 MB in fp8, 88 MB in bf16), beside the
   bytes of the rank's own slots; and the time to work out every layer's copies.
The router's time per layer at the full shape (256 experts, 64x5 and 128x3) is `scripts/bench_router.py`.

Usage: python scripts/bench_live.py [--world-size 4] [--steps 30] [--repeats 5]
       [--section all|overhead|rebalance|demo-runs|demo-switches|noise|plan|host-copies]
       [--rebalance-steps 600] [--solve-in process|thread] [--solve-cpu-share F] [--good-enough X]
       [--max-bytes-per-step B] [--min-gain G] [--runs 10] [--busy N] [--quick]
"""

import argparse
import contextlib
import dataclasses
import json
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from collectives import run_local_group
from collectives.lifeline import end_with_parent, parent_of_child
from eplb.cli.arg_types import integer, number
from eplb.cli.bench_harness import bench_parser
from eplb.harness.rebalancing_loop import (
    Faults,
    run_rebalancing_loop,
    shifting_traffic_setup,
)
from eplb.harness.rebalancing_summary import (
    PHASES,
    pooled_p99_ratio,
    summarize_rebalancing,
)
from eplb.harness.synthetic_decode import DecodeSetup, run_decode_loop, summarize
from eplb.live import MoELayerConfig
from eplb.rebalance import RebalanceConfig
from eplb.rebalance.move_plan import (
    TransferShape,
    backup_wanted,
    decode_fills,
    decode_for_rank,
    decode_rounds,
    encode_fills,
    encode_rounds,
    plan_rebalance,
)
from placement import ClusterSpec, fit_placement, plan_migration
from placement.cluster import MAX_SLOTS_PER_GPU
from traces.synthetic import SyntheticConfig, generate_trace

# Bounds on the flags, as the live demo's (scripts/live_demo.py): far beyond a CPU run, each run's size stays finite.
MAX_RANKS = 64  # rank processes on one host
MAX_STEPS = 100_000
MAX_LAYERS = 256
MAX_EXPERTS = 4096
MAX_TOKENS_PER_STEP = 1 << 20
MAX_HIDDEN_SIZE = 1 << 16
MAX_SECONDS = 86_400.0  # one day: a timeout beyond it is a typo
MAX_BYTES_PER_STEP = 1 << 34  # 16 GiB a rank between two steps: more than any rank here holds

VARIANTS = {  # name -> (routing, record); the first is the baseline
    "static, no recorder": ("static", False),
    "static + recorder": ("static", True),
    "dynamic, no recorder": ("dynamic", False),
    "dynamic + recorder": ("dynamic", True),
    "oblivious, no recorder": ("oblivious", False),
}


def run_variants(comm, setups: dict, steps: int, repeats: int) -> dict:
    """Each variant's reports, `repeats` times, variants interleaved so machine noise hits them alike, after a
    warm-up run of each (the routing compiles on its first steps)."""
    for setup in setups.values():
        run_decode_loop(comm, setup, 3)
    runs = {name: [] for name in setups}
    for _ in range(repeats):
        for name, setup in setups.items():
            runs[name].append(run_decode_loop(comm, setup, steps))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, whole_doc=True, json_help=None)
    parser.add_argument("--world-size", type=integer(1, MAX_RANKS), default=4)
    parser.add_argument("--steps", type=integer(1, MAX_STEPS), default=30, help="decode steps per run (default 30)")
    parser.add_argument("--repeats", type=integer(1, 1000), default=5, help="runs of each variant (default 5)")
    parser.add_argument("--layers", type=integer(1, MAX_LAYERS), default=2)
    parser.add_argument("--experts", type=integer(1, MAX_EXPERTS), default=32)
    parser.add_argument("--top-k", type=integer(1, MAX_EXPERTS), default=4)
    parser.add_argument("--tokens-per-step", type=integer(1, MAX_TOKENS_PER_STEP), default=256)
    parser.add_argument("--hidden-size", type=integer(1, MAX_HIDDEN_SIZE), default=64)
    parser.add_argument("--slots-per-gpu", type=integer(1, MAX_SLOTS_PER_GPU), default=None,
                        help="S (default E / W + 2)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cpu: a Gloo group; cuda: an NCCL group, one GPU per rank (default cpu)")
    parser.add_argument("--eager", action="store_true", help="run the replica choice eagerly (default: compiled)")
    parser.add_argument("--section", default="all",
                        choices=("all", "overhead", "rebalance", "demo-runs", "demo-switches", "noise", "plan",
                                 "host-copies"))
    parser.add_argument("--rebalance-steps", type=integer(1, MAX_STEPS), default=600,
                        help="steps of the rebalancing run (default 600: a p99 needs a few hundred steps on each side)")
    parser.add_argument("--rebalance-every", type=integer(1, MAX_STEPS), default=30)
    parser.add_argument("--rebalance-policy", default="cpsat", choices=("cpsat", "deepseek"))
    parser.add_argument("--solve-in", default="process", choices=("process", "thread"))
    parser.add_argument("--good-enough", type=number(1, high=2, or_exactly=0), default=1.001,
                        help="cpsat stops a layer's search at this fitted max/mean (default 1.001; 0: the whole "
                             "budget)")
    parser.add_argument("--solve-cpu-share", type=number(0, low_open=True, high=1), default=1.0,
                        help="the solve's share of the time (default 1: not paced)")
    parser.add_argument("--min-gain", type=number(0, high=1), default=0.005,
                        help="switch only to a fit that beats the placement serving by this much (default 0.005; "
                             "0: always)")
    parser.add_argument("--max-bytes-per-step", type=integer(1, MAX_BYTES_PER_STEP), default=256 << 10,
                        help="expert bytes a rank sends or receives between two steps (default 256 KiB)")
    parser.add_argument("--timeout", type=number(0, low_open=True, high=MAX_SECONDS), default=5.0,
                        help="collective timeout of the kill run, seconds")
    parser.add_argument("--runs", type=integer(1, 1000), default=10,
                        help="runs of the issue's demo command (default 10)")
    parser.add_argument("--busy", type=integer(0, 64), default=0, metavar="N",
                        help="with demo-switches: N CPU-bound processes run beside every demo run, as other work "
                             "on the host (default 0)")
    parser.add_argument("--quick", action="store_true", help="tiny run, for a smoke test")
    args = parser.parse_args(argv)
    if args.top_k > args.experts or args.hidden_size < args.experts:
        parser.error("--top-k must be <= --experts (a token picks K different experts) and --hidden-size >= --experts "
                     "(the gate reads the first E dimensions)")
    if args.world_size * (args.slots_per_gpu or args.experts // args.world_size + 2) < args.experts:
        parser.error("--world-size x --slots-per-gpu must be >= --experts (every expert needs a slot)")
    if args.experts // args.world_size + 2 > MAX_SLOTS_PER_GPU and args.slots_per_gpu is None:
        parser.error(f"--slots-per-gpu (default E / W + 2) must be <= {MAX_SLOTS_PER_GPU}; give it or raise "
                     f"--world-size")
    if args.solve_cpu_share < 1 and args.solve_in != "process":
        parser.error("--solve-cpu-share below 1 needs --solve-in process (a thread cannot be paused)")
    row_bytes = 2 * args.hidden_size * 4  # one row of an expert's widest matrix (F = 2 D), fp32
    if args.section in ("all", "rebalance") and args.max_bytes_per_step < row_bytes:
        parser.error(f"--max-bytes-per-step must be >= one row of an expert's weights (8 x --hidden-size = {row_bytes} "
                     f"bytes); got {args.max_bytes_per_step}")
    if args.quick:
        args.steps, args.repeats, args.rebalance_steps, args.rebalance_every = 3, 1, 24, 6
        args.runs = min(args.runs, 2)
    if args.section in ("all", "overhead"):
        overhead_section(args)
    if args.section in ("all", "rebalance"):
        rebalance_section(args)
    if args.section in ("all", "demo-runs"):
        demo_runs_section(args.runs, QUICK_DEMO if args.quick else ISSUE_DEMO)
    if args.section in ("all", "demo-switches"):
        demo_switches_section(args.runs, QUICK_KILL_DEMOS if args.quick else KILL_DEMOS, args.busy)
    if args.section in ("all", "noise"):
        noise_section(args)
    if args.section in ("all", "plan"):
        plan_section(args)
    if args.section in ("all", "host-copies"):
        host_copies_section(args)
    return 0


def rebalance_section(args) -> None:
    """Step time while rebalancing, moves against an oblivious remap, lag, and recovery from a kill."""
    steps = args.rebalance_steps
    setup = shifting_traffic_setup(args.world_size, steps, experts=args.experts, top_k=args.top_k,
                                   tokens=args.tokens_per_step, hidden=args.hidden_size, layers=args.layers,
                                   slots=args.slots_per_gpu)
    share = args.solve_cpu_share
    config = RebalanceConfig(window=min(args.rebalance_every, 50), interval=args.rebalance_every,
                             policy=args.rebalance_policy, solve_in=args.solve_in, solve_cpu_share=share,
                             good_enough=args.good_enough or None,
                             min_gain=args.min_gain,
                             time_limit_s=0.5, max_bytes_per_step=args.max_bytes_per_step,
                             transfer_timeout_s=args.timeout / 2)
    reports = run_local_group(run_rebalancing_loop, args.world_size, setup, steps, config, Faults(),
                              timeout_s=args.timeout, deadline_s=120 + 5 * steps, device=args.device)
    summary = summarize_rebalancing(reports, setup)
    stats = reports[0].stats
    expert_bytes = 3 * setup.config.hidden_size * setup.config.intermediate_size * 4  # fp32
    times = summary["step_time_ms"]
    backend = "NCCL" if args.device == "cuda" else "Gloo"
    print(f"\nRebalancing while decoding: {args.world_size} {backend} ranks, {steps} steps, traffic shift at step "
          f"{steps // 3}, {args.rebalance_policy} (0.5 s budget) in a background {args.solve_in} (CPU share "
          f"{share:g}; a layer's search stops at {args.good_enough or 'no'} fitted max/mean) every "
          f"{args.rebalance_every} steps, "
          f"{config.max_bytes_per_step >> 10} KiB per rank per step\n")
    print("| steps | p50 ms | p99 ms |")
    print("|---|---|---|")
    print(f"| no rebalance in progress ({len(reports[0].steps) - times['steps_rebalancing']}) | "
          f"{times['p50_quiet']} | {times['p99_quiet']} |")
    print(f"| rebalance in progress ({times['steps_rebalancing']}) | {times['p50_rebalancing']} | "
          f"{times['p99_rebalancing']} |")
    quiet_p50 = summary["step_time_ms_by_phase"].get("quiet", {}).get("p50")
    print("\n| what the rebalancer did before the step | steps | p50 ms | vs quiet | p90 ms |")
    print("|---|---|---|---|---|")
    for name, row in summary["step_time_ms_by_phase"].items():
        versus = f"{row['p50'] / quiet_p50 - 1:+.0%}" if quiet_p50 else "n/a"
        print(f"| {name} | {row['steps']} | {row['p50']} | {versus} | {row['p90']} |")
    interval = summary["step_time_p99_ratio_interval"]
    spread = f" (bootstrap 90% interval {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
    print(f"\nstep_time_p99_ratio {_figure(summary['step_time_p99_ratio'])}{spread}; decode steps waiting on a "
          f"rebalance: {summary['decode_steps_waiting_on_rebalance']}; rebalances {summary['rebalances']}; imbalance "
          f"{_figure(summary['imbalance_before'])} (start placement) -> {_figure(summary['imbalance_after'])}; "
          f"attempts that kept the placement (a fit gaining under {args.min_gain:g}): {summary['rebalances_kept']}")
    moves, oblivious = stats["expert_moves"], stats["oblivious_moves"]
    if moves:
        print(f"experts moved per rebalance: {np.mean(moves):.1f} ({np.mean(moves) * expert_bytes / 1e6:.2f} MB) "
              f"against {np.mean(oblivious):.1f} for a slot-by-slot remap of the same target "
              f"({np.sum(moves) / max(np.sum(oblivious), 1):.2f}x); bytes received by all ranks "
              f"{summary['bytes_moved'] / 1e6:.2f} MB (moves and new host copies)")
    if stats["lag_steps"]:
        print(f"lag from the end of the fit window to the switch: {np.mean(stats['lag_steps']):.1f} steps, "
              f"{np.mean(stats['lag_seconds']):.2f} s (mean of {len(stats['lag_steps'])})")
    if args.world_size < 2:
        return
    kill_steps = max(20, steps // 3)
    setup = shifting_traffic_setup(args.world_size, kill_steps, experts=args.experts, top_k=args.top_k,
                                   tokens=args.tokens_per_step, hidden=args.hidden_size, layers=args.layers,
                                   slots=args.slots_per_gpu)
    victim = args.world_size // 2
    reports = run_local_group(run_rebalancing_loop, args.world_size, setup, kill_steps,
                              config.model_copy(update={"interval": 10 * kill_steps}),
                              Faults(kills=((victim, kill_steps // 2),)), timeout_s=args.timeout,
                              deadline_s=120 + 5 * kill_steps, allow_failures=True, device=args.device)
    killed = summarize_rebalancing(reports, setup, victim)
    print(f"rank {victim} killed (SIGKILL) at step {kill_steps // 2}: first step completed by the survivors "
          f"{killed['seconds_from_kill_to_first_step']:.2f} s later (collective timeout {args.timeout:g} s, goal "
          f"< {2 * args.timeout:g} s); error vs dense {killed['max_abs_err_vs_dense']:.1e}, tokens lost "
          f"{killed['tokens_lost']}, requests re-queued {killed['requests_requeued']}")


ISSUE_DEMO = ("--world-size", "4", "--steps", "120", "--rebalance-every", "30", "--fail-rank", "2", "--fail-at-step",
              "100")  # the documented demo command (docs/benchmarks.md, "The demo, many runs, against a placebo")
QUICK_DEMO = ("--world-size", "3", "--steps", "24", "--experts", "12", "--hidden-size", "16", "--tokens-per-step",
              "60", "--time-limit", "0.5", "--rebalance-every", "6", "--rebalance-policy", "deepseek", "--solve-in",
              "thread")


KILL_DEMOS = (  # the demo commands with a killed rank: docs/benchmarks.md, "The demo's commands with a killed rank"
    ("--world-size", "4", "--steps", "60", "--rebalance-every", "15", "--fail-rank", "2", "--fail-at-step", "45"),
    ("--world-size", "4", "--steps", "80", "--rebalance-every", "20", "--fail-rank", "3", "--fail-at-step", "55"),
    ISSUE_DEMO,
)
QUICK_KILL_DEMOS = (QUICK_DEMO + ("--fail-rank", "1", "--fail-at-step", "20"),)


# Spins until its parent is gone, so that it never outlives the benchmark however the benchmark ends.
BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(100_000))\n"


@contextlib.contextmanager
def cpu_bound_beside(count: int):
    """`count` CPU-bound processes (other work on the host) for as long as the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def demo_switches_section(runs: int, commands: tuple[tuple[str, ...], ...], busy: int = 0) -> None:
    """Each demo command run `runs` times as a user runs it, with `busy` CPU-bound processes beside: the runs whose
    first switch came before the step its rank is killed in and served better than the start placement on the same
    steps (the demo's `first_switch`)."""
    script = Path(__file__).resolve().parent / "live_demo.py"
    print(f"\n{busy} CPU-bound processes beside each run.")
    print("\n| command | runs | switched before the kill, better | first switch step (kill at) | imbalance from the "
          "first switch to the kill: start placement -> served (median) |")
    print("|---|---|---|---|---|")
    for demo_args in commands:
        kill_at = int(demo_args[demo_args.index("--fail-at-step") + 1])
        good, first, before, after = 0, [], [], []
        for run in range(runs):
            with cpu_bound_beside(busy):
                result = subprocess.run([sys.executable, str(script), *demo_args, "--json"], capture_output=True,
                                        text=True, timeout=900)
            if result.returncode != 0:
                raise RuntimeError(f"the live demo failed (run {run}): {result.stderr[-2000:]}")
            report = json.loads(result.stdout.strip().splitlines()[-1])
            switch = report["first_switch"]
            first.append(switch["from_step"] if switch else None)
            if switch and switch["from_step"] < kill_at and switch["after"] < switch["before"]:
                good += 1
                before.append(switch["before"])
                after.append(switch["after"])
        steps = sorted(s for s in first if s is not None)
        span = f"{steps[0]}-{steps[-1]}" if steps else "none"
        change = f"{np.median(before):.3f} -> {np.median(after):.3f}" if before else "n/a"
        print(f"| `{' '.join(demo_args)}` | {runs} | {good} | {span} ({kill_at}) | {change} |")


def demo_runs_section(runs: int, demo_args: tuple[str, ...]) -> None:
    """The live demo run `runs` times as a user runs it (`scripts/live_demo.py` with `demo_args`, one process
    each): every run's p99 ratio and how many come under the 1.10 goal, the ratio over the steps of every run
    pooled (all steps, and the whole group's only), with an interval that resamples whole runs, the same for a
    placebo (`placebo_runs`), and each phase's steps against its run's quiet median."""
    script = Path(__file__).resolve().parent / "live_demo.py"
    rows, pooled, whole, by_phase, labelled = [], [], [], {}, []
    with tempfile.TemporaryDirectory() as folder:
        for run in range(runs):
            times_file = Path(folder) / f"run{run}.json"
            result = subprocess.run([sys.executable, str(script), *demo_args, "--json", "--step-times",
                                     str(times_file)], capture_output=True, text=True, timeout=900)
            if result.returncode != 0:
                raise RuntimeError(f"the live demo failed (run {run}): {result.stderr[-2000:]}")
            report = json.loads(result.stdout.strip().splitlines()[-1])
            steps = json.loads(times_file.read_text())["steps"]
            pooled.append(_busy_and_quiet(steps))
            quiet_median = np.median(pooled[-1][1])
            for row in steps:
                group = "whole group" if row["world_size"] == report["world_size"] else "after a kill"
                name = PHASES.get(row["phase"], row["phase"])
                by_phase.setdefault((group, name), []).append(row["seconds"] / quiet_median)
            whole.append(_busy_and_quiet([row for row in steps if row["world_size"] == report["world_size"]]))
            rows.append(report)
            labelled.append(steps)
    print(f"\nThe live demo, {runs} runs: scripts/live_demo.py {' '.join(demo_args)} --json\n")
    print("| run | step_time_p99_ratio | bootstrap 90% interval | p99 ms quiet / rebalancing | steps rebalancing | "
          "rebalances (kept) | tokens lost |")
    print("|---|---|---|---|---|---|---|")
    for run, report in enumerate(rows):
        times, interval = report["step_time_ms"], report["step_time_p99_ratio_interval"]
        print(f"| {run} | {_figure(report['step_time_p99_ratio'])} | "
              f"{f'{interval[0]:.2f}-{interval[1]:.2f}' if interval else 'n/a'} | {times['p99_quiet']} / "
              f"{times['p99_rebalancing']} | {times['steps_rebalancing']} | {report['rebalances']} "
              f"({report['rebalances_kept']}) | {report['tokens_lost']} |")
    ratios = [report["step_time_p99_ratio"] for report in rows if report["step_time_p99_ratio"] is not None]
    under = sum(ratio < 1.10 for ratio in ratios)
    ratio, interval = pooled_p99_ratio(pooled)
    busy, quiet = sum((b for b, _ in pooled), []), sum((q for _, q in pooled), [])
    spread = f" (90% interval over runs {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
    print(f"\nruns under 1.10: {under} of {len(ratios)} (median {np.median(ratios):.3f}); pooled over the runs "
          f"({len(busy)} steps rebalancing, {len(quiet)} not): p50 {np.median(busy) * 1e3:.1f} / "
          f"{np.median(quiet) * 1e3:.1f} ms, p99 ratio {ratio:.3f}{spread}")
    if any(busy for busy, _ in whole) and any(quiet for _, quiet in whole):
        ratio, interval = pooled_p99_ratio(whole)
        spread = f" (90% interval over runs {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
        print(f"the whole group's steps only (a smaller group's steps are quicker): p99 ratio {ratio:.3f}{spread}")
        labels = [[row["rebalancing"] for row in steps if row["world_size"] == report["world_size"]]
                  for steps, report in zip(labelled, rows)]
        placebo = [(busy, quiet) for busy, quiet in placebo_runs(labels, demo_args) if busy and quiet]
        ratios = [np.percentile(busy, 99) / np.percentile(quiet, 99) for busy, quiet in placebo]
        ratio, interval = pooled_p99_ratio(placebo)
        spread = f" (90% interval over runs {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
        print(f"placebo (the same loop and rebalancer, which never rebalances; each run's steps labelled as a run "
              f"above): runs under 1.10: {sum(r < 1.10 for r in ratios)} of {len(ratios)} (median "
              f"{np.median(ratios):.3f}); pooled p99 ratio {ratio:.3f}{spread}")
    print("\n| group | what the rebalancer did before the step | steps | p50 / run's quiet p50 | over 1.5x it | "
          "p99 / it |")
    print("|---|---|---|---|---|---|")
    for (group, name), values in sorted(by_phase.items()):
        print(f"| {group} | {name} | {len(values)} | {np.median(values):.2f} | {np.mean(np.array(values) > 1.5):.1%} "
              f"| {np.percentile(values, 99):.2f} |")


def _busy_and_quiet(steps: list[dict]) -> tuple[list[float], list[float]]:
    """The seconds of the steps (rows of `--step-times`) with a rebalance in progress, and of the others."""
    return ([row["seconds"] for row in steps if row["rebalancing"]],
            [row["seconds"] for row in steps if not row["rebalancing"]])


def placebo_runs(labels: list[list[bool]], demo_args: tuple[str, ...]) -> list[tuple[list[float], list[float]]]:
    """The live demo's loop at `demo_args`'s shape, once per entry of `labels` (fresh processes each time), with a
    rebalancer that never rebalances (its helper started, its heartbeats beating): each run's step times (slowest
    rank) split by that entry's labels (True: "rebalancing"), over its steps. What the p99 ratio of a rebalancer
    that cost nothing would read on this machine, with the same number of steps on each side."""
    parser = argparse.ArgumentParser(add_help=False)
    for flag, default in (("--world-size", 4), ("--steps", 20), ("--experts", 32), ("--hidden-size", 64),
                          ("--tokens-per-step", 256), ("--layers", 2), ("--top-k", 4)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--solve-in", default="process")
    shape, _ = parser.parse_known_args(list(demo_args))
    config = RebalanceConfig(window=30, interval=10**9, refit_on_drift=None, patches=None, solve_in=shape.solve_in)
    split = []
    for labels_of_run in labels:
        steps = len(labels_of_run)
        setup = shifting_traffic_setup(shape.world_size, steps, experts=shape.experts, top_k=shape.top_k,
                                       tokens=shape.tokens_per_step, hidden=shape.hidden_size, layers=shape.layers,
                                       time_limit_s=shape.time_limit)
        reports = run_local_group(run_rebalancing_loop, shape.world_size, setup, steps, config, Faults(),
                                  timeout_s=10.0, deadline_s=120 + 5 * steps, device="cpu")
        seconds = [max(report.steps[step]["seconds"] for report in reports) for step in range(steps)]
        split.append(([t for t, busy in zip(seconds, labels_of_run) if busy],
                      [t for t, busy in zip(seconds, labels_of_run) if not busy]))
    return split


def noise_section(args) -> None:
    """Slow steps that are the machine's: the decode loop without a rebalancer, and fixed compute in 1 and W
    processes."""
    steps = args.rebalance_steps
    setup = shifting_traffic_setup(args.world_size, steps, experts=args.experts, top_k=args.top_k,
                                   tokens=args.tokens_per_step, hidden=args.hidden_size, layers=args.layers,
                                   slots=args.slots_per_gpu)
    reports = run_local_group(run_decode_loop, args.world_size, dataclasses.replace(setup, check_dense=False), steps,
                              deadline_s=120 + 5 * steps, device=args.device)
    rows = [(f"decode loop, {args.world_size} ranks, no rebalancer ({steps} steps, slowest rank)",
             np.max([report.seconds_per_step for report in reports], axis=0))]
    repeats = max(10, steps // 2)
    context = mp.get_context("spawn")
    for processes in sorted({1, args.world_size}):
        results = context.Queue()
        workers = [context.Process(target=_timed_compute, args=(repeats, results, parent_of_child()))
                   for _ in range(processes)]
        for worker in workers:
            worker.start()
        times = [results.get(timeout=600) for _ in workers]
        for worker in workers:
            worker.join()
        rows.append((f"fixed compute, {processes} process(es) at once ({repeats} times, one process)",
                     np.asarray(times[0])))
    print(f"\nThe machine's slow steps ({mp.cpu_count()} cores)\n")
    print("| what | median ms | over 1.5x the median | p99 / median |")
    print("|---|---|---|---|")
    for name, seconds in rows:
        median = float(np.median(seconds))
        print(f"| {name} | {median * 1e3:.1f} | {np.mean(seconds > 1.5 * median):.1%} | "
              f"{np.percentile(seconds, 99) / median:.2f} |")


def _timed_compute(repeats: int, results, parent: tuple[int, bool]) -> None:
    """Put on `results` the seconds of each of `repeats` runs of the same single-threaded matrix work (about 10 ms
    here); the process ends with its parent (`parent`: the parent's `parent_of_child()`)."""
    end_with_parent(*parent)
    import torch

    torch.set_num_threads(1)
    matrix = torch.randn(200, 200, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        value = matrix
        for _ in range(60):
            value = (value @ matrix).tanh()
        times.append(time.perf_counter() - began)
    results.put(times)


def plan_section(args) -> None:
    """The weight moves' plan at the full shape: planned in the helper, broadcast, each rank's part decoded."""
    layers, experts, gpus, slots = (4, 64, 16, 5) if args.quick else (58, 256, 64, 5)
    trace = generate_trace(SyntheticConfig(num_steps=100, num_layers=layers, num_experts=experts, top_k=8,
                                           tokens_per_step=4096, seed=0))
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
    current = fit_placement("deepseek", trace.counts_TLE[:50], cluster)
    target = plan_migration(current, fit_placement("deepseek", trace.counts_TLE[50:], cluster)).realised
    shape = TransferShape(hidden_size=7168, intermediate_size=2048, element_size=1, max_bytes_per_round=64 << 20,
                          failures_tolerated=2)
    began = time.perf_counter()
    fills, rounds = plan_rebalance(current, target, shape)
    planned = time.perf_counter() - began
    began = time.perf_counter()
    fills_N8, chunks_C6 = encode_fills(fills), encode_rounds(rounds)
    encoded = time.perf_counter() - began
    began = time.perf_counter()
    decode_fills(fills_N8), decode_rounds(chunks_C6)
    whole = time.perf_counter() - began
    began = time.perf_counter()
    for rank in range(gpus):
        decode_for_rank(fills_N8, chunks_C6, rank)
    per_rank = (time.perf_counter() - began) / gpus
    megabytes = (fills_N8.nbytes + chunks_C6.nbytes) / 1e6
    print(f"\nPlanning the weight moves: {layers} layers x {experts} experts on {gpus} x {slots}, {len(fills):,} "
          f"fills, {len(rounds)} rounds of {shape.max_bytes_per_round >> 20} MB, {len(chunks_C6):,} chunks "
          f"({megabytes:.1f} MB broadcast)\n")
    print("| work | where | seconds |")
    print("|---|---|---|")
    print(f"| plan (fills and rounds) | the helper, beside the solve (every rank at one step before) | {planned:.2f} |")
    print(f"| encode | the helper | {encoded:.2f} |")
    print(f"| decode the whole plan | nowhere (what decoding instead of filtering would cost) | {whole:.3f} |")
    print(f"| decode this rank's part | every rank, at the step the answer arrives | {per_rank:.4f} |")
    print(f"\nat that step a rank spends {per_rank / planned:.4f}x the time of planning the moves itself")


def host_copies_section(args) -> None:
    """The host memory that any f ranks dying at once costs a rank, at the full shape."""
    layers, experts = (4, 64) if args.quick else (61, 256)
    shapes = [(16, 5)] if args.quick else [(64, 5), (128, 3)]
    expert_bytes = 7168 * 2048 * 3  # DeepSeek-V3's routed expert, fp8 (x2 in bf16)
    trace = generate_trace(SyntheticConfig(num_steps=50, num_layers=layers, num_experts=experts, top_k=8,
                                           tokens_per_step=8192, seed=0))
    print(f"\nHost copies: {layers} layers x {experts} experts; an expert is {expert_bytes / 1e6:.0f} MB in fp8, "
          f"{2 * expert_bytes / 1e6:.0f} MB in bf16\n")
    print("| GPUs x slots | policy | failures tolerated | host copies per rank, mean | most | GB per rank, fp8 | "
          "bf16 | vs the rank's slots | seconds for every layer's copies |")
    print("|---|---|---|---|---|---|---|---|---|")
    for gpus, slots in shapes:
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
        for policy in ("deepseek", "cpsat"):
            options = {"time_limit_s": 2.0 if args.quick else 10.0} if policy == "cpsat" else {}
            placement = fit_placement(policy, trace.counts_TLE, cluster, **options)
            grid = placement.phy2log_LP.reshape(layers, gpus, slots)
            for tolerated in (1, 2, 3):
                began = time.perf_counter()
                copies = [gpu for layer in range(layers) for gpu, _ in backup_wanted(grid[layer], tolerated)]
                seconds = time.perf_counter() - began
                per_rank = np.bincount(copies, minlength=gpus)
                most = int(per_rank.max())
                print(f"| {gpus} x {slots} | {policy} | {tolerated} | {per_rank.mean():.1f} | {most} | "
                      f"{most * expert_bytes / 1e9:.1f} | {2 * most * expert_bytes / 1e9:.1f} | "
                      f"{most / (slots * layers):.2f}x | {seconds:.2f} |")


def _figure(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def overhead_section(args) -> None:
    slots = args.slots_per_gpu or args.experts // args.world_size + 2
    trace = generate_trace(SyntheticConfig(num_steps=30 + args.steps, num_layers=args.layers, num_experts=args.experts,
                                           top_k=args.top_k, tokens_per_step=args.tokens_per_step))
    cluster = ClusterSpec(num_gpus=args.world_size, slots_per_gpu=slots, gpus_per_node=args.world_size)
    placement = fit_placement("cpsat", trace.counts_TLE[:30], cluster, time_limit_s=2.0, routing="dynamic")
    config = MoELayerConfig(hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
                            num_experts=args.experts, top_k=args.top_k)
    share = trace.counts_TLE[30:] / (args.tokens_per_step * args.top_k)
    setups = {name: DecodeSetup(config, placement, share, args.tokens_per_step, routing, record=record,
                                check_dense=False, compile_routing=not args.eager)
              for name, (routing, record) in VARIANTS.items()}
    by_rank = run_local_group(run_variants, args.world_size, setups, args.steps, args.repeats,
                              deadline_s=120 + 5 * args.steps * args.repeats * len(VARIANTS), device=args.device)
    backend = "NCCL" if args.device == "cuda" else "Gloo"
    print(f"{args.world_size} {backend} ranks x {slots} slots, {args.layers} layers x {args.experts} experts, "
          f"top-{args.top_k}, {args.tokens_per_step} tokens per step, D={args.hidden_size}; {args.steps} steps x "
          f"{args.repeats} repeats\n")
    print("| variant | wall ms per step | vs static, no recorder | CPU ms per step | vs static, no recorder | "
          "imbalance measured |")
    print("|---|---|---|---|---|---|")
    base = base_cpu = None
    for name, (routing, _) in VARIANTS.items():
        runs = [[rank[name][r] for rank in by_rank] for r in range(args.repeats)]
        wall = float(np.median([max(np.median(report.seconds_per_step) for report in run) for run in runs]))
        cpu = float(np.median([np.mean([np.median(report.cpu_seconds_per_step) for report in run]) for run in runs]))
        base, base_cpu = base or wall, base_cpu or cpu
        imbalance = summarize([rank[name][0] for rank in by_rank], routing)["imbalance_measured"]
        print(f"| {name} | {wall * 1e3:.2f} | {wall / base - 1:+.1%} | {cpu * 1e3:.2f} | {cpu / base_cpu - 1:+.1%} | "
              f"{imbalance:.4f} |")


if __name__ == "__main__":
    sys.exit(main())
