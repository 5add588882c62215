"""Live demo: a W-process Gloo EP group runs MoE decode layers with this project's placement and replica routing.

It synthesises skewed, drifting routing traffic (`traces.synthetic`), fits a `cpsat` placement on the first
--fit-steps steps, then runs --steps decode steps on W processes: every layer gates its tokens (the gate follows
the synthetic traffic), picks replicas inside the group (--routing), dispatches and combines over Gloo, and checks
its output against the dense single-process layer. It prints, last, one JSON object under --json with: steps,
world_size, routing, max_abs_err_vs_dense, imbalance_measured (max / mean of the rows each rank computed, mean over
steps and layers), imbalance_planned (the same from the quotas), tokens_lost, seconds_per_step_mean, placement.

Usage: python scripts/live_demo.py [--world-size 4] [--steps 20] [--routing dynamic] [--layers 2] [--json]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectives import run_local_group  # noqa: E402
from eplb.live import ROUTING_MODES, MoELayerConfig  # noqa: E402
from eplb.live.synthetic_decode import DecodeSetup, run_decode_loop, summarize  # noqa: E402
from placement import ClusterSpec, fit_placement  # noqa: E402
from traces.synthetic import SyntheticConfig, generate_trace  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=4, help="W: ranks (one per GPU) in the EP group")
    parser.add_argument("--steps", type=int, default=20, help="decode steps to run (default 20)")
    parser.add_argument("--routing", default="dynamic", choices=ROUTING_MODES, help="replica choice (default dynamic)")
    parser.add_argument("--layers", type=int, default=2, help="MoE layers (default 2)")
    parser.add_argument("--experts", type=int, default=32, help="E: routed experts per layer (default 32)")
    parser.add_argument("--top-k", type=int, default=4, help="K: experts per token (default 4)")
    parser.add_argument("--slots-per-gpu", type=int, default=None, help="S (default E / W + 2)")
    parser.add_argument("--tokens-per-step", type=int, default=256, help="tokens of the whole group per step")
    parser.add_argument("--hidden-size", type=int, default=64, help="D (>= experts; default 64)")
    parser.add_argument("--fit-steps", type=int, default=30, help="steps the placement is fitted on (default 30)")
    parser.add_argument("--time-limit", type=float, default=2.0, help="cpsat budget, seconds (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of traffic and weights (default 0)")
    parser.add_argument("--timeout", type=float, default=30.0, help="each collective's timeout, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object last, nothing else")
    args = parser.parse_args(argv)
    if args.hidden_size < args.experts:
        parser.error("--hidden-size must be >= --experts (the gate reads the first E dimensions)")
    slots = args.slots_per_gpu or args.experts // args.world_size + 2
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
                              deadline_s=60 + 10 * args.steps)
    result = {**summarize(reports, args.routing),
              "placement": {"policy": "cpsat", "gpus": args.world_size, "slots_per_gpu": slots}}
    if not args.json:
        print(f"{args.world_size} ranks x {slots} slots, {args.layers} layers x {args.experts} experts, "
              f"top-{args.top_k}, {args.tokens_per_step} tokens per step, routing {args.routing}:")
        for key in ("imbalance_measured", "imbalance_planned", "max_abs_err_vs_dense", "tokens_lost",
                    "seconds_per_step_mean"):
            print(f"  {key}: {result[key]:.6g}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
