"""Benchmark: how close the held-out imbalance of hash-routed layers gets to hindsight when their placement is fitted
from the token table, against learned layers fitted on the routing window.

Legend: T steps, L layers, E experts, V vocabulary, N tokens per step.

A hash layer's loads follow from the token ids (`placement.hash_routing`), so besides the rolling fit every layer
gets today (`window`: cpsat on the last --window steps of recorded counts, refit every --every steps), it can be
fitted from the token-count table of every token seen so far (`token table`: --window steps of N tokens drawn from
that table and mapped through tid2eid). `hindsight` fits on the very steps it is scored on (the floor a forecast
can reach). `fit once` (learned) and `token table, fit once` (hash) fit at the first step only and serve every later
step: what a layer gets that is never rebalanced. Every placement serves --lag steps after its fit window ends and
is scored under the live router.

Sections:
1. zipf: the full shape, 256 experts, top-6, DeepSeek-V4's vocabulary of 129,280 ids, 8,192 tokens per step
   (`traces.token_stream`: Zipf 1.07 over four drifting domains that share their 1,000 most frequent ids), 3 hash
   layers with random tables (each id's 6 experts drawn uniformly) beside 3 learned layers of the synthetic routing
   traces (`traces.synthetic`, top-6, the same steps and drift period), on 64 GPUs x 5 slots and 128 x 3;
2. demo: the tiny DeepSeek-V4 of `scripts/hf_demo.py` (transformers, 8 experts, top-2; layer 0 hashed by its
   seeded table, layers 1-2 learned), run on batches of 16 sequences of 8 ids from a Zipf stream over its
   vocabulary (128 tokens per step), its picks recorded per layer, on 4 GPUs x 2 slots (no replica: which experts share a GPU is all a placement decides).

Usage: python scripts/bench_hash_layers.py [--section zipf|demo|all] [--steps 600] [--every 100] [--window 100]
       [--lags 0,100] [--time-limit 2] [--json out.json] [--quick]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from eplb.cli.arg_types import comma_separated, integer, json_output, number
from eplb.cli.main import OneLineParser
from placement import ClusterSpec, fit_placement, score_placement
from placement.hash_routing import hash_counts_TE, table_steps_TE
from traces.synthetic import SyntheticConfig, generate_trace
from traces.token_stream import TokenStreamConfig, generate_tokens_TN

ZIPF_CLUSTERS = [ClusterSpec(num_gpus=64, slots_per_gpu=5), ClusterSpec(num_gpus=128, slots_per_gpu=3)]
DEMO_CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=2, gpus_per_node=4)
MAX_STEPS = 20_000  # the full shape's token stream: 8,192 ids a step


def replay(counts_TLE: np.ndarray, fit, every: int, window: int, lag: int, cluster: ClusterSpec) -> dict:
    """Mean held-out imbalance (live router) of the placements `fit(step)` returns for the steps [step + lag,
    step + every + lag), step = window, window + every, ..., and the mean seconds per fit."""
    scores, seconds = [], []
    for step in range(window, counts_TLE.shape[0] - lag, every):
        served = counts_TLE[step + lag : step + every + lag]
        began = time.perf_counter()
        placement = fit(step, served)
        seconds.append(time.perf_counter() - began)
        scores.append(score_placement(placement, served, "live").imbalance_TL)
    return {"imbalance_mean": float(np.concatenate(scores).mean()), "fit_seconds": float(np.mean(seconds)),
            "fits": len(seconds)}


def compare(kinds: dict, cluster: ClusterSpec, args, tokens_per_step: int) -> list[dict]:
    """Rows per kind of layer, variant and lag: `kinds` maps a kind ("hash", "learned") to its counts [T, L, E] and,
    for hash layers, (tables [L][V, K], tokens [T, N])."""
    options = {"routing": "dynamic", "time_limit_s": args.time_limit}
    rows = []
    for kind, (counts_TLE, hashing) in kinds.items():
        variants = {"window": lambda step, served: fit_placement("cpsat", counts_TLE[step - args.window : step],
                                                                 cluster, **options),
                    "hindsight": lambda step, served: fit_placement("cpsat", served, cluster, **options)}
        if hashing is not None:
            tables, tokens_TN = hashing

            def from_table(step, served, tables=tables, tokens_TN=tokens_TN):
                seen_V = np.bincount(tokens_TN[:step].reshape(-1), minlength=tables[0].shape[0])
                steps = np.stack([table_steps_TE(table, seen_V, counts_TLE.shape[-1], tokens_per_step, args.window,
                                                 seed=step) for table in tables], axis=1)
                return fit_placement("cpsat", steps, cluster, **options)

            variants["token table"] = from_table
        fit_once = variants["token table" if hashing is not None else "window"]
        variants["fit once" if hashing is None else "token table, fit once"] = _first_only(fit_once)
        for lag in args.lags:
            for variant, fit in variants.items():
                result = replay(counts_TLE, fit, args.every, args.window, lag, cluster)
                rows.append({"kind": kind, "variant": variant, "lag": lag, **result})
                print(f"  {kind:8s} {variant:12s} lag {lag:3d}: {result['imbalance_mean']:.4f} "
                      f"({result['fits']} fits, {result['fit_seconds']:.1f} s each)", flush=True)
    return rows


def _first_only(fit):
    """`fit` at its first step, and that placement at every later step (a placement never refitted)."""
    kept = {}

    def fitted_once(step, served):
        if "placement" not in kept:
            kept["placement"] = fit(step, served)
        return kept["placement"]

    return fitted_once


def zipf_section(args) -> list[dict]:
    """Section 1: hash layers on a Zipf token stream beside learned synthetic layers, at the full shape (--quick: a
    small one)."""
    experts, top_k, tokens_per_step, vocab, clusters = 256, 6, 8192, 129280, ZIPF_CLUSTERS
    if args.quick:
        experts, top_k, tokens_per_step, vocab, clusters = 32, 4, 256, 5000, [ClusterSpec(num_gpus=8, slots_per_gpu=5)]
    stream = TokenStreamConfig(vocab_size=vocab, num_steps=args.steps, tokens_per_step=tokens_per_step)
    tokens_TN = generate_tokens_TN(stream)
    rng = np.random.default_rng(1)
    tables = [rng.random((stream.vocab_size, experts)).argpartition(top_k, axis=1)[:, :top_k] for _ in range(3)]
    hash_TLE = np.stack([hash_counts_TE(table, tokens_TN, experts) for table in tables], axis=1)
    learned_TLE = generate_trace(SyntheticConfig(num_steps=args.steps, num_layers=3, num_experts=experts, top_k=top_k,
                                                 tokens_per_step=tokens_per_step)).counts_TLE
    blocks = []
    for cluster in clusters:
        print(f"zipf: {cluster.num_gpus} x {cluster.slots_per_gpu}", flush=True)
        rows = compare({"hash": (hash_TLE, (tables, tokens_TN)), "learned": (learned_TLE, None)}, cluster, args,
                       tokens_per_step)
        blocks.append({"cluster": f"{cluster.num_gpus}x{cluster.slots_per_gpu}", "rows": rows})
    return blocks


def demo_section(args) -> list[dict]:
    """Section 2: the tiny DeepSeek-V4 of the demo, its picks recorded on a Zipf stream over its vocabulary."""
    import torch

    from eplb.engines.transformers.models import sparse_blocks
    from eplb.engines.transformers.generation import TINY_CONFIGS, build_model, record_picks

    config = TINY_CONFIGS["deepseek_v4"]
    model = build_model("deepseek_v4", config, 0)
    batch, length, first_id = 16, 8, 3  # ids 0-2 are pad, bos and eos
    stream = TokenStreamConfig(vocab_size=config["vocab_size"] - first_id, num_steps=args.steps,
                               tokens_per_step=batch * length, shared_top=20)
    tokens_TN = generate_tokens_TN(stream) + first_id
    picks, handles = record_picks(model)
    with torch.no_grad():
        for step_tokens in tokens_TN:
            model(torch.from_numpy(step_tokens.reshape(batch, length)))
    for handle in handles:
        handle.remove()
    counts_TLE = torch.stack([torch.stack(layers) for layers in picks]).numpy()
    block = sparse_blocks(model)[0][1]
    table = block.gate.tid2eid.numpy()
    assert (hash_counts_TE(table, tokens_TN, counts_TLE.shape[-1]) == counts_TLE[:, 0]).all()
    print(f"demo: {DEMO_CLUSTER.num_gpus} x {DEMO_CLUSTER.slots_per_gpu}", flush=True)
    rows = compare({"hash": (counts_TLE[:, :1], ([table], tokens_TN)), "learned": (counts_TLE[:, 1:], None)},
                   DEMO_CLUSTER, args, batch * length)
    return [{"cluster": "4x2", "rows": rows}]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=("zipf", "demo", "all"), default="all")
    parser.add_argument("--steps", type=integer(1, MAX_STEPS), default=600, help="steps of each stream (default 600)")
    parser.add_argument("--every", type=integer(1, MAX_STEPS), default=100, help="refit every N steps (default 100)")
    parser.add_argument("--window", type=integer(1, MAX_STEPS), default=100, help="steps each fit uses (default 100)")
    parser.add_argument("--lags", type=comma_separated(integer(0, MAX_STEPS)), default=[0, 100],
                        help="comma-separated lags, steps (default 0,100)")
    parser.add_argument("--time-limit", type=number(0, low_open=True, high=86_400), default=2.0,
                        help="cpsat budget per fit, seconds (default 2)")
    parser.add_argument("--json", type=json_output(), default=None, help="also write the rows to this JSON file")
    parser.add_argument("--quick", action="store_true", help="zipf: a small shape (32 experts on 8 x 5), for a smoke run")
    args = parser.parse_args(argv)
    if args.window + max(args.lags) >= args.steps:
        parser.error(f"--window {args.window} and the largest of --lags, {max(args.lags)}, leave no step of --steps "
                     f"{args.steps} to score; give more --steps or a shorter --window")
    results = {}
    if args.section in ("zipf", "all"):
        results["zipf"] = zipf_section(args)
    if args.section in ("demo", "all"):
        results["demo"] = demo_section(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
