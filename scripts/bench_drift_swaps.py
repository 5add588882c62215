"""What a patch's drift swaps cost at the full shape: the bounded search against scoring every candidate pair on
every arc, in the same process, on the same layers.

Per cluster (64 GPUs x 5 slots and 128 x 3 by default; 61 layers x 256 experts, top-8, 128 tokens per GPU a step,
`traces.synthetic`'s drifting trace with bursts): `cpsat` fitted with the `RebalanceConfig` defaults (4 s budget,
good_enough 1.001, dynamic routing) on steps [0, W), then each ring layer's drift swaps (`placement.drift_swaps`, up
to `patches.drift_swaps` per layer) toward the mean of the `patches.drift_window` steps ending `--later` steps after the
window, as a patch that long after the fit sees them:

- bounded: `drift_swaps.swap_layer`, what every patch runs (`_Ring.best_swap`: bounds, then exact scores in their
  order);
- exhaustive (the baseline): the same swaps, each chosen by scoring every pair `_Ring.candidates` offers on every
  arc (`_Ring._exact_scores` without a floor) and taking the best that clears `MIN_GAIN`.

Reported per cluster: seconds per layer of each (the median of `--repeats` runs), their ratio, the experts whose
arcs the swaps changed, the layers on which the two chose other slot maps (0 unless two pairs score the same to the
last bit), and the mean objective (the busiest arc with its noise margin, `_Ring.values`) before and after.

Usage: python scripts/bench_drift_swaps.py [--gpus 64 128] [--slots-per-gpu 5 3] [--later 100] [--repeats 3]
       [--quick] [--json FILE]
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer, json_output
from eplb.cli.main import OneLineParser
from eplb.rebalance.config import RebalanceConfig
from placement import ClusterSpec, fit_placement
from placement.cluster import MAX_GPUS, MAX_SLOTS, MAX_SLOTS_PER_GPU
from placement.drift_swaps import MIN_GAIN, _Ring, ring_spans, swap_layer
from traces.atomic_file import write_text_atomically
from traces.synthetic import SyntheticConfig, generate_trace

FULL = {"layers": 61, "experts": 256, "top_k": 8, "window": 100}
QUICK = {"layers": 4, "experts": 32, "top_k": 4, "window": 20}
TOKENS_PER_GPU = 128
MAX_LATER = 10_000  # the full shape's trace, window and later steps, stays within the synthetic trace's limit


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=integer(1, MAX_GPUS), nargs="+", default=[64, 128], help="GPUs of each cluster")
    parser.add_argument("--slots-per-gpu", type=integer(1, MAX_SLOTS_PER_GPU), nargs="+", default=[5, 3],
                        help="slots per GPU of each cluster")
    parser.add_argument("--later", type=integer(0, MAX_LATER), default=100,
                        help="steps after the fit window that the swaps' window ends")
    parser.add_argument("--repeats", type=integer(1, 1000), default=3,
                        help="timed runs of each search (the median is reported)")
    parser.add_argument("--seed", type=integer(0, SEED_MAX), default=0)
    parser.add_argument("--quick", action="store_true", help="a small shape (4 layers x 32 experts), for tests")
    parser.add_argument("--json", type=json_output(), default=None, help="also write the rows to this file")
    return parser


def exhaustive_best_swap(ring: _Ring) -> tuple[int, int] | None:
    """The swap `_Ring.best_swap` finds, found by scoring every candidate pair on every arc (the baseline)."""
    value_GO = ring.values()
    hot, cold = ring.candidates(value_GO)
    a_B, b_B = np.repeat(hot, len(cold)), np.tile(cold, len(hot))
    colder = ring.load_E[a_B] > ring.load_E[b_B]
    a_B, b_B = a_B[colder], b_B[colder]
    if not len(a_B):
        return None
    scores_B = np.concatenate([ring._exact_scores(a_B[i:i + 32], b_B[i:i + 32]) for i in range(0, len(a_B), 32)])
    best = int(np.argmin(scores_B))
    if scores_B[best] > float(value_GO.max()) - MIN_GAIN:
        return None
    return int(a_B[best]), int(b_B[best])


def exhaustive_swap_layer(phy2log_P: np.ndarray, load_E: np.ndarray, num_gpus: int, slots_per_gpu: int,
                          max_swaps: int) -> np.ndarray:
    """`swap_layer` with each swap chosen by `exhaustive_best_swap`."""
    return swap_layer(phy2log_P, load_E, num_gpus, slots_per_gpu, max_swaps, choose=exhaustive_best_swap)


def objective(phy2log_P: np.ndarray, load_E: np.ndarray, num_gpus: int, slots_per_gpu: int) -> float:
    """The layer's busiest arc with its noise margin over the mean (what the swaps lower)."""
    start_E, length_E = ring_spans(phy2log_P, len(load_E), num_gpus, slots_per_gpu)
    return float(_Ring(start_E, length_E, load_E, num_gpus).values().max())


def timed_layers(search, layers: list[tuple[np.ndarray, np.ndarray]], num_gpus: int, slots: int, swaps: int,
                 repeats: int) -> tuple[list[np.ndarray], float]:
    """(slot maps after the swaps, median seconds per layer over `repeats` runs)."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        out = [search(phy2log_P, load_E, num_gpus, slots, swaps) for phy2log_P, load_E in layers]
        seconds.append((time.perf_counter() - began) / len(layers))
    return out, statistics.median(seconds)


def measure_cluster(num_gpus: int, slots: int, shape: dict, later: int, repeats: int, seed: int) -> dict:
    config = RebalanceConfig()
    window = shape["window"]
    stop = window + later
    trace = generate_trace(SyntheticConfig(num_steps=stop, num_layers=shape["layers"], num_experts=shape["experts"],
                                           top_k=shape["top_k"], tokens_per_step=TOKENS_PER_GPU * num_gpus,
                                           seed=seed))
    cluster = ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots)
    fit = fit_placement("cpsat", trace.counts_TLE[:window], cluster, time_limit_s=config.time_limit_s,
                        routing=config.routing, workers=config.solve_threads, good_enough=config.good_enough)
    drift_LE = trace.counts_TLE[stop - config.patches.drift_window:stop].mean(axis=0).astype(np.float64)
    layers = [(fit.phy2log_LP[layer], drift_LE[layer]) for layer in range(shape["layers"])
              if ring_spans(fit.phy2log_LP[layer], shape["experts"], num_gpus, slots) is not None]
    bounded, bounded_s = timed_layers(swap_layer, layers, num_gpus, slots, config.patches.drift_swaps, repeats)
    exhaustive, exhaustive_s = timed_layers(exhaustive_swap_layer, layers, num_gpus, slots, config.patches.drift_swaps,
                                            repeats)
    moved = sum(len(np.unique(before[after != before])) for (before, _), after in zip(layers, bounded))
    return {"gpus": num_gpus, "slots_per_gpu": slots, "layers": len(layers), "later": later,
            "bounded_ms_per_layer": round(bounded_s * 1000, 3),
            "exhaustive_ms_per_layer": round(exhaustive_s * 1000, 3),
            "speedup": round(exhaustive_s / bounded_s, 2), "experts_moved": moved,
            "layers_chosen_otherwise": sum(not np.array_equal(a, b) for a, b in zip(bounded, exhaustive)),
            "objective_before": float(np.mean([objective(p, load, num_gpus, slots) for p, load in layers])),
            "objective_after": float(np.mean([objective(p, load, num_gpus, slots)
                                              for p, (_, load) in zip(bounded, layers)]))}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.gpus) != len(args.slots_per_gpu):
        parser.error("--gpus and --slots-per-gpu need as many values each")
    shape = QUICK if args.quick else FULL
    if not all(shape["experts"] <= gpus * slots <= MAX_SLOTS for gpus, slots in zip(args.gpus, args.slots_per_gpu)):
        parser.error(f"each cluster's --gpus x --slots-per-gpu must be in [{shape['experts']}, {MAX_SLOTS}] slots "
                     f"(a slot for every expert)")
    rows = [measure_cluster(gpus, slots, shape, args.later, args.repeats, args.seed)
            for gpus, slots in zip(args.gpus, args.slots_per_gpu)]
    print(f"{shape['layers']} layers x {shape['experts']} experts, top-{shape['top_k']}, {TOKENS_PER_GPU} tokens per "
          f"GPU a step; swaps toward the steps ending {args.later} after the fit window")
    print("| GPUs x slots | ring layers | bounded ms / layer | exhaustive ms / layer | speedup | experts moved "
          "| layers chosen otherwise | objective before | after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['gpus']} x {row['slots_per_gpu']} | {row['layers']} | {row['bounded_ms_per_layer']:.2f} | "
              f"{row['exhaustive_ms_per_layer']:.2f} | x{row['speedup']:.1f} | {row['experts_moved']} | "
              f"{row['layers_chosen_otherwise']} | {row['objective_before']:.4f} | {row['objective_after']:.4f} |")
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
