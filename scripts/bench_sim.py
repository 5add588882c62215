"""How fast is the simulator (`eplb sim`), and does it reproduce the balance, window and fleet figures it claims?

1. Speed: the 1-hour Mooncake conversation trace through one 128-card decode unit and its prefill nodes:
   simulated seconds per wall second. Skipped when the data is absent.
2. Decode balance: the same traffic (single turns with long replies, so the batch grows to tens of sequences per
   card) through one decode unit whose experts are placed by no policy
   (one replica per expert), DeepSeek's greedy and `cpsat`: MoE imbalance, the MoE share of a step, decode tokens
   per second per card and TPOT; the gain against "none" beside what the cost model predicts for a step at the
   run's mean batch and KV with each policy's imbalance and redundant experts (`sim.stage_costs.decode_step`).
3. The three sliding-window designs on multi-turn traffic: prefill decoder FLOPs against full recompute and the disk
   each needs.
4. The fleet run (`--section fleet`): DeepSeek's published Feb-2025 day beside what the autoscaled fleet
   reproduces; the autoscaled fleet against a fixed split of the same node-hours; faults handled by rerouting
   (with and without spares) against restarting the unit; the seed's fleet (sim/configs/seed-fleet-day.yaml) and
   what it implies, and the same day under quotas from above its peak to below it; what each capacity and
   retention buys the prefix store on both days; its wall time for a day and a week; and the agreement of the
   fleet model (units from the cost model, token rates per step) with the request-by-request run where both run
   (one decode unit and its prefill nodes, the saturated traffic of section 2).

Usage: python scripts/bench_sim.py [--quick] [--section all|speed|balance|windows|fleet]
"""

import math
import sys
import time
from pathlib import Path

import numpy as np

from eplb.cli.bench_harness import bench_parser
from sim import SimConfig, load_sim_config, run_simulation
from sim.fleet.config import FleetConfig
from sim.fleet.prefix_store import fleet_store, store_of, store_state
from sim.fleet.run import run_fleet
from sim.fleet.unit_capacity import unit_capacity
from sim.stage_costs import decode_step

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "sim" / "configs" / "mooncake-conversation.yaml"
FEB_DAY = ROOT / "sim" / "configs" / "deepseek-feb2025-day.yaml"
SEED_DAY = ROOT / "sim" / "configs" / "seed-fleet-day.yaml"
STRESS = 50.0  # failure-rate multiplier of the faults table: tens of failures in a day
# DeepSeek's published Feb-2025 day, which the fleet run is compared with (sim/configs/deepseek-feb2025-day.yaml)
PUBLISHED_FEB = {"nodes_mean": 226.75, "nodes_peak": 278, "cost_usd": 87_072, "revenue_usd": 562_027}
SEED_USD_PER_CARD_HOUR = 38.0  # the seed fleet's revenue per card-hour at valley pricing, as its post states


def _single_turns(duration_s: float, sessions_per_s: float, prompt: float, reply: float, prefill_nodes: int,
                  decode_cards: int) -> dict:
    """A config of single-turn chat requests, no images: one decode unit and its prefill nodes."""
    return {"duration_s": duration_s,
            "workload": {"synthetic": {"sessions_per_s": sessions_per_s, "agent_share": 0.0, "images_per_request": 0.0,
                                       "turns_mean": {"chat": 1.0, "agent": 1.0},
                                       "first_input_tokens": {"chat": prompt, "agent": prompt},
                                       "output_tokens": {"chat": reply, "agent": reply}}},
            "cluster": {"prefill_nodes": prefill_nodes, "decode_cards": decode_cards}}


# long replies: the decode unit's batch grows to tens of sequences per card
SATURATED = _single_turns(150.0, 300.0, 1000.0, 2000.0, prefill_nodes=8, decode_cards=128)
# short replies on a 16-card unit: decode saturates within seconds and stays so
STEADY = _single_turns(60.0, 600.0, 1000.0, 300.0, prefill_nodes=16, decode_cards=16)
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
        data["balance"].update(policy=policy, work_limit=1.0 if quick else 2.0)
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


def fleet(quick: bool) -> None:
    feb = load_sim_config(FEB_DAY)
    report = run_fleet(feb)
    print("\nfleet: DeepSeek's Feb-2025 day (sim/configs/deepseek-feb2025-day.yaml)\n")
    print("| figure | published | simulated | difference |")
    print("|---|---|---|---|")
    for key, published in PUBLISHED_FEB.items():
        print(f"| {key} | {published:,.2f} | {report[key]:,.2f} | {report[key] / published - 1:+.1%} |")
    fixed = report["fixed_split"]
    print(f"\nautoscaled vs a fixed split of the same node-hours ({fixed['prefill_nodes']} prefill + "
          f"{fixed['decode_nodes']} decode nodes): queue wait p50 {report['queue_wait_p50_s']:.1f} / "
          f"{fixed['queue_wait_p50_s']:.0f} s, p99 {report['queue_wait_p99_s']:.1f} / "
          f"{fixed['queue_wait_p99_s']:.0f} s, "
          f"cost ${report['cost_usd']:,.0f} / ${fixed['cost_usd']:,.0f}, requests lost "
          f"{report['requests_lost']:,.0f} / {fixed['requests_lost']:,.0f}")
    faults_table(feb)
    seed_fleet(quick)
    seed_quota(quick)
    store_tables()
    agreement(quick)


def faults_table(feb: SimConfig) -> None:
    faults = feb.fleet.faults
    print(f"\nfaults on the Feb-2025 day at {STRESS:g}x the configured failure rate ({faults.card_failures_per_hour:g} "
          f"per card-hour), repair {faults.repair_hours:g} h:\n")
    print("| handling | spare nodes per stage | failures | covered by a spare | re-queued sequences | requests lost | "
          "queue wait p99 s | max s | spare cost $ |")
    print("|---|---|---|---|---|---|---|---|---|")
    for handling, spares in (("reroute", 1), ("reroute", 0), ("restart", 1), ("restart", 0)):
        faults = feb.fleet.faults.model_copy(update={"handling": handling, "failure_multiplier": STRESS,
                                                     "spare_nodes": {"prefill": spares, "decode": spares}})
        config = feb.model_copy(update={"fleet": feb.fleet.model_copy(update={"faults": faults})})
        report = run_fleet(config)
        figures = report["faults"]
        print(f"| {handling} | {spares} | {figures['failures']} | {figures['with_spare']} | "
              f"{report['requests_requeued']:,.0f} | {report['requests_lost']:,.0f} | "
              f"{report['queue_wait_p99_s']:.1f} | "
              f"{report['queue_wait_max_s']:.0f} | {figures['spare_cost_usd']:,.0f} |")


def seed_fleet(quick: bool) -> None:
    config = load_sim_config(SEED_DAY)
    began = time.perf_counter()
    report = run_fleet(config)
    day = time.perf_counter() - began
    week_wall = math.nan
    if not quick:
        began = time.perf_counter()
        run_fleet(config.model_copy(update={"fleet": config.fleet.model_copy(update={"days": 7.0})}))
        week_wall = time.perf_counter() - began
    cards = report["nodes_mean"] * config.cluster.cards_per_node
    valley = report["revenue_per_card_hour_usd"]
    traffic, target = config.fleet.traffic, SEED_USD_PER_CARD_HOUR
    tokens = traffic.input_tokens_per_day + traffic.output_tokens_per_day
    print(f"\nseed fleet (sim/configs/seed-fleet-day.yaml, {tokens / 1e12:.0f}T tokens a day): "
          f"{report['nodes_mean']:,.0f} nodes on "
          f"average ({cards:,.0f} cards), peak {report['nodes_peak']:,.0f}; revenue at R1's valley price "
          f"${valley:.2f} per card-hour (list price: ${valley / config.fleet.prices.valley_price_factor:.2f}); "
          f"${target:.0f} per card-hour at valley pricing needs prices {target / valley:.1f}x R1's valley "
          f"({target / valley * config.fleet.prices.valley_price_factor:.2f}x its list), or a fleet "
          f"{target / valley:.1f}x smaller for the same tokens; wall {day:.2f} s for a day, {week_wall:.2f} s for a "
          f"week")


def store_tables() -> None:
    """What each retention and capacity buys the prefix store (`sim.fleet.prefix_store`): DeepSeek's Feb-2025 day and
    the seed's day in steady state, their first week from empty, and what the seed's store would need."""
    for name, path in (("Feb-2025 day", ROOT / "sim" / "configs" / "deepseek-feb2025-day.yaml"),
                       ("seed's day", SEED_DAY)):
        config = load_sim_config(path)
        steady, week = fleet_store(config)
        store, (held_pb, _, tokens, per_token) = config.fleet.store, store_of(config)
        print(f"\nprefix store, {name}: {tokens / 1e12:.3g}T prompt tokens a day, {steady.bytes_per_token:,.0f} "
              f"bytes per token, {steady.written_pb_per_day:,.1f} PB written a day; steady hit share "
              f"{steady.hit_share:.3f} ({steady.binding} binds; lifetimes chat {steady.lifetime_days['chat']:.3g} d, "
              f"agent {steady.lifetime_days['agent']:.3g} d); from empty, day 1-7: "
              + " ".join(f"{state.hit_share:.3f}" for state in week[:7]))
        print("\n| capacity PB | retention chat / agent days | steady hit share | binds | lifetime days |")
        print("|---|---|---|---|---|")
        for capacity in (held_pb / 4, held_pb, held_pb * 4, held_pb * 100):
            for retention in ((1.0, 1.0), (7.0, 3.0), (14.0, 14.0)):
                state = store_state(store, capacity, {"chat": retention[0], "agent": retention[1]}, tokens,
                                    per_token)
                print(f"| {capacity:,.4g} | {retention[0]:g} / {retention[1]:g} | {state.hit_share:.3f} | "
                      f"{state.binding} | {state.lifetime_days['chat']:.3g} / {state.lifetime_days['agent']:.3g} |")


def seed_quota(quick: bool) -> None:
    """The seed's day under quotas that bind: from the unconstrained run's peak down to below it, nodes held, the
    queue's wait and the requests lost, and the shrink rule's cost (nodes held over the night because quota use
    stays above its threshold)."""
    config = load_sim_config(SEED_DAY)
    free = run_fleet(config)
    peak = free["nodes_peak"]
    print("\nseed fleet under a quota (the day above; quota as a share of its unconstrained peak):\n")
    print("| quota nodes | quota / peak | nodes mean | nodes peak | queue wait p99 s | requests lost "
          "| cost per day $ |")
    print("|---|---|---|---|---|---|---|")
    for share in ((1.0, 0.9) if quick else (1.25, 1.1, 1.0, 0.95, 0.9)):
        quota = int(peak * share)
        auto = config.fleet.autoscaler.model_copy(update={"quota_nodes": quota})
        report = run_fleet(config.model_copy(update={"fleet": config.fleet.model_copy(update={"autoscaler": auto})}))
        print(f"| {quota:,} | {share:.2f} | {report['nodes_mean']:,.0f} | {report['nodes_peak']:,.0f} | "
              f"{report['queue_wait_p99_s']:,.1f} | {report['requests_lost']:,.0f} | {report['cost_usd']:,.0f} |")


def agreement(quick: bool) -> None:
    """The fleet model's units against the request-by-request run where both run, saturated: a 16-card decode unit
    fed more short single turns than it can serve (its batch at the cap), and the same traffic on 2 prefill nodes
    (prefill saturated). The run's rate is the median of its per-second series from second 10 to the end of the
    arrivals (steady state); the fleet model's unit is given the run's operating point (mean prompt and reply,
    cache hits, context per sequence) and no speed floor, so that its decode unit, like the run's, holds what its
    HBM and batch cap admit; its rates are compared as capacities (the day's utilisation divided out)."""
    rows = []
    for name, prefill_nodes, series in (("decode saturated", 16, "output_tokens"),
                                        ("prefill saturated", 2, "input_tokens")):
        data = SimConfig.model_validate(STEADY).model_dump()
        data["cluster"]["prefill_nodes"] = prefill_nodes
        if quick:
            data["duration_s"] = 14.0
        config = SimConfig.model_validate(data)
        result, detailed = run_simulation(config)
        steady = float(np.median(result.timeline[series][10:round(config.duration_s)]))
        sequences = detailed["decode_batch_mean"]
        fleet_config = FleetConfig.model_validate({
            "prefill_instance_nodes": 1, "tokens_per_s_per_user": 0.01,
            # the run's own imbalance: its decode units replay the placement code at their batch, its prefill
            # nodes serve perfectly balanced (one node per instance)
            "decode_imbalance": detailed["decode_imbalance_mean"], "prefill_imbalance": 1.0,
            "traffic": {"cache_hit_share": detailed["disk_cache_hit_rate"],
                        "kv_tokens_per_sequence": detailed["decode_kv_tokens_mean"] / max(sequences, 1),
                        "prompt_tokens": float(np.mean([r.request.input_tokens for r in result.records])),
                        "output_tokens_per_request": float(np.mean([r.request.output_tokens
                                                                    for r in result.records]))}})
        unit = unit_capacity(config.model_copy(update={"fleet": fleet_config}))
        if series == "output_tokens":
            rows.append((name, f"decode tok/s of the {config.cluster.decode_cards}-card unit", steady,
                         unit.decode_sequences / unit.decode_step_s))
        else:
            rows.append((name, f"prefill tok/s of {prefill_nodes} nodes (hits included)", steady,
                         unit.prefill_tokens_per_s / unit.utilisation * prefill_nodes))  # capacity, not a day's
    print("\nagreement of the fleet model's units with the request-by-request run, saturated (same traffic, same "
          "unit):\n")
    print("| run | figure | request by request (steady median) | fleet model | difference |")
    print("|---|---|---|---|---|")
    for run, figure, request_level, fleet_level in rows:
        print(f"| {run} | {figure} | {request_level:,.0f} | {fleet_level:,.0f} | "
              f"{fleet_level / request_level - 1:+.1%} |")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, whole_doc=True, json_help=None)
    parser.add_argument("--section", default="all", choices=("all", "speed", "balance", "windows", "fleet"))
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    args = parser.parse_args(argv)
    if args.section == "speed" and args.quick:
        parser.error("--section speed has no short run (--quick skips it): drop --quick")
    if args.section in ("all", "speed") and not args.quick:
        speed()
    if args.section in ("all", "balance"):
        balance(args.quick)
    if args.section in ("all", "windows"):
        windows(args.quick)
    if args.section in ("all", "fleet"):
        fleet(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
