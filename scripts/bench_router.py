"""Benchmark the live dynamic router on the full shape: 256 experts, 64x5 and 128x3 GPUs, 8,192 tokens per step.

For each shape it times, in this process, one layer's routing of one step:
- `route_step` (the live router, torch, whole tokens) with its default rounds,
- the static split (tokens times fixed weights, rounded), the baseline a router replaces,
- the exact optimum by an LP (scipy HiGHS), the quality reference;
and reports the busiest GPU of the router relative to the LP optimum and to the static split.

Usage: python scripts/bench_router.py [--steps 50] [--threads 1]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placement import ClusterSpec, fit_placement  # noqa: E402
from placement.dynamic_router import DEFAULT_ROUNDS, LayerRoutingTable, route_step  # noqa: E402
from placement.exact_split import exact_max_load  # noqa: E402
from traces.synthetic import SyntheticConfig, generate_trace  # noqa: E402


def lp_optimum(counts_E: np.ndarray, phy2log_P: np.ndarray, slots: int, num_gpus: int) -> float:
    return exact_max_load(counts_E, phy2log_P, np.arange(len(phy2log_P)) // slots, num_gpus)


def per_call(fn, calls: int) -> float:
    fn()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - began) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="steps routed per shape (default 50)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as a worker's side)")
    parser.add_argument("--policy", default="cpsat", help="placement to route on (default cpsat)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    trace = generate_trace(SyntheticConfig(num_steps=60 + args.steps, num_layers=1, tokens_per_step=8192))
    print("| cluster | policy | router | static split | exact LP | router / LP | static / LP |")
    print("|---|---|---|---|---|---|---|")
    for cluster in (ClusterSpec(num_gpus=64, slots_per_gpu=5), ClusterSpec(num_gpus=128, slots_per_gpu=3)):
        options = {"time_limit_s": 5.0, "routing": "dynamic"} if args.policy == "cpsat" else {}
        placement = fit_placement(args.policy, trace.counts_TLE[:60], cluster, **options)
        phy2log, weights = placement.phy2log_LP[0], placement.weights_LP[0]
        table = LayerRoutingTable.build(phy2log, cluster.slots_per_gpu, 256, weights_P=weights)
        weights_t = torch.as_tensor(weights, dtype=torch.float32)
        phy2log_t = torch.as_tensor(phy2log)
        steps = trace.counts_TLE[60:, 0]
        router_max, static_max, lp_max = [], [], []
        for counts in steps:
            counts_t = torch.as_tensor(counts)
            tokens = route_step(counts_t, table)
            router_max.append(tokens.view(cluster.num_gpus, -1).sum(1).max().item())
            static = (counts_t[phy2log_t] * weights_t).round()
            static_max.append(static.view(cluster.num_gpus, -1).sum(1).max().item())
            lp_max.append(lp_optimum(counts.astype(float), phy2log, cluster.slots_per_gpu, cluster.num_gpus))
        counts_t = torch.as_tensor(steps[0])
        t_router = per_call(lambda: route_step(counts_t, table), 200)
        t_static = per_call(lambda: (counts_t[phy2log_t] * weights_t).round(), 200)
        t_lp = per_call(lambda: lp_optimum(steps[0].astype(float), phy2log, cluster.slots_per_gpu,
                                           cluster.num_gpus), 5)
        lp = np.array(lp_max)
        print(f"| {cluster.num_gpus}x{cluster.slots_per_gpu} | {args.policy} | {t_router * 1e3:.2f} ms "
              f"({DEFAULT_ROUNDS} rounds) | {t_static * 1e3:.3f} ms | {t_lp * 1e3:.1f} ms | "
              f"{np.mean(np.array(router_max) / lp):.4f} | {np.mean(np.array(static_max) / lp):.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
