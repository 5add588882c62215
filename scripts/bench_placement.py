"""How do the placement policies compare held-out at the full shape a user has, and on real ESFT routing?

Sections:
1. speed of the baseline: the vectorised `deepseek` policy against the plain-loop rendering of the same algorithm
   (`placement.policies.deepseek_reference`), timed in this process (58 and 61 layers x 256 experts; 64 GPUs x 5
   slots and 128 GPUs x 3 slots);
2. synthetic full shape (61 layers x 256 experts, top-8, 8,192 tokens per step: 128 tokens/GPU/step at 64x5 and
   64 at 128x3, drifting and bursty): rolling replay (refit every --every steps on the last --window), each
   placement scored on its own window ("fitted") and on the steps that follow ("held-out"), for every policy under
   static and dynamic routing (cpsat fits for the routing it is scored with), with the lower bound and the mean
   fit time beside. "dynamic" scores each step's best split (certified within 0.1%, or the gap is reported);
   "live" scores the same dynamic placements under the live router that serving runs (`route_step`: 12 rounds,
   whole tokens);
3. the real ESFT logs (`../shared/data/esft-dsv2lite`, four tasks of ~32 steps of 256 tokens) at 16x5 and 32x3:
   rolling replay (refit every 8 steps on the last 8) within each task ("within tasks": every held-out window
   comes from the task the placement was fitted on), rolling replay over the four tasks one after another ("task
   stream": 3 of its 15 held-out windows follow a switch to a task never seen before), and cross-task (fit on one
   whole task, score on each other task).
Beside the rolling rows of sections 2 and 3, the same replays with refits on drift (`--drift-ratio`, default 1.4:
a served step more than 1.4 times as imbalanced as the placement's fit triggers a refit on the steps since;
`placement/replay.py`), under dynamic routing and the live router, for every policy alike.
4. lag (`--lag-only` runs this section alone): the synthetic rolling replay (dynamic routing and the live router)
   where each placement serves only `lag` steps after its fit window ends, the lag a live group has:
   ceil((fit seconds + transfer seconds) / STEP_SECONDS). Fit seconds: the longer of two fits timed here, on the
   trace's first window and the next; transfer seconds: the most expert copies one GPU sends or receives in the
   migration plan between those two fits (`placement.migration.plan_migration`), times EXPERT_BYTES, over
   GPU_LINK_BYTES_PER_SECOND. For the greedy and for `cpsat` at each budget of `--lag-budgets`, beside the same
   replay without lag, on a trace of `--lag-steps` steps. Every row of a cluster scores the same steps, from
   window + the largest lag to the end: each replay starts (largest lag - its lag) steps into the trace.

Usage: python scripts/bench_placement.py [--steps 500] [--policies deepseek,cpsat] [--time-limit 10] [--json out.json]
       [--drift-ratio 1.4] [--quick] [--skip-esft | --skip-synthetic] [--lag-only] [--lag-steps 600]
       [--lag-budgets 10,2,0.5]
"""

import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np

from eplb.cli.arg_types import comma_separated, integer, number, one_of
from eplb.cli.bench_harness import bench_parser, finish, markdown_table
from placement import (
    POLICIES,
    ClusterSpec,
    fit_placement,
    plan_migration,
    rolling_replay,
    score_placement,
)
from placement.policies.deepseek import deepseek_rebalance
from placement.policies.deepseek_reference import reference_rebalance
from placement.scoring import StepScores
from traces import load_trace
from traces.synthetic import SyntheticConfig, generate_trace

CLUSTERS = [ClusterSpec(num_gpus=64, slots_per_gpu=5), ClusterSpec(num_gpus=128, slots_per_gpu=3)]
ESFT_CLUSTERS = [ClusterSpec(num_gpus=16, slots_per_gpu=5), ClusterSpec(num_gpus=32, slots_per_gpu=3)]
ESFT = Path(__file__).resolve().parents[2] / "shared" / "data" / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"
ESFT_TASKS = ("intent", "law", "summary", "translation")  # in the order the logs hold them
MAX_STEPS = 20_000  # a synthetic trace's steps: 61 layers x 256 experts stay within the trace limit
MAX_SECONDS = 86_400.0  # one day: a budget beyond it is a typo
TOKENS_PER_STEP = 8192
KEYS = ("imbalance_mean", "imbalance_p99", "imbalance_max", "lower_bound")
STEP_SECONDS = 0.05  # one decode step of a 64-128-GPU EP group
# One routed expert of DeepSeek-V3 in one layer: gate, up and down projections of 7168 x 2048, FP8 (one byte each).
EXPERT_BYTES = 3 * 7168 * 2048
# What one GPU sends or receives per second while weights move: one 400 Gb/s NIC per GPU (cross-node; NVLink
# inside a node is faster, so this is the slow end).
GPU_LINK_BYTES_PER_SECOND = 50e9


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def bench_speed(load_LE: np.ndarray, cluster: ClusterSpec, repeats: int) -> dict:
    args = (cluster.num_slots, 1, 1, cluster.num_gpus)
    ours = best_time(lambda: deepseek_rebalance(load_LE, *args), repeats * 5)
    loop = best_time(lambda: reference_rebalance(load_LE, *args), repeats)
    same = bool((deepseek_rebalance(load_LE, *args)[0] == reference_rebalance(load_LE, *args)).all())
    return {"vectorised_ms": ours * 1e3, "loop_ms": loop * 1e3, "speedup": loop / ours, "identical": same}


def policy_options(policy: str, routing: str, time_limit: float) -> dict:
    return {"routing": routing, "time_limit_s": time_limit} if policy == "cpsat" else {}


def bench_rolling(traces_TLE: list[np.ndarray], cluster, policies, every, window, time_limit) -> list[dict]:
    """Rolling replay of every policy under both routings: fitted and held-out rows.

    Each trace of `traces_TLE` is replayed on its own (a new replay for each) and the scores of all are pooled.
    """
    rows = []
    for policy, routing in itertools.product(policies, ("static", "dynamic")):
        also = ("live",) if routing == "dynamic" else ()
        replays = [rolling_replay(counts_TLE, cluster, policy, every, window, routing,
                                  policy_options(policy, routing, time_limit), also_routings=also)
                   for counts_TLE in traces_TLE]
        fit_s = float(np.mean([s for r in replays for s in r.fit_seconds]))
        for fit, scores in (("fitted", [r.fitted for r in replays]), ("held-out", [r.held_out for r in replays])):
            summary = StepScores.concatenate(scores).summary()
            rows.append({"policy": policy, "routing": routing, "fit": fit, "fit_seconds": fit_s,
                         **{k: summary[k] for k in KEYS}})
        if also:
            # The same placements under the live router (12 rounds, whole tokens) instead of the best split.
            summary = StepScores.concatenate([r.held_out_also["live"] for r in replays]).summary()
            rows.append({"policy": policy, "routing": "live", "fit": "held-out", "fit_seconds": fit_s,
                         **{k: summary[k] for k in KEYS}})
        print("  " + "  ".join(f"{r['policy']} {r['routing']} {r['fit']} {r['imbalance_mean']:.3f}"
                               for r in rows[-3 if also else -2:]) + f"  fit {fit_s:.2f} s", flush=True)
    return rows


def bench_drift(traces_TLE: list[np.ndarray], cluster, policies, every, window, time_limit, ratio,
                rolling: list[dict]) -> list[dict]:
    """Rolling replay with refits on drift (dynamic routing and the live router) beside the fixed cadence.

    `rolling` holds the fixed-cadence rows of `bench_rolling` on the same traces, for the comparison.
    """
    rows = []
    for policy in policies:
        replays = [rolling_replay(counts_TLE, cluster, policy, every, window, "dynamic",
                                  policy_options(policy, "dynamic", time_limit), also_routings=("live",),
                                  drift_ratio=ratio)
                   for counts_TLE in traces_TLE]
        fits = sum(len(r.refit_steps) for r in replays)
        drifts = sum(len(r.drift_steps) for r in replays)
        for routing, scores in (("dynamic", [r.held_out for r in replays]),
                                ("live", [r.held_out_also["live"] for r in replays])):
            fixed = next(r for r in rolling if (r["policy"], r["routing"], r["fit"]) == (policy, routing, "held-out"))
            summary = StepScores.concatenate(scores).summary()
            rows.append({"policy": policy, "routing": routing, "ratio": ratio, "fixed_mean": fixed["imbalance_mean"],
                         "drift_refits": drifts, "fits": fits, **{k: summary[k] for k in KEYS}})
        print(f"  drift {ratio}: {policy} dynamic {rows[-2]['fixed_mean']:.3f} -> {rows[-2]['imbalance_mean']:.3f}, "
              f"live {rows[-1]['fixed_mean']:.3f} -> {rows[-1]['imbalance_mean']:.3f} "
              f"({drifts} refits on drift, {fits} fits)", flush=True)
    return rows


def live_lag(counts_TLE: np.ndarray, cluster, policy: str, options: dict, every: int, window: int) -> dict:
    """The lag a live group has with this policy: ceil((fit seconds + transfer seconds) / STEP_SECONDS).

    Two fits are timed, on steps [0, window) and [every, every + window); the transfer is the migration plan from
    the first to the second, limited by the GPU that sends or receives the most expert copies.
    """
    placements, seconds = [], []
    for first in (0, every):
        began = time.perf_counter()
        placements.append(fit_placement(policy, counts_TLE[first : first + window], cluster, **options))
        seconds.append(time.perf_counter() - began)
    moves = plan_migration(*placements, bytes_per_expert=EXPERT_BYTES).summary()
    busiest_link = max(moves["max_sends_per_gpu"], moves["max_receives_per_gpu"])
    transfer = busiest_link * EXPERT_BYTES / GPU_LINK_BYTES_PER_SECOND
    return {"fit_seconds": max(seconds), "transfer_seconds": transfer, "moves": moves["num_moves"],
            "busiest_link_copies": busiest_link, "lag": math.ceil((max(seconds) + transfer) / STEP_SECONDS)}


def bench_lag(counts_TLE: np.ndarray, cluster, policies, every, window, budgets) -> list[dict]:
    """Rolling replay with the lag a live group has, beside the same replay without lag, on the same steps.

    One configuration per policy, `cpsat` once per budget of `budgets` (seconds), fitted for dynamic routing. Each
    replay runs under the live router (so each fit is also scored on its window under it, the cheaper router) with
    the best split ("dynamic") beside it. Every replay scores steps [window + largest lag, T).
    """
    configs = [(policy, budget) for policy in policies for budget in (budgets if policy == "cpsat" else [None])]
    timing = {}
    for policy, budget in configs:
        options = policy_options(policy, "dynamic", budget)
        timing[policy, budget] = live_lag(counts_TLE, cluster, policy, options, every, window)
        t = timing[policy, budget]
        print(f"  lag {policy} {budget or ''}: fit {t['fit_seconds']:.2f} s + transfer {t['transfer_seconds']:.2f} s"
              f" ({t['busiest_link_copies']} copies on the busiest GPU) -> {t['lag']} steps", flush=True)
    largest = max(t["lag"] for t in timing.values())
    if window + largest >= counts_TLE.shape[0]:
        raise SystemExit(f"--lag-steps {counts_TLE.shape[0]} leaves no step to score after a window of {window} "
                         f"and a lag of {largest}; use --lag-steps > {window + largest}")
    rows = []
    for (policy, budget), t in timing.items():
        scores = {}
        for lag in (0, t["lag"]):
            replay = rolling_replay(counts_TLE[largest - lag :], cluster, policy, every, window, "live",
                                    policy_options(policy, "dynamic", budget), also_routings=("dynamic",), lag=lag)
            scores[lag] = {"dynamic": replay.held_out_also["dynamic"].summary(), "live": replay.held_out.summary()}
        for routing in ("dynamic", "live"):
            lagged = scores[t["lag"]][routing]
            rows.append({"policy": policy, "budget": budget, "routing": routing, **t,
                         "held_out_steps": lagged["steps"], "no_lag_mean": scores[0][routing]["imbalance_mean"],
                         **{k: lagged[k] for k in KEYS}})
        dynamic, live = rows[-2:]
        print(f"  lag {policy} {budget or ''}: at lag {t['lag']}, dynamic {dynamic['no_lag_mean']:.3f} -> "
              f"{dynamic['imbalance_mean']:.3f}, live {live['no_lag_mean']:.3f} -> {live['imbalance_mean']:.3f}",
              flush=True)
    return rows


def bench_cross_task(traces: dict[str, np.ndarray], cluster, policies, time_limit) -> list[dict]:
    """Fit on one whole ESFT task, score on each other task; mean over the ordered task pairs."""
    tasks = list(traces)
    rows = []
    for policy, routing in itertools.product(policies, ("static", "dynamic")):
        fitted, held, seconds = [], [], []
        for fit_task in tasks:
            began = time.perf_counter()
            placement = fit_placement(policy, traces[fit_task], cluster, **policy_options(policy, routing, time_limit))
            seconds.append(time.perf_counter() - began)
            fitted.append(score_placement(placement, traces[fit_task], routing).summary()["imbalance_mean"])
            held += [score_placement(placement, traces[t], routing).summary()["imbalance_mean"]
                     for t in tasks if t != fit_task]
        rows.append({"policy": policy, "routing": routing, "fitted": float(np.mean(fitted)),
                     "held_out": float(np.mean(held)), "fit_seconds": float(np.mean(seconds))})
        print(f"  cross-task {policy:8s} {routing:7s} fitted {rows[-1]['fitted']:.3f} "
              f"other tasks {rows[-1]['held_out']:.3f}", flush=True)
    return rows


def tables(speed: list[dict], synthetic: list[dict], esft: list[dict]) -> list[str]:
    """The markdown tables of the sections that ran."""
    out = [markdown_table(("shape", "vectorised", "loop", "speed-up", "identical"),
                          ((s["shape"], f"{s['vectorised_ms']:.1f} ms", f"{s['loop_ms']:.0f} ms",
                            f"x{s['speedup']:.0f}", s["identical"]) for s in speed))]
    blocks = synthetic + esft
    out.append(markdown_table(
        ("data", "cluster", "policy", "routing", "fit", "mean", "p99", "max", "lower bound", "fit time"),
        ((b["data"], b["cluster"], r["policy"], r["routing"], r["fit"], f"{r['imbalance_mean']:.3f}",
          f"{r['imbalance_p99']:.3f}", f"{r['imbalance_max']:.3f}", f"{r['lower_bound']:.3f}",
          f"{r['fit_seconds']:.2f} s") for b in blocks for r in b.get("rolling", []))))
    if any("drift" in b for b in blocks):
        out.append(markdown_table(
            ("data", "cluster", "policy", "routing", "fixed cadence", "refit on drift", "p99", "max",
             "refits on drift", "fits"),
            ((b["data"], b["cluster"], r["policy"], r["routing"], f"{r['fixed_mean']:.3f}",
              f"{r['imbalance_mean']:.3f}", f"{r['imbalance_p99']:.3f}", f"{r['imbalance_max']:.3f}",
              r["drift_refits"], r["fits"]) for b in blocks for r in b.get("drift", []))))
    if any("lag" in b for b in synthetic):
        out.append(markdown_table(
            ("data", "cluster", "policy", "fit time", "transfer", "lag", "routing", "no lag", "with lag", "p99", "max",
             "lower bound"),
            ((b["data"], b["cluster"], r["policy"] if r["budget"] is None else f"{r['policy']} {r['budget']:g} s",
              f"{r['fit_seconds']:.2f} s", f"{r['transfer_seconds']:.2f} s", r["lag"], r["routing"],
              f"{r['no_lag_mean']:.3f}", f"{r['imbalance_mean']:.3f}", f"{r['imbalance_p99']:.3f}",
              f"{r['imbalance_max']:.3f}", f"{r['lower_bound']:.3f}") for b in synthetic for r in b.get("lag", []))))
    if any("cross_task" in e for e in esft):
        out.append(markdown_table(
            ("ESFT cross-task", "policy", "routing", "fitted task", "other tasks", "fit time"),
            ((b["cluster"], r["policy"], r["routing"], f"{r['fitted']:.3f}", f"{r['held_out']:.3f}",
              f"{r['fit_seconds']:.2f} s") for b in esft for r in b.get("cross_task", []))))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, whole_doc=True, json_help="also write all results to this JSON file")
    step_count, budget_s = integer(1, MAX_STEPS), number(0, low_open=True, high=MAX_SECONDS)
    parser.add_argument("--steps", type=step_count, default=500, help="steps of each synthetic trace (default 500)")
    parser.add_argument("--every", type=step_count, default=50, help="rolling replay: refit every N steps (default 50)")
    parser.add_argument("--window", type=step_count, default=50,
                        help="rolling replay: fit on the last W steps (default 50)")
    parser.add_argument("--policies", type=comma_separated(one_of(sorted(POLICIES))), default=["deepseek", "cpsat"],
                        help="comma-separated policies (default both)")
    parser.add_argument("--time-limit", type=budget_s, default=10.0, help="cpsat budget per fit, seconds (default 10)")
    parser.add_argument("--drift-ratio", type=number(1, low_open=True, high=100, or_exactly=0), default=1.4,
                        help="rolling replay rows with refits on drift at this ratio (default 1.4; 0 skips them)")
    parser.add_argument("--repeats", type=integer(1, 1000), default=3,
                        help="timing repeats of the loop baseline (default 3)")
    parser.add_argument("--skip-esft", action="store_true", help="skip the ESFT section")
    parser.add_argument("--skip-synthetic", action="store_true", help="skip the speed and synthetic sections")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke run")
    parser.add_argument("--lag-only", action="store_true", help="run the lag rows alone (synthetic full shape)")
    parser.add_argument("--lag-steps", type=step_count, default=600,
                        help="steps of the synthetic trace of the lag rows (default 600)")
    parser.add_argument("--lag-budgets", type=comma_separated(budget_s), default=[10.0, 2.0, 0.5],
                        help="cpsat budgets of the lag rows, seconds per fit (default 10,2,0.5)")
    args = parser.parse_args(argv)
    if not args.quick and args.window >= min(args.steps, args.lag_steps):
        parser.error(f"--steps and --lag-steps must exceed --window ({args.window}): a replay scores the steps after "
                     f"its window")
    if args.skip_synthetic and (args.skip_esft or args.quick or args.lag_only or not ESFT.exists()):
        parser.error(f"--skip-synthetic leaves only the ESFT section, which --skip-esft, --quick and --lag-only skip "
                     f"and which needs {ESFT}: drop one")
    policies = args.policies
    layers, steps, clusters, time_limit = 61, args.steps, CLUSTERS, args.time_limit
    lag_steps, lag_budgets = args.lag_steps, sorted(set(args.lag_budgets), reverse=True)
    speed_layers = [58, 61]
    if args.quick:
        layers, steps, speed_layers, time_limit = 3, 3 * args.window, [3], min(time_limit, 1.0)
        lag_steps, lag_budgets = 4 * args.window, [min(time_limit, 0.2)]
    speed, synthetic, esft = [], [], []
    if args.skip_synthetic:
        speed_layers, clusters = [], []
    if args.lag_only:
        speed_layers = []
    for num_layers in speed_layers:
        load = generate_trace(SyntheticConfig(num_steps=20, num_layers=num_layers)).load_LE().astype(float)
        for cluster in clusters:
            result = bench_speed(load, cluster, args.repeats)
            speed.append({"shape": f"{num_layers}x256 on {cluster.num_gpus}x{cluster.slots_per_gpu}", **result})
            print(f"speed {speed[-1]['shape']}: x{result['speedup']:.0f}", flush=True)
    for cluster in clusters:
        name = f"{cluster.num_gpus}x{cluster.slots_per_gpu}"
        block = {"data": f"synthetic {layers}x256", "cluster": name}
        if not args.lag_only:
            trace = generate_trace(SyntheticConfig(num_steps=steps, num_layers=layers, tokens_per_step=TOKENS_PER_STEP))
            print(f"synthetic {layers}x256 on {name}", flush=True)
            block["rolling"] = bench_rolling([trace.counts_TLE], cluster, policies, args.every, args.window,
                                             time_limit)
            if args.drift_ratio:
                block["drift"] = bench_drift([trace.counts_TLE], cluster, policies, args.every, args.window,
                                             time_limit, args.drift_ratio, block["rolling"])
        lag_trace = generate_trace(SyntheticConfig(num_steps=lag_steps, num_layers=layers,
                                                   tokens_per_step=TOKENS_PER_STEP))
        print(f"synthetic {layers}x256 on {name}: {lag_steps} steps with lag", flush=True)
        block["lag"] = bench_lag(lag_trace.counts_TLE, cluster, policies, args.every, args.window, lag_budgets)
        synthetic.append(block)
    if not args.skip_esft and ESFT.exists() and not args.quick and not args.lag_only:
        tasks = {t: load_trace(ESFT, tokens_per_step=256, tasks=[t]).counts_TLE for t in ESFT_TASKS}
        stream = [np.concatenate(list(tasks.values()))]
        for cluster in ESFT_CLUSTERS:
            name = f"{cluster.num_gpus}x{cluster.slots_per_gpu}"
            for data, traces in (("within tasks", list(tasks.values())), ("task stream", stream)):
                print(f"ESFT on {name}: {data}", flush=True)
                block = {"data": f"ESFT 26x64 {data}", "cluster": name,
                         "rolling": bench_rolling(traces, cluster, policies, 8, 8, time_limit)}
                if args.drift_ratio:
                    block["drift"] = bench_drift(traces, cluster, policies, 8, 8, time_limit, args.drift_ratio,
                                                 block["rolling"])
                esft.append(block)
            esft[-1]["cross_task"] = bench_cross_task(tasks, cluster, policies, time_limit)
    return finish(args.json, {"speed": speed, "synthetic": synthetic, "esft": esft},
                  *tables(speed, synthetic, esft))


if __name__ == "__main__":
    sys.exit(main())
