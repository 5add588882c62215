"""Speculative decoding's policies over acceptance rate and batch size, from the cost model (`sim.speculative`).

At the simulator's default decode unit (DeepSeek-V3's shape with half its layers sliding-window, on H800s, 128
cards, one spare expert slot per card) with every sequence at DeepSeek's average KV length (4,989 tokens), prints:
1. per first-token acceptance, each policy's tokens and verified draft tokens per step (batch-free);
2. per acceptance and sequences per card, each policy's step time and decode tokens/s per card, no speculation's,
   the threshold policy's gain over verify-all, and the best threshold of a 0.05 grid with its gain;
3. per acceptance, the fewest sequences per card at which the configured threshold gains 6% over verify-all
   (the DSpark post's figure for selective verification).

Usage: python scripts/bench_speculative.py [--quick]
"""

import argparse
import sys
import time


from sim import SimConfig
from sim.hardware import PROFILES
from sim.speculative import POLICIES, batch_for_gain, gain_table

CONTEXT = 4989  # DeepSeek's average KV length per output token (Day-6 post)
TARGET_GAIN = 0.06  # the post's gain of selective verification over verify-all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Fewer acceptances and batch sizes.")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    config = SimConfig()
    spec, model = config.speculative, config.model
    hardware, cards = PROFILES[config.hardware.decode], config.cluster.decode_cards
    redundant = cards * (-(-model.num_routed_experts // cards) + 1) - model.num_routed_experts  # as sim.stage_costs
    acceptances = [0.7, 0.875, 0.95] if args.quick else [0.6, 0.7, 0.8, 0.875, 0.95]
    batches = [1, 4, 8, 32] if args.quick else [1, 2, 4, 5, 6, 8, 16, 32, 64]
    rows = gain_table(spec, model, hardware, cards, acceptances, batches, CONTEXT, redundant_experts=redundant,
                      seed=config.seed)
    print(f"{hardware.name}, {cards}-card decode unit, {redundant} redundant experts, KV {CONTEXT:,} tokens per "
          f"sequence; k = {spec.draft_tokens}, first_n = {spec.verify_first_n}, threshold = {spec.threshold}, "
          f"decay {spec.acceptance_decay}, spread {spec.confidence_spread:.2f}, predictor noise "
          f"{spec.predictor_noise}, draft cost {spec.draft_cost_share:.0%} of a one-token step per drafted token")

    print("\n| first acceptance | " + " | ".join(f"{p} tok/step | {p} verified" for p in POLICIES) + " |")
    print("|---" * (1 + 2 * len(POLICIES)) + "|")
    for row in rows:
        if row["batch_per_card"] != batches[0]:
            continue
        cells = [f"{row['policies'][p]['tokens_per_step']:.2f} | {row['policies'][p]['verified_per_step']:.2f}"
                 for p in POLICIES]
        print(f"| {row['first_acceptance']:.3f} | " + " | ".join(cells) + " |")

    print("\n| first acceptance | seq/card | no spec tok/s/card | "
          + " | ".join(f"{p} ms | {p} tok/s/card" for p in POLICIES)
          + " | threshold vs all | best threshold (vs all) |")
    print("|---" * (5 + 2 * len(POLICIES)) + "|")
    for row in rows:
        cells = [f"{row['policies'][p]['step_s'] * 1e3:.1f} | {row['policies'][p]['tokens_per_s_per_card']:,.0f}"
                 for p in POLICIES]
        print(f"| {row['first_acceptance']:.3f} | {row['batch_per_card']} | "
              f"{row['plain_tokens_per_s_per_card']:,.0f} | " + " | ".join(cells)
              + f" | {row['threshold_gain_vs_all']:+.1%} | {row['best_threshold']:.2f} "
                f"({row['best_threshold_gain_vs_all']:+.1%}) |")

    print(f"\nwhere threshold {spec.threshold} first gains {TARGET_GAIN:.0%} over verify-all (sequences per card, "
          f"0.125 grid):")
    for acceptance in acceptances:
        at = spec.model_copy(update={"first_acceptance": acceptance})
        per_card = batch_for_gain(at, model, hardware, cards, CONTEXT, TARGET_GAIN, redundant_experts=redundant,
                                  seed=config.seed)
        where = f"{per_card:.3f} sequences per card" if per_card is not None else "not up to 256 per card"
        print(f"  first acceptance {acceptance:.3f}: {where}")
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
