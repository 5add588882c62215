"""Benchmark and fidelity checks of the simulator (`eplb sim`).

1. Speed: the 1-hour Mooncake conversation trace (12,031 requests) through one 128-card decode unit and its
   prefill nodes: simulated seconds per wall second (goal: the hour in under 30 s on 2 cores). Skipped when the
   data is absent.
2. Decode balance: the same traffic (single turns with long replies, so the batch grows to tens of sequences per
   card) through one decode unit whose experts are placed by no policy
   (one replica per expert), DeepSeek's greedy and `cpsat`: MoE imbalance, the MoE share of a step, decode tokens
   per second per card and TPOT; the gain against "none" beside what the cost model predicts for a step at the
   run's mean batch and KV with each policy's imbalance and redundant experts (`sim.costs.decode_step`).
3. The three sliding-window designs on multi-turn traffic: prefill decoder FLOPs against full recompute and the disk
   each needs.

Usage: python scripts/bench_sim.py [--quick] [--section all|speed|balance|windows]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim import SimConfig, load_sim_config, run_simulation  # noqa: E402
from sim.costs import decode_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "sim" / "configs" / "mooncake-conversation.yaml"
SATURATED = {  # single turns with long replies: the decode unit's batch grows to ~80 sequences per card
    "duration_s": 150.0,
    "workload": {"synthetic": {"sessions_per_s": 300.0, "agent_share": 0.0, "images_per_request": 0.0,
                               "turns_mean": {"chat": 1.0, "agent": 1.0},
                               "first_input_tokens": {"chat": 1000.0, "agent": 1000.0},
                               "output_tokens": {"chat": 2000.0, "agent": 2000.0}}},
    "cluster": {"prefill_nodes": 8, "decode_cards": 128},
}
WINDOWS = {  # multi-turn traffic over long enough that some turns come back after the window state's 180 s
    "duration_s": 900.0,
    "workload": {"synthetic": {"sessions_per_s": 2.0, "images_per_request": 0.0,
                               "think_time_s": {"chat": 120.0, "agent": 60.0}}},
    "cluster": {"prefill_nodes": 4, "decode_cards": 64},
}


def speed() -> None:
    config = load_sim_config(MOONCAKE)
    if not Path(config.workload.trace).is_file():
        print(f"speed: skipped, {config.workload.trace} is absent")
        return
    began = time.perf_counter()
    _, report = run_simulation(config)
    wall = time.perf_counter() - began
    print(f"speed: Mooncake conversation, {report['requests']:,} requests, {report['simulated_seconds']:.0f} s "
          f"simulated in {wall:.1f} s ({report['sim_seconds_per_wall_second']:.0f}x), {report['decode_steps']:,} "
          f"decode steps; disk hits {report['disk_cache_hit_rate']:.1%}, window hits "
          f"{report['window_cache_hit_rate']:.1%}")


def balance(quick: bool) -> None:
    print("\n| policy | decode imbalance | MoE share of a step | mean batch per card | decode tok/s per card | "
          "TPOT p50 ms | gain vs none | cost model at the mean batch |")
    print("|---|---|---|---|---|---|---|---|")
    reports, configs = {}, {}
    for policy in ("none", "deepseek", "cpsat"):
        data = SimConfig.model_validate(SATURATED).model_dump()
        data["balance"].update(policy=policy, time_limit_s=1.0 if quick else 2.0)
        if quick:
            data["duration_s"] = 20.0
        configs[policy] = config = SimConfig.model_validate(data)
        reports[policy] = report = run_simulation(config)[1]
        none = reports["none"]
        gain = report["decode_tokens_per_s_per_card"] / none["decode_tokens_per_s_per_card"] - 1
        batch, kv = round(none["decode_batch_mean"]), round(none["decode_kv_tokens_mean"])
        predicted = (decode_step(configs["none"], batch, kv, none["decode_imbalance_mean"])[0]
                     / decode_step(config, batch, kv, report["decode_imbalance_mean"])[0] - 1)
        cards = config.cluster.decode_cards
        print(f"| {policy} | {report['decode_imbalance_mean']:.3f} | {report['decode_moe_share_mean']:.1%} | "
              f"{report['decode_batch_mean'] / cards:.1f} | {report['decode_tokens_per_s_per_card']:,.0f} | "
              f"{report['tpot_p50_s'] * 1e3:.1f} | {gain:+.1%} | {predicted:+.1%} |")


def windows(quick: bool) -> None:
    data = SimConfig.model_validate(WINDOWS).model_dump()
    if quick:
        data["duration_s"] = 200.0
    report = run_simulation(SimConfig.model_validate(data))[1]
    print(f"\nwindows: {report['requests']:,} requests, disk hits {report['disk_cache_hit_rate']:.1%}, window state "
          f"found in memory for {report['window_cache_hit_rate'] / max(report['disk_cache_hit_rate'], 1e-9):.0%} of "
          f"the cached tokens")
    print("| design | prefill decoder FLOPs vs full recompute | disk needed |")
    print("|---|---|---|")
    for design, figures in report["window_designs"].items():
        print(f"| {design} | {figures['flops_vs_full_recompute']:.1%} | {figures['disk_bytes_needed'] / 1e12:.2f} TB |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", default="all", choices=("all", "speed", "balance", "windows"))
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    args = parser.parse_args(argv)
    if args.section in ("all", "speed") and not args.quick:
        speed()
    if args.section in ("all", "balance"):
        balance(args.quick)
    if args.section in ("all", "windows"):
        windows(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
