"""What DeepSeek-V3's group-limited routing does to the expert imbalance the placement code leaves.

DeepSeek-V3 routes each token to its top-8 experts among the top-4 of 8 groups of 32 (a group's score: the sum of
its two best affinities). This samples tokens one by one from the same popularity with and without that limit (a
token's affinities: log popularity plus Gumbel noise, so without the limit its top-8 is a draw without replacement in
proportion to popularity), fits DeepSeek's greedy on a window of each, and serves fresh steps of each with the live
router: the served imbalance (max / mean GPU load, mean over steps and layers) at decode and prefill shapes. The
simulator's synthetic traffic picks experts independently; this measures what that leaves out.

Usage: python scripts/bench_group_limits.py [--quick] [--seed 0]
"""

import argparse
import sys

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer
from eplb.cli.main import OneLineParser
from placement import ClusterSpec, fit_placement, score_placement

EXPERTS, TOP_K, GROUPS, TOP_GROUPS = 256, 8, 8, 4
SHAPES = ((144, 2, 64), (72, 4, 128), (32, 9, 512))  # GPUs, slots per GPU, tokens per GPU per step
MAX_TOKENS = 20_000  # tokens of one sampled step (per-token sampling costs tokens x experts)


def sample_counts(log_popularity_LE: np.ndarray, tokens: int, limited: bool, rng: np.random.Generator) -> np.ndarray:
    """[L, E] picks of `tokens` tokens, each its top-K experts by log popularity plus Gumbel noise, within its top
    groups when `limited`."""
    layers, experts = log_popularity_LE.shape
    counts = np.zeros((layers, experts), dtype=np.int64)
    per_group = experts // GROUPS
    for layer in range(layers):
        scores = log_popularity_LE[layer][None, :] + rng.gumbel(size=(tokens, experts))
        if limited:
            group_score = np.sort(scores.reshape(tokens, GROUPS, per_group), axis=2)[:, :, -2:].sum(axis=2)
            kept = np.argsort(-group_score, axis=1)[:, :TOP_GROUPS]
            mask = np.full((tokens, GROUPS), -np.inf)
            np.put_along_axis(mask, kept, 0.0, axis=1)
            scores = scores + np.repeat(mask, per_group, axis=1)
        picks = np.argpartition(-scores, TOP_K, axis=1)[:, :TOP_K]
        counts[layer] = np.bincount(picks.ravel(), minlength=experts)
    return counts


def served_imbalance(gpus: int, slots: int, tokens: int, limited: bool, log_popularity_LE: np.ndarray,
                     rng: np.random.Generator, fit_steps: int, served_steps: int) -> float:
    """Mean served imbalance of DeepSeek's greedy fitted on `fit_steps` steps and serving `served_steps` fresh ones."""
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
    window = np.stack([sample_counts(log_popularity_LE, 4000, limited, rng) for _ in range(fit_steps)])
    placement = fit_placement("deepseek", window, cluster)
    served = np.stack([sample_counts(log_popularity_LE, tokens, limited, rng) for _ in range(served_steps)])
    return float(score_placement(placement, served, "live").imbalance_TL.mean())


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one small shape, few steps (a smoke run)")
    parser.add_argument("--seed", type=integer(0, SEED_MAX), default=0,
                        help="seed of the popularity and the sampling (default 0)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    layers = 1 if args.quick else 2
    log_popularity_LE = rng.normal(0.0, 0.8, size=(layers, EXPERTS))  # the synthetic traffic's lognormal, sigma 0.8
    shapes = ((16, 17, 64),) if args.quick else SHAPES
    print("| GPUs x slots | tokens per GPU | independent picks | group-limited | difference |")
    print("|---|---|---|---|---|")
    for gpus, slots, per_gpu in shapes:
        tokens = min(gpus * per_gpu, MAX_TOKENS)
        free, limited = (served_imbalance(gpus, slots, tokens, flag, log_popularity_LE, rng,
                                          2 if args.quick else 3, 2 if args.quick else 24) for flag in (False, True))
        print(f"| {gpus} x {slots} | {tokens / gpus:.0f} | {free:.4f} | {limited:.4f} | {limited - free:+.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
