"""Benchmark whether the `cpsat` time budget holds when other processes share the cores, and what holding it costs.

Fits the full synthetic shape (61 layers x 256 experts, top-8, 8,192 tokens per step, one 50-step window, seed 0)
with `cpsat` under dynamic routing and `--time-limit` seconds (default 10), `--workers` layers at once (default 2),
on 64 GPUs x 5 slots and 128 x 3,
idle and with `--busy` processes (default 2) spinning beside the fit (a `python -c` busy loop that ends with this
script, started before the fit and killed after it), `--repeats` times each (default 3), idle and busy fits taking
turns. Prints a markdown table per cluster and load: fit seconds (mean and max, wall clock around the whole fit),
the worst ratio to the limit, the fitted objective (mean over layers and the window's steps of max / mean GPU
load under the dynamic router) over all layers and as `info["fitted_chosen"]` reports it (the scored layers), the
greedy's fitted objective beside, and the layers the budget degraded (`info["levels"]`). The 1-minute load
average before each fit is shown: on a shared machine "idle" is only as idle as the other users let it be.

Usage: python scripts/bench_budget.py [--time-limit 10] [--repeats 3] [--busy 2] [--workers 2] [--json out.json]
       [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from collectives.lifeline import parent_of_child
from eplb.cli.arg_types import integer, json_output, number
from eplb.cli.main import OneLineParser
from placement import ClusterSpec, fit_placement
from placement.policies.cpsat_policy import LEVELS, fitted_objective
from traces.synthetic import SyntheticConfig, generate_trace

# A process that keeps one core busy until it is killed, or until this script ends however it ends.
SPINNER = ("from collectives.lifeline import end_with_parent; "
           "end_with_parent({parent}, {main})\nwhile True: pass")

CLUSTERS = [ClusterSpec(num_gpus=64, slots_per_gpu=5), ClusterSpec(num_gpus=128, slots_per_gpu=3)]
TOKENS_PER_STEP = 8192
WINDOW = 50
MAX_SECONDS = 86_400.0  # one day: a budget beyond it is a typo


def model_fitted(counts_TLE: np.ndarray, placement, cluster: ClusterSpec) -> float:
    """Fitted objective of the whole model: mean over layers of each layer's fitted objective (dynamic router)."""
    ones = np.ones(cluster.num_gpus)
    return float(np.mean([fitted_objective(counts_TLE[:, layer], placement.phy2log_LP[layer],
                                           placement.weights_LP[layer], cluster, "dynamic", ones)
                          for layer in range(counts_TLE.shape[1])]))


def timed_fit(counts_TLE: np.ndarray, cluster: ClusterSpec, time_limit: float, busy: int, workers: int = 2) -> dict:
    """One cpsat fit solving `workers` layers at once, with `busy` spinning processes beside it when busy > 0."""
    load_before = os.getloadavg()[0]
    parent, main = parent_of_child()
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER.format(parent=parent, main=main)])
                for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0.0)  # let the spinners take their cores
        began = time.perf_counter()
        placement = fit_placement("cpsat", counts_TLE, cluster, time_limit_s=time_limit, routing="dynamic",
                                  workers=workers)
        seconds = time.perf_counter() - began
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    info = placement.info
    return {"seconds": seconds, "load_before": load_before, "fitted_all": model_fitted(counts_TLE, placement, cluster),
            "fitted_info": info["fitted_chosen"], "levels": info["levels"], "degraded": info["degraded_layers"],
            "layer_costs_s": info["layer_costs"]}


def print_table(rows: list[dict], time_limit: float) -> None:
    print(f"\n| cluster | load | load avg before | fit s mean | fit s max | max / limit | fitted, all layers | "
          f"fitted, info | greedy fitted | degraded layers ({' / '.join(LEVELS[1:])}) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        fits = row["fits"]
        seconds = [f["seconds"] for f in fits]
        infos = [f["fitted_info"] for f in fits if f["fitted_info"] is not None]
        by_level = " / ".join(f"{np.mean([f['levels'][level] for f in fits]):.1f}" for level in LEVELS[1:])
        load_before = ", ".join(f"{f['load_before']:.1f}" for f in fits)
        print(f"| {row['cluster']} | {row['load']} | {load_before} | "
              f"{np.mean(seconds):.2f} | {max(seconds):.2f} | {max(seconds) / time_limit:.3f} | "
              f"{np.mean([f['fitted_all'] for f in fits]):.4f} | "
              f"{np.mean(infos) if infos else float('nan'):.4f} | {row['greedy_fitted']:.4f} | "
              f"{np.mean([f['degraded'] for f in fits]):.1f} ({by_level}) |")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=number(0, low_open=True, high=MAX_SECONDS), default=10.0,
                        help="cpsat budget per fit, seconds (default 10)")
    parser.add_argument("--repeats", type=integer(1, 1000), default=3, help="fits per cluster and load (default 3)")
    parser.add_argument("--busy", type=integer(0, 64), default=2,
                        help="spinning processes beside the busy fits (default 2)")
    parser.add_argument("--workers", type=integer(1, 256), default=2,
                        help="layers solved at once (default 2, cpsat's; the live rebalancer's solve_threads is 1)")
    parser.add_argument("--json", type=json_output(), default=None, help="also write every fit's figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="4 layers, 1 s, one repeat: a smoke run")
    args = parser.parse_args(argv)
    layers, time_limit, repeats = 61, args.time_limit, args.repeats
    if args.quick:
        layers, time_limit, repeats = 4, min(time_limit, 1.0), 1
    began = time.perf_counter()
    counts = generate_trace(SyntheticConfig(num_steps=WINDOW, num_layers=layers,
                                            tokens_per_step=TOKENS_PER_STEP)).counts_TLE
    loads = [("idle", 0)] + ([(f"{args.busy} busy", args.busy)] if args.busy else [])
    rows = []
    for cluster in CLUSTERS:
        name = f"{cluster.num_gpus}x{cluster.slots_per_gpu}"
        greedy = model_fitted(counts, fit_placement("deepseek", counts, cluster), cluster)
        cluster_rows = [{"cluster": name, "load": load, "greedy_fitted": greedy, "fits": []} for load, _ in loads]
        for repeat in range(repeats):
            for row, (load, busy) in zip(cluster_rows, loads):
                fit = timed_fit(counts, cluster, time_limit, busy, args.workers)
                row["fits"].append(fit)
                print(f"{name} {load} #{repeat + 1}: {fit['seconds']:.2f} s, fitted {fit['fitted_all']:.4f}, "
                      f"levels {fit['levels']}, load avg before {fit['load_before']:.1f}", flush=True)
        rows += cluster_rows
    print_table(rows, time_limit)
    print(f"\nsynthetic {layers}x256, {WINDOW}-step window, time limit {time_limit:g} s; "
          f"bench wall time {time.perf_counter() - began:.0f} s; load average now "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps({"time_limit_s": time_limit, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
