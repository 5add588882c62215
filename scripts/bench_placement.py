"""Benchmark the placement policies on the full shape a user has.

For each shape (58 and 61 layers x 256 experts; 64 GPUs x 5 slots at 128 tokens/GPU/step and 128 GPUs x 3 slots
at 64 tokens/GPU/step, both 8,192 tokens per step, top-8) it reports:
- speed: the vectorised `deepseek` policy against the plain-loop rendering of the same algorithm
  (`placement.policies.deepseek_reference`), timed in this process; the ratio is the figure to quote;
- imbalance in a rolling replay (refit every --every steps on the last --window steps): each placement scored
  on the window it was fitted on ("fitted") and on the steps that follow ("held-out"), under static and dynamic
  routing, with the lower bound beside each.

Usage: python scripts/bench_placement.py [--steps 500] [--every 50] [--window 50] [--json out.json] [--quick]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placement import ClusterSpec, rolling_replay  # noqa: E402
from placement.policies.deepseek import deepseek_rebalance  # noqa: E402
from placement.policies.deepseek_reference import reference_rebalance  # noqa: E402
from traces.synthetic import SyntheticConfig, generate_trace  # noqa: E402

CLUSTERS = [ClusterSpec(num_gpus=64, slots_per_gpu=5), ClusterSpec(num_gpus=128, slots_per_gpu=3)]
LAYER_COUNTS = [58, 61]
TOKENS_PER_STEP = 8192


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


def bench_quality(counts_TLE: np.ndarray, cluster: ClusterSpec, policy: str, every: int, window: int) -> list[dict]:
    """Rolling replay under both routings: each placement scored on its own window (fitted) and on the next."""
    rows = []
    for routing in ("static", "dynamic"):
        replay = rolling_replay(counts_TLE, cluster, policy, every, window, routing)
        for fit, scores in (("fitted", replay.fitted), ("held-out", replay.held_out)):
            summary = scores.summary()
            rows.append({"policy": policy, "routing": routing, "fit": fit,
                         **{k: summary[k] for k in ("imbalance_mean", "imbalance_p99", "imbalance_max",
                                                    "lower_bound")}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500, help="steps of each synthetic trace (default 500)")
    parser.add_argument("--every", type=int, default=50, help="rolling replay: refit every N steps (default 50)")
    parser.add_argument("--window", type=int, default=50, help="rolling replay: fit on the last W steps (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats of the loop baseline (default 3)")
    parser.add_argument("--json", default=None, help="also write all results to this JSON file")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke run")
    args = parser.parse_args(argv)
    layer_counts, clusters, steps = LAYER_COUNTS, CLUSTERS, args.steps
    if args.quick:
        layer_counts, steps = [4], 3 * args.window
    results = []
    for num_layers in layer_counts:
        trace = generate_trace(SyntheticConfig(num_steps=steps, num_layers=num_layers, tokens_per_step=TOKENS_PER_STEP))
        for cluster in clusters:
            shape = f"{num_layers}x256 on {cluster.num_gpus}x{cluster.slots_per_gpu}"
            speed = bench_speed(trace.load_LE().astype(float), cluster, args.repeats)
            print(f"{shape}: deepseek vectorised {speed['vectorised_ms']:.1f} ms, loop {speed['loop_ms']:.0f} ms, "
                  f"speed-up x{speed['speedup']:.0f}, identical output: {speed['identical']}", flush=True)
            rows = bench_quality(trace.counts_TLE, cluster, "deepseek", args.every, args.window)
            results.append({"shape": shape, "layers": num_layers, "gpus": cluster.num_gpus,
                            "slots_per_gpu": cluster.slots_per_gpu, "speed": speed, "quality": rows})
    print()
    print("| shape | policy | routing | fit | mean | p99 | max | lower bound |")
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        for r in result["quality"]:
            print(f"| {result['shape']} | {r['policy']} | {r['routing']} | {r['fit']} | {r['imbalance_mean']:.3f} | "
                  f"{r['imbalance_p99']:.3f} | {r['imbalance_max']:.3f} | {r['lower_bound']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
