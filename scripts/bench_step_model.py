"""The step model's fixed times against published operator and end-to-end figures (`sim.cost_model`).

Prints, each beside the same figures from the roofline the simulator used before (an end-to-end attention factor
fitted on DeepSeek's profiled decode, no fixed time: `ROOFLINE_ONLY`), run in this process:
1. DeepEP's low-latency table (H800, 128 tokens a rank) against the modelled calls: the floor is fitted on EP16-256;
2. CloudMatrix384's dispatch and combine operators, predicted from that floor on the Ascend 910C at 128 tokens a die
   (the summaries quoting the paper's 116-152 us and 118-149 us give no token count);
3. CloudMatrix384's decode at the paper's own batches (8, 24, 96 sequences per NPU): the model's step against the
   step the paper's TPOT implies (TPOT x tokens per step), and the bound on any model whose step grows linearly with
   the batch (a line through the paper's 8 and 96 points, read at 24);
4. its decode at TPOT targets 15, 30 and 50 ms against the paper, and how much of the 50 ms throughput 15 ms keeps;
5. MTP's gain over no draft by sequences per NPU (fixed batches; the placement code's imbalance at each).

Usage: python scripts/bench_step_model.py [--quick]
"""

import sys
import time
from pathlib import Path

from eplb.cli.main import OneLineParser
from sim.capacity import decode_capacity, speculation_gain
from sim.config import load_sim_config
from sim.cost_model import all_to_all_latency_seconds
from sim.hardware import CALIBRATED, PROFILES, Efficiency, efficiency_override
from sim.model_profile import ModelProfile

ANCHORS = Path(__file__).resolve().parent.parent / "sim" / "anchors"
DEEPEP_US = {8: (77, 114), 16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}
CLOUDMATRIX_OPERATORS_US = {"dispatch": (116, 152), "combine": (118, 149)}  # EP8 -> EP256, as summaries quote them
# the paper's decode under TPOT targets, as summaries quote its table: target ms -> (sequences per NPU, TPOT ms,
# tokens/s per NPU)
CLOUDMATRIX_DECODE = {15: (8, 14.9, 538), 30: (24, 24.6, 974), 50: (96, 49.4, 1943)}
ROOFLINE_ONLY = Efficiency(compute=0.4232, attention=0.3084, memory=CALIBRATED.memory, network=CALIBRATED.network)
"""The calibration before the fixed times: attention at an end-to-end factor fitted jointly with `compute` on
DeepSeek's profiled decode and prefill, no floor, no fixed time (the baseline column)."""


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Fewer batch sizes in the MTP table.")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    models = {"fixed times": CALIBRATED, "roofline only": ROOFLINE_ONLY}
    print(f"calibration: attention {CALIBRATED.attention:.4f} of BF16 peak (FlashMLA), compute "
          f"{CALIBRATED.compute:.4f}, floor {CALIBRATED.all_to_all_floor_us:.2f} us a call, fixed "
          f"{CALIBRATED.layer_overhead_us:.1f} us per layer and micro-batch; baseline: attention "
          f"{ROOFLINE_ONLY.attention}, compute {ROOFLINE_ONLY.compute}, no fixed time")

    v3, h800, ascend = ModelProfile(), PROFILES["H800"], PROFILES["Ascend910C"]
    print("\n1. DeepEP low-latency, us per call (H800, 128 tokens a rank; floor fitted on EP16-256)")
    print("| EP | dispatch published | modelled | combine published | modelled |\n|---|---|---|---|---|")
    for cards, (dispatch, combine) in DEEPEP_US.items():
        modelled = all_to_all_latency_seconds(v3, h800, cards, 128)
        print(f"| {cards} | {dispatch} | {1e6 * modelled[0]:.0f} | {combine} | {1e6 * modelled[1]:.0f} |")

    print("\n2. CloudMatrix384 operators predicted from DeepEP's floor, us per call (Ascend 910C, 128 tokens a die)")
    print("| EP | dispatch | combine |\n|---|---|---|")
    for cards in (8, 256):
        modelled = all_to_all_latency_seconds(v3, ascend, cards, 128)
        print(f"| {cards} | {1e6 * modelled[0]:.0f} | {1e6 * modelled[1]:.0f} |")
    print("published (as summaries quote the paper), EP8 -> EP256: "
          + ", ".join(f"{op} {low}-{high} us" for op, (low, high) in CLOUDMATRIX_OPERATORS_US.items()))

    config = load_sim_config(ANCHORS / "cloudmatrix384-decode.yaml")
    cards = config.cluster.decode_cards
    print("\n3. CloudMatrix384 decode step at the paper's batches, ms (imbalance from the placement code)")
    print("| sequences per NPU | paper's TPOT | implied step | " + " | ".join(f"{name} step" for name in models)
          + " |\n|---|---|---|---|---|")
    implied = {}
    for target, (per_card, tpot_ms, _) in CLOUDMATRIX_DECODE.items():
        fixed = config.model_copy(update={"capacity": config.capacity.model_copy(
            update={"decode_batch_per_card": per_card})})
        steps = []
        for efficiency in models.values():
            with efficiency_override(efficiency):
                row = decode_capacity(fixed)
            steps.append(row["step_ms"])
        implied[per_card] = tpot_ms * row["tokens_per_step"]
        print(f"| {per_card} | {tpot_ms} | {implied[per_card]:.1f} | " + " | ".join(f"{s:.1f}" for s in steps)
              + " |")
    (low, high), middle = (8, 96), 24
    slope = (implied[high] - implied[low]) / (high - low)
    line = implied[low] + slope * (middle - low)
    print(f"a step linear in the batch through the paper's {low} and {high} points: {line:.1f} ms at {middle} per "
          f"NPU where the paper implies {implied[middle]:.1f} ({implied[middle] / line - 1:+.0%}): the paper's step "
          f"grows {(implied[middle] - implied[low]) / (middle - low):.2f} ms per sequence from {low} to {middle} "
          f"and {(implied[high] - implied[middle]) / (high - middle):.2f} from {middle} to {high}")

    print("\n4. CloudMatrix384 decode under TPOT targets, tokens/s per NPU")
    print("| TPOT target | paper | " + " | ".join(f"{name} | error | sequences per NPU" for name in models)
          + " |\n|---|---|---|---|---|---|---|---|")
    rates = {name: {} for name in models}
    for target, (_, _, published) in CLOUDMATRIX_DECODE.items():
        at = config.model_copy(update={"capacity": config.capacity.model_copy(
            update={"tpot_slo_ms": target, "decode_batch_per_card": None})})
        cells = []
        for name, efficiency in models.items():
            with efficiency_override(efficiency):
                row = decode_capacity(at)
            rates[name][target] = row["tokens_per_s_per_card"]
            cells.append(f"{row['tokens_per_s_per_card']:,.0f} | {row['tokens_per_s_per_card'] / published - 1:+.1%} "
                         f"| {row['batch_per_card']:.1f}")
        print(f"| {target} ms | {published:,} | " + " | ".join(cells) + " |")
    kept = {name: rate[15] / rate[50] for name, rate in rates.items()}
    print(f"15 ms keeps of 50 ms: paper {538 / 1943:.0%}, " + ", ".join(f"{name} {share:.0%}"
                                                                       for name, share in kept.items()))

    batches = [8, 24, 96] if args.quick else [4, 8, 16, 24, 32, 48, 64, 96, 128]
    print("\n5. MTP (one draft token at 70%) over no draft, CloudMatrix384 decode, tokens/s per NPU at fixed batches")
    print("| sequences per NPU | " + " | ".join(f"{name}: no draft | MTP | gain" for name in models)
          + " |\n|---|---|---|---|---|---|---|")
    tables = {}
    for name, efficiency in models.items():
        with efficiency_override(efficiency):
            tables[name] = speculation_gain(config, batches)
    for index, per_card in enumerate(batches):
        cells = [f"{table[index]['plain_tokens_per_s_per_card']:,.0f} | {table[index]['tokens_per_s_per_card']:,.0f} "
                 f"| {table[index]['gain']:+.1%}" for table in tables.values()]
        print(f"| {per_card} | " + " | ".join(cells) + " |")
    print(f"\n({time.perf_counter() - began:.0f} s; {cards} NPUs, {config.capacity.decode_context_tokens:,}-token "
          f"contexts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
