"""HF demo: a tiny transformers MoE model (DeepSeek-V3, DeepSeek-V4 or Qwen3-MoE) generates greedily on a W-process
Gloo EP group, its sparse MoE blocks replaced by this project's expert-parallel layer, and token for token as the
unmodified model does in one process.

The model is `torch.manual_seed(S); AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config))` with a
tiny config (8 experts, top-2, 3 layers; eager experts, float32), its zero-initialised routing buffers perturbed
from the seed so routing is not degenerate (the `perturbation` key says how). The unmodified model generates first,
in this process, and its picks fit a `deepseek` placement (E / W + 1 slots per GPU, so some experts have replicas).
Then W ranks each build the same model, replace its MoE blocks (`eplb.adapters.hf_models.expert_parallel`) and
generate their share of the B prompts (data-parallel attention; the MoE layers exchange tokens over the group).

It prints, last, one JSON object under --json with: arch, world_size, seed, config (the dict passed to the config
class), perturbation, prompt (token ids [B][len]), tokens (generated ids [B][N]), tokens_reference (the unmodified
model's), tokens_identical, max_abs_logit_diff (over every step's logits, both runs), layers_swapped (decoder layer
indices), hash_layers (those routed by token id), imbalance_measured (max / mean of the rows each rank computed,
mean over forwards and layers), tokens_lost (picks minus rows computed), placement.

A bad flag value exits 2 with one line on stderr, before any process starts; so does a missing transformers.

Usage: python scripts/hf_demo.py --arch deepseek_v3|deepseek_v4|qwen3_moe [--world-size 2] [--new-tokens 8]
       [--seed 0] [--batch B] [--prompt-length 8] [--json]
"""

import argparse
import importlib.util
import json
import sys

from collectives import exit_on_signals, run_local_group, start_local_group_server
from eplb.cli.arg_types import integer
from eplb.cli.main import OneLineParser
from placement.cluster import MAX_GPUS

ARCHS = ("deepseek_v3", "deepseek_v4", "qwen3_moe")
VOCAB = 512
FIRST_ORDINARY_ID = 3  # 0, 1, 2 are pad, bos and eos in the tiny configs


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", required=True, choices=ARCHS, help="the model family")
    parser.add_argument("--world-size", type=integer(1, MAX_GPUS), default=2, help="W: ranks in the EP group")
    parser.add_argument("--new-tokens", type=integer(1, 128), default=8, help="N: tokens each sequence generates")
    parser.add_argument("--seed", type=integer(0), default=0, help="seed of the weights and prompts (default 0)")
    parser.add_argument("--batch", type=integer(1, 256), default=None,
                        help="B: sequences, split over the ranks (>= W; default 2 W)")
    parser.add_argument("--prompt-length", type=integer(1, 64), default=8, help="tokens of every prompt (default 8)")
    parser.add_argument("--timeout", type=float, default=30.0, help="each collective's timeout, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks across flags and the environment; a failure exits 2 with one line."""
    args.batch = 2 * args.world_size if args.batch is None else args.batch
    if args.batch < args.world_size:
        parser.error(f"--batch must be >= --world-size={args.world_size} (every rank generates a sequence); got "
                     f"{args.batch}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0; got {args.timeout}")
    if importlib.util.find_spec("transformers") is None:
        parser.error("transformers is not installed; install the extra: pip install -e '.[hf]'")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    start_local_group_server()  # the ranks' fork server imports torch while this process runs the reference
    import numpy as np
    import torch

    from eplb.harness.hf_generation import (PERTURBATION, TINY_CONFIGS, GenerationJob, build_model, generate_on_rank,
                                             greedy, record_picks)
    from eplb.adapters.hf_models import is_hash_block, sparse_blocks
    from placement import ClusterSpec, fit_placement

    config = TINY_CONFIGS[args.arch]
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(FIRST_ORDINARY_ID, VOCAB, (args.batch, args.prompt_length), generator=generator)
    # Step 1: the unmodified model in this process; its picks per forward fit the placement.
    model = build_model(args.arch, config, args.seed)
    blocks = sparse_blocks(model)
    hash_layers = [index for index, block in blocks if is_hash_block(block)]
    picks, handles = record_picks(model)
    tokens_ref, logits_ref = greedy(model, prompt, args.new_tokens)
    for handle in handles:
        handle.remove()
    counts_TLE = torch.stack([torch.stack(layers) for layers in picks]).numpy()
    experts = counts_TLE.shape[-1]
    slots = -(-experts // args.world_size) + 1
    cluster = ClusterSpec(num_gpus=args.world_size, slots_per_gpu=slots, gpus_per_node=args.world_size)
    placement = fit_placement("deepseek", counts_TLE, cluster)
    # Step 2: the same model, expert-parallel on W ranks, each generating its share of the prompts.
    job = GenerationJob(args.arch, config, args.seed, prompt.tolist(), args.new_tokens, placement)
    ranks = run_local_group(generate_on_rank, args.world_size, job, timeout_s=args.timeout,
                            deadline_s=120 + 10 * args.new_tokens)
    tokens = [row for rank in ranks for row in rank.tokens]
    logits = torch.cat([rank.logits for rank in ranks])
    computed_GTL = np.array([rank.computed_TL for rank in ranks], dtype=float)
    picks_TL = np.array(ranks[0].picks_TL)
    imbalance = computed_GTL.max(0) / np.maximum(computed_GTL.mean(0), 1e-12)
    result = {
        "arch": args.arch, "world_size": args.world_size, "seed": args.seed, "config": config,
        "perturbation": PERTURBATION, "prompt": prompt.tolist(), "tokens": tokens,
        "tokens_reference": tokens_ref.tolist(), "tokens_identical": tokens == tokens_ref.tolist(),
        "max_abs_logit_diff": float((logits - logits_ref).abs().max()),
        "layers_swapped": ranks[0].layers_swapped, "hash_layers": hash_layers,
        "imbalance_measured": float(imbalance.mean()), "tokens_lost": int(picks_TL.sum() - computed_GTL.sum()),
        "placement": {"policy": "deepseek", "gpus": args.world_size, "slots_per_gpu": slots,
                      "fitted_on": "the reference run's picks"},
    }
    if not args.json:
        print(f"{args.arch} on {args.world_size} ranks x {slots} slots, {args.batch} prompts of "
              f"{args.prompt_length} tokens, {args.new_tokens} new tokens:")
        for key in ("tokens_identical", "max_abs_logit_diff", "layers_swapped", "hash_layers", "imbalance_measured",
                    "tokens_lost"):
            print(f"  {key}: {result[key]}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    exit_on_signals()  # SIGTERM, SIGINT: unwind, so that the ranks are stopped, and exit 128 + the signal's number
    sys.exit(main())
