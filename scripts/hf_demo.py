"""Does a tiny transformers MoE model generate the same tokens expert-parallel on W ranks as unmodified in one?

A tiny DeepSeek-V3, DeepSeek-V4 or Qwen3-MoE generates greedily on a W-process Gloo EP group, its sparse MoE blocks
replaced by this project's expert-parallel layer, token for token as the unmodified model does in one process.

The model is `torch.manual_seed(S); AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config))` with a
tiny config (8 experts, top-2, 3 layers; eager experts, float32), its zero-initialised routing buffers perturbed
from the seed so routing is not degenerate (the `perturbation` key says how). The unmodified model generates first,
in this process, and its picks fit a `deepseek` placement (E / W + 1 slots per GPU, so some experts have replicas).
Then W ranks each build the same model, replace its MoE blocks (`eplb.engines.transformers.models.expert_parallel`) and
generate their share of the B prompts (data-parallel attention; the MoE layers exchange tokens over the group).

--rebalance-at T runs a `Rebalancer` beside generation and starts a rebalance at token T: the load recorder's
window so far is fitted (cpsat) on rank 0, the weights move over the next forwards, and every rank switches between
two forwards, mid-generation. Rank 0 waits for its solve (the tiny model's forwards take milliseconds; a real
model's outlast a solve), so the switch comes a few forwards later (`switch_forwards`). --fail-rank K
--fail-at-token T kills rank K (SIGKILL) in the forward that picks token T, as it enters its last MoE layer: the
survivors' collectives fail, they recover (agree, regroup, restore the lost experts from host copies), take over
K's sequences with the tokens K streamed, re-prefill every sequence they serve from its prompt and tokens so far,
and generate on; a rebalance for the smaller group starts at once.

It prints, last, one JSON object under --json with: arch, world_size, seed, config (the dict passed to the config
class), perturbation, prompt (token ids [B][len]), tokens (generated ids [B][N]), tokens_reference (the unmodified
model's), tokens_identical, max_abs_logit_diff (over every token's logits a live rank kept, against the unmodified
model's), logits_compared, layers_swapped (decoder layer indices), hash_layers (those routed by token id),
imbalance_measured (max / mean of the rows each rank computed, mean over forwards and layers), tokens_lost (picks
no slot computed in the forwards the group completed, plus tokens missing), forwards, placement; with
--rebalance-at or --fail-rank also rebalances (switches), switch_forwards, bytes_moved, requests_requeued
(sequences taken over from a killed rank), recoveries, rebalance (the settings), and failed_rank.

A bad flag value exits 2 with one line on stderr, before any process starts; so does a missing transformers. The
check itself exits 1 (after the JSON) when the tokens differ from the unmodified model's or a token was lost.

Usage: python scripts/hf_demo.py --arch deepseek_v3|deepseek_v4|qwen3_moe [--world-size 2] [--new-tokens 8]
       [--seed 0] [--batch B] [--prompt-length 8] [--rebalance-at T] [--fail-rank K --fail-at-token T] [--json]
"""

import argparse
import importlib.util
import json
import sys

from collectives import exit_on_signals, run_local_group, start_local_group_server
from eplb.cli.arg_types import SEED_MAX, integer, number
from eplb.cli.flags import OneLineParser
from placement.cluster import MAX_GPUS

ARCHS = ("deepseek_v3", "deepseek_v4", "qwen3_moe")
VOCAB = 512
FIRST_ORDINARY_ID = 3  # 0, 1, 2 are pad, bos and eos in the tiny configs
# What a rank imports to build and run the models: the fork server the ranks start from imports them once, as it
# starts (importing them takes each rank seconds).
RANK_IMPORTS = ["transformers", "transformers.generation.utils",
                "transformers.models.deepseek_v3.modeling_deepseek_v3",
                "transformers.models.deepseek_v4.modeling_deepseek_v4",
                "transformers.models.qwen3_moe.modeling_qwen3_moe", "eplb.engines.transformers.serving"]
# The rebalancer of --rebalance-at and --fail-rank: attempts only when asked for (and after a recovery), every fit
# switched (min_gain 0: the demo shows weights moving mid-generation), no drift trigger and no burst patches (the
# demo's forwards are few).
DEMO_REBALANCE = dict(window=256, interval=1_000_000, policy="cpsat", time_limit_s=0.5, min_gain=0.0,
                      refit_on_drift=None, patches=None)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", required=True, choices=ARCHS, help="the model family")
    parser.add_argument("--world-size", type=integer(1, MAX_GPUS), default=2, help="W: ranks in the EP group")
    parser.add_argument("--new-tokens", type=integer(1, 128), default=8, help="N: tokens each sequence generates")
    parser.add_argument("--seed", type=integer(0, SEED_MAX), default=0,
                        help="seed of the weights and prompts (default 0)")
    parser.add_argument("--batch", type=integer(1, 256), default=None,
                        help="B: sequences, split over the ranks (>= W; default 2 W)")
    parser.add_argument("--prompt-length", type=integer(1, 64), default=8, help="tokens of every prompt (default 8)")
    parser.add_argument("--rebalance-at", type=integer(1, 127), default=None,
                        help="start a rebalance at this token (< --new-tokens)")
    parser.add_argument("--fail-rank", type=integer(0, MAX_GPUS - 1), default=None,
                        help="kill this rank (< --world-size) at --fail-at-token")
    parser.add_argument("--fail-at-token", type=integer(0, 127), default=None,
                        help="the token whose forward --fail-rank dies in (< --new-tokens)")
    parser.add_argument("--timeout", type=number(0, low_open=True, high=3600), default=30.0,
                        help="each collective's timeout, seconds (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks across flags and the environment; a failure exits 2 with one line."""
    args.batch = 2 * args.world_size if args.batch is None else args.batch
    if args.batch < args.world_size:
        parser.error(f"--batch must be >= --world-size={args.world_size} (every rank generates a sequence); got "
                     f"{args.batch}")
    if args.rebalance_at is not None and args.rebalance_at >= args.new_tokens:
        parser.error(f"--rebalance-at must be below --new-tokens={args.new_tokens}; got {args.rebalance_at}")
    if (args.fail_rank is None) != (args.fail_at_token is None):
        parser.error("--fail-rank and --fail-at-token go together: give both or neither")
    if args.fail_rank is not None:
        if args.world_size < 2 or args.fail_rank >= args.world_size:
            parser.error(f"--fail-rank must name one of the ranks 0..{args.world_size - 1}, with a survivor "
                         f"(--world-size >= 2); got {args.fail_rank} of {args.world_size}")
        if args.fail_at_token >= args.new_tokens:
            parser.error(f"--fail-at-token must be below --new-tokens={args.new_tokens}; got {args.fail_at_token}")
    if importlib.util.find_spec("transformers") is None:
        parser.error("transformers is not installed; install the extra: pip install -e '.[hf]'")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    start_local_group_server(RANK_IMPORTS)  # the fork server imports these while this process runs the reference
    import torch

    from eplb.engines.transformers.generation import PERTURBATION, TINY_CONFIGS

    config = TINY_CONFIGS[args.arch]
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(FIRST_ORDINARY_ID, VOCAB, (args.batch, args.prompt_length), generator=generator)
    reference = run_reference(args, config, prompt)
    result = {"arch": args.arch, "world_size": args.world_size, "seed": args.seed, "config": config,
              "perturbation": PERTURBATION, "prompt": prompt.tolist(), "hash_layers": reference["hash_layers"],
              "placement": reference["placement_summary"]}
    result.update(run_group(args, config, prompt, reference))
    if not args.json:
        print(f"{args.arch} on {args.world_size} ranks x {result['placement']['slots_per_gpu']} slots, "
              f"{args.batch} prompts of {args.prompt_length} tokens, {args.new_tokens} new tokens:")
        for key in ("tokens_identical", "max_abs_logit_diff", "layers_swapped", "hash_layers", "imbalance_measured",
                    "tokens_lost", "rebalances", "switch_forwards", "failed_rank", "requests_requeued"):
            if key in result:
                print(f"  {key}: {result[key]}")
    print(json.dumps(result, sort_keys=True))
    if not result["tokens_identical"] or result.get("tokens_lost"):
        print("hf_demo: the expert-parallel model's tokens differ from the unmodified model's, or tokens were lost "
              "(tokens_identical, tokens_lost above)", file=sys.stderr)
        return 1
    return 0


def run_reference(args: argparse.Namespace, config: dict, prompt) -> dict:
    """Step 1: the unmodified model generates in this process; its picks per forward fit the `deepseek` placement
    the group starts from (E / W + 1 slots per GPU, so some experts have replicas)."""
    import torch

    from eplb.engines.transformers.models import is_hash_block, sparse_blocks
    from eplb.engines.transformers.generation import build_model, greedy, record_picks
    from placement import ClusterSpec, fit_placement

    model = build_model(args.arch, config, args.seed)
    picks, handles = record_picks(model)
    tokens_ref, logits_ref = greedy(model, prompt, args.new_tokens)
    for handle in handles:
        handle.remove()
    counts_TLE = torch.stack([torch.stack(layers) for layers in picks]).numpy()
    slots = -(-counts_TLE.shape[-1] // args.world_size) + 1
    cluster = ClusterSpec(num_gpus=args.world_size, slots_per_gpu=slots, gpus_per_node=args.world_size)
    return {"tokens": tokens_ref, "logits": logits_ref, "placement": fit_placement("deepseek", counts_TLE, cluster),
            "hash_layers": [index for index, block in sparse_blocks(model) if is_hash_block(block)],
            "placement_summary": {"policy": "deepseek", "gpus": args.world_size, "slots_per_gpu": slots,
                                  "fitted_on": "the reference run's picks"}}


def run_group(args: argparse.Namespace, config: dict, prompt, reference: dict) -> dict:
    """Step 2: the same model, expert-parallel on W ranks, each generating its share of the prompts (with a
    rebalancer when --rebalance-at or --fail-rank asks for one); the measured keys of the report."""
    from eplb.engines.transformers.serving import GenerationJob, serve_on_rank
    from eplb.engines.transformers.summary import summarize
    from eplb.rebalance.config import RebalanceConfig

    rebalancing = args.rebalance_at is not None or args.fail_rank is not None
    settings = RebalanceConfig(**DEMO_REBALANCE) if rebalancing else None
    job = GenerationJob(args.arch, config, args.seed, prompt.tolist(), args.new_tokens, reference["placement"],
                        rebalance=settings, rebalance_at=args.rebalance_at, fail_rank=args.fail_rank,
                        fail_at_token=args.fail_at_token)
    ranks = run_local_group(serve_on_rank, args.world_size, job, timeout_s=args.timeout,
                            deadline_s=120 + 10 * args.new_tokens, allow_failures=args.fail_rank is not None)
    dead = [rank for rank, outcome in enumerate(ranks) if isinstance(outcome, BaseException)]
    if dead != ([] if args.fail_rank is None else [args.fail_rank]):
        raise next(outcome for outcome in ranks if isinstance(outcome, BaseException))
    summary = summarize(ranks, reference["tokens"], reference["logits"])
    if rebalancing:
        summary["rebalance"] = settings.model_dump()
    if args.fail_rank is not None:
        summary["failed_rank"] = args.fail_rank
    return summary


if __name__ == "__main__":
    exit_on_signals()  # SIGTERM, SIGINT: unwind, so that the ranks are stopped, and exit 128 + the signal's number
    sys.exit(main())
