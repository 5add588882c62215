"""Benchmark of the live decode layer on a W-process Gloo group, at the live demo's shape.

1. Per-step cost of the layer with load recording and dynamic routing, against the same layer with static routing
   and no recorder (the cheapest way to run it), measured in the same processes, variants interleaved, several
   repeats after a warm-up; the median seconds per decode step (all layers) of the slowest rank. The replica choice
   runs compiled, as a decode worker runs it (`--eager` to compare).
2. Imbalance measured in the loop (max / mean of the rows each rank computed) for each routing mode, on the same
   traffic and placement.
The router's time per layer at the full shape (256 experts, 64x5 and 128x3) is `scripts/bench_router.py`.

Usage: python scripts/bench_live.py [--world-size 4] [--steps 30] [--repeats 5] [--quick]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectives import run_local_group  # noqa: E402
from eplb.live import MoELayerConfig  # noqa: E402
from eplb.live.synthetic_decode import DecodeSetup, run_decode_loop, summarize  # noqa: E402
from placement import ClusterSpec, fit_placement  # noqa: E402
from traces.synthetic import SyntheticConfig, generate_trace  # noqa: E402

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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30, help="decode steps per run (default 30)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each variant (default 5)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--tokens-per-step", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--eager", action="store_true", help="run the replica choice eagerly (default: compiled)")
    parser.add_argument("--quick", action="store_true", help="tiny run, for a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 3, 1
    slots = args.experts // args.world_size + 2
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
                              deadline_s=120 + 5 * args.steps * args.repeats * len(VARIANTS))
    print(f"{args.world_size} Gloo ranks x {slots} slots, {args.layers} layers x {args.experts} experts, "
          f"top-{args.top_k}, {args.tokens_per_step} tokens per step, D={args.hidden_size}; {args.steps} steps x "
          f"{args.repeats} repeats\n")
    print("| variant | ms per step (median of repeats, slowest rank) | vs static, no recorder | imbalance measured |")
    print("|---|---|---|---|")
    base = None
    for name, (routing, _) in VARIANTS.items():
        per_repeat = [max(np.median(rank[name][r].seconds_per_step) for rank in by_rank) for r in range(args.repeats)]
        median = float(np.median(per_repeat))
        base = base or median
        imbalance = summarize([rank[name][0] for rank in by_rank], routing)["imbalance_measured"]
        print(f"| {name} | {median * 1e3:.2f} | {median / base - 1:+.1%} | {imbalance:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
