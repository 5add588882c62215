"""What imbalance and time does each deterministic work budget give, at production's shapes and callers?

Two callers, each on one core of this machine (the process pins itself to CPU 0), at each `--work-limits` value:

- the drop-in adapters (`rebalance_experts(..., "cpsat", work_limit=W)`, what `CpsatEplbPolicy` runs on every vLLM
  rank): DeepSeek-V3's full shape, 58 layers x 256 experts, at 144 GPUs x 2 slots (EP144 decode, 256 + 32) and
  72 x 4 (EP72), and 61 layers at 96 x 4 (384 slots, the largest the issue names); the load is the sum of a
  100-step synthetic window (top-8, 128 tokens a GPU), scored under equal split (what vLLM and SGLang route):
  max / mean GPU load of that load, mean over layers, beside DeepSeek's greedy (the same call with
  policy="deepseek") and the equal-split lower bound (`placement.bounds`);
- vLLM's call as vLLM makes it, with the map now serving (`CpsatEplbPolicy.rebalance_experts(weight, P, 1, 1, G,
  old)` at its default budget): at the adapter shapes, the old map fitted on the window before, whole and with 10%
  and 30% of its slots unused (-1, scattered at random), beside the same call with no old map;
- `fit_placement("cpsat", ..., work_limit=W, workers=1)` under dynamic routing, on 8 layers of the same window at
  144 x 2 and 72 x 4: the fitted objective (mean over the window's steps of max / mean under the best split) beside
  the greedy's and the lower bound, and the seconds.

Seconds are wall clock around the call, the best of `--repeats`; the maps do not depend on them (every call at one
W returns the same map: the script checks it). Usage: python scripts/bench_work_budget.py [--work-limits 0.25 1 4
16] [--repeats 2] [--quick] [--json out.json]
"""

import os
import sys
import time

import numpy as np
import torch

from eplb import CpsatEplbPolicy, rebalance_experts
from eplb.cli.arg_types import integer, number
from eplb.cli.bench_harness import bench_parser, cell, finish, markdown_table
from placement import ClusterSpec, Placement, fit_placement, score_placement
from placement.bounds import imbalance_lower_bound
from placement.scoring import static_gpu_loads
from traces.synthetic import SyntheticConfig, generate_trace

ADAPTER_SHAPES = ((58, 144, 2), (58, 72, 4), (61, 96, 4))  # layers, GPUs, slots per GPU
FIT_SHAPES = ((8, 144, 2), (8, 72, 4))
QUICK_ADAPTER_SHAPES = ((8, 144, 2),)
QUICK_FIT_SHAPES = ((2, 72, 4),)
TOKENS_PER_GPU = 128
WINDOW = 100
UNUSED_SHARES = (0.0, 0.1, 0.3)  # of the old map's slots set to -1 in the old-map rows


def window(layers: int, gpus: int) -> np.ndarray:
    """[100, L, 256] synthetic counts, top-8, 128 tokens a GPU a step."""
    return generate_trace(SyntheticConfig(num_steps=WINDOW, num_layers=layers, num_experts=256, top_k=8,
                                          tokens_per_step=gpus * TOKENS_PER_GPU, seed=layers + gpus)).counts_TLE


def timed(call, repeats: int, key=np.asarray):
    """(result of the first call, best seconds), checking every call returned the same map (`key` of a result)."""
    results, seconds = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        results.append(call())
        seconds.append(time.perf_counter() - began)
    for other in results[1:]:
        if not np.array_equal(key(other), key(results[0])):
            raise SystemExit("bench_work_budget: two calls at one work limit returned different maps")
    return results[0], min(seconds)


def equal_split_imbalance(phy2log_LP: np.ndarray, load_LE: np.ndarray, cluster: ClusterSpec) -> float:
    loads = static_gpu_loads(load_LE[None].astype(np.float64),
                             Placement.equal_split(phy2log_LP, cluster, load_LE.shape[1]))[0]
    return float((loads.max(axis=-1) / loads.mean(axis=-1)).mean())


def adapter_rows(shapes, work_limits, repeats: int) -> list[dict]:
    rows = []
    for layers, gpus, slots in shapes:
        load_LE = window(layers, gpus).sum(axis=0)
        weight = torch.from_numpy(load_LE)
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots)
        bound = float(imbalance_lower_bound(load_LE.astype(np.float64), gpus * slots, gpus).mean())
        greedy, greedy_s = timed(lambda: rebalance_experts(weight, gpus * slots, 1, 1, gpus)[0].numpy(), repeats)
        base = {"caller": "rebalance_experts (equal split)", "shape": f"{layers} x 256 on {gpus} x {slots}",
                "greedy": equal_split_imbalance(greedy, load_LE, cluster), "greedy_seconds": greedy_s,
                "bound": bound}
        for work in work_limits:
            fitted, seconds = timed(lambda: rebalance_experts(weight, gpus * slots, 1, 1, gpus, "cpsat",
                                                              work_limit=work)[0].numpy(), repeats)
            rows.append({**base, "work_limit": work, "seconds": seconds,
                         "imbalance": equal_split_imbalance(fitted, load_LE, cluster)})
            print(f"{rows[-1]['shape']} W={work:g}: {seconds:.2f} s, {rows[-1]['imbalance']:.4f} (greedy "
                  f"{base['greedy']:.4f}, bound {bound:.4f})", file=sys.stderr, flush=True)
    return rows


def old_map_rows(shapes, repeats: int) -> list[dict]:
    """vLLM's policy call with the serving map (see the module docstring), seconds beside the call without it."""
    rows = []
    for layers, gpus, slots in shapes:
        old_weight = torch.from_numpy(window(layers, gpus + 1).sum(axis=0))  # the window before: other traffic
        weight = torch.from_numpy(window(layers, gpus).sum(axis=0))
        serving = CpsatEplbPolicy.rebalance_experts(old_weight, gpus * slots, 1, 1, gpus)
        _, fresh = timed(lambda: CpsatEplbPolicy.rebalance_experts(weight, gpus * slots, 1, 1, gpus).numpy(), repeats)
        generator = torch.Generator().manual_seed(layers + gpus)
        for unused in UNUSED_SHARES:
            old = serving.clone()
            old[torch.rand(old.shape, generator=generator) < unused] = -1
            _, seconds = timed(lambda: CpsatEplbPolicy.rebalance_experts(weight, gpus * slots, 1, 1, gpus,
                                                                         old).numpy(), repeats)
            rows.append({"caller": "CpsatEplbPolicy (vLLM) with the serving map", "shape": f"{layers} x 256 on "
                         f"{gpus} x {slots}", "unused_share": unused, "seconds": seconds,
                         "seconds_without_old_map": fresh})
            print(f"vLLM policy {rows[-1]['shape']}, {unused:.0%} of the old map unused: {seconds:.2f} s (no old "
                  f"map {fresh:.2f} s)", file=sys.stderr, flush=True)
    return rows


def old_map_table(rows: list[dict]) -> str:
    return markdown_table(
        ("caller", "shape", "old map's slots unused", "seconds (one core)", "without an old map"),
        ((row["caller"], row["shape"], f"{row['unused_share']:.0%}", f"{row['seconds']:.2f}",
          f"{row['seconds_without_old_map']:.2f}") for row in rows))


def fit_rows(shapes, work_limits, repeats: int) -> list[dict]:
    rows = []
    for layers, gpus, slots in shapes:
        counts_TLE = window(layers, gpus)
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots)
        for work in work_limits:
            placement, seconds = timed(lambda: fit_placement("cpsat", counts_TLE, cluster, work_limit=work,
                                                             workers=1), repeats, key=lambda p: p.phy2log_LP)
            info = placement.info
            greedy = fit_placement("deepseek", counts_TLE, cluster)
            rows.append({"caller": "fit_placement (dynamic)", "shape": f"{layers} x 256 on {gpus} x {slots}",
                         "work_limit": work, "seconds": seconds,
                         "imbalance": score_placement(placement, counts_TLE, "dynamic").imbalance_TL.mean(),
                         "greedy": score_placement(greedy, counts_TLE, "dynamic").imbalance_TL.mean(),
                         "bound": info["fitted_bound_mean"], "levels": info["levels"]})
            print(f"fit {rows[-1]['shape']} W={work:g}: {seconds:.2f} s, {rows[-1]['imbalance']:.4f}",
                  file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    return markdown_table(
        ("caller", "shape", "work limit", "seconds (one core)", "imbalance", "greedy", "bound"),
        ((row["caller"], row["shape"], f"{row['work_limit']:g}", f"{row['seconds']:.2f}", f"{row['imbalance']:.4f}",
          cell(row["greedy"], ".4f"), f"{row['bound']:.4f}") for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--work-limits", type=number(0, low_open=True, high=1e6), nargs="+",
                        default=[0.25, 1.0, 4.0, 16.0])
    parser.add_argument("--repeats", type=integer(1, 100), default=2,
                        help="calls per work limit (the best time is kept)")
    parser.add_argument("--quick", action="store_true", help="one small shape per caller (a smoke run)")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    rows = adapter_rows(QUICK_ADAPTER_SHAPES if args.quick else ADAPTER_SHAPES, args.work_limits, args.repeats)
    rows += fit_rows(QUICK_FIT_SHAPES if args.quick else FIT_SHAPES, args.work_limits, args.repeats)
    old_rows = old_map_rows(QUICK_ADAPTER_SHAPES if args.quick else ADAPTER_SHAPES, args.repeats)
    return finish(args.json, rows + old_rows, table(rows), old_map_table(old_rows))

if __name__ == "__main__":
    sys.exit(main())
