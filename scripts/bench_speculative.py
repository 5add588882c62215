"""Which speculative-decoding policy serves best at each acceptance rate and batch size (`sim.speculative`)?

At the simulator's default decode unit (DeepSeek-V3's shape with half its layers sliding-window, on H800s, 128
cards, one spare expert slot per card) with every sequence at DeepSeek's average KV length (4,989 tokens), prints:
1. per first-token acceptance, each policy's tokens and verified draft tokens per step (batch-free);
2. per acceptance and sequences per card, each policy's step time and decode tokens/s per card, no speculation's,
   the threshold policy's gain over verify-all, and the best threshold of a 0.05 grid with its gain;
3. per acceptance, the fewest sequences per card at which the configured threshold gains 6% over verify-all
   (the DSpark post's figure for selective verification);
4. with `--plot PNG`, that gain as a curve over sequences per card for every acceptance, the post's +6% marked.

Usage: python scripts/bench_speculative.py [--quick] [--plot PNG]
"""

import sys
import time

from eplb.cli.arg_types import png_output
from eplb.cli.bench_harness import bench_parser
from sim import SimConfig
from sim.hardware import PROFILES
from sim.speculative import POLICIES, batch_for_gain, gain_table

CONTEXT = 4989  # DeepSeek's average KV length per output token (Day-6 post)
TARGET_GAIN = 0.06  # the post's gain of selective verification over verify-all


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, json_help=None)
    parser.add_argument("--quick", action="store_true", help="Fewer acceptances and batch sizes.")
    parser.add_argument("--plot", type=png_output(), default=None, metavar="PNG",
                        help="also draw the threshold policy's gain over verify-all against sequences per card")
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
    if args.plot:
        plot_gain(spec, model, hardware, cards, redundant, acceptances, args.plot, config.seed, args.quick)
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


def plot_gain(spec, model, hardware, cards: int, redundant: int, acceptances: list[float], path, seed: int,
              quick: bool) -> None:
    """The threshold policy's gain over verify-all against sequences per card, one line per first acceptance, the
    post's +6% as a horizontal line (written atomically to `path`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from traces.atomic_file import write_atomically

    grid = [1, 2, 4, 8, 16, 32] if quick else [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64]
    rows = gain_table(spec, model, hardware, cards, acceptances, grid, CONTEXT, redundant_experts=redundant,
                      seed=seed, thresholds=(spec.threshold,))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for acceptance in acceptances:
        mine = [row for row in rows if row["first_acceptance"] == acceptance]
        axes.plot([row["batch_per_card"] for row in mine], [100 * row["threshold_gain_vs_all"] for row in mine],
                  marker="o", markersize=3, label=f"first acceptance {acceptance:g}")
    axes.axhline(100 * TARGET_GAIN, color="black", linestyle="--", linewidth=1, label="the post's +6%")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("sequences per card")
    axes.set_ylabel(f"threshold {spec.threshold} over verify-all, % tokens/s")
    axes.set_title(f"selective verification, k = {spec.draft_tokens}, {hardware.name} x {cards}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    try:
        write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
