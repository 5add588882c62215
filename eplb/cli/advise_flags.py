"""`eplb advise`'s flags: the model, card and latency target, the layouts it tries, prefill, costs and engine files."""

import argparse

from eplb.cli import advise_command, flags
from eplb.cli.arg_types import (NON_NEGATIVE_INT, POSITIVE_INT, comma_separated, integer, layout, number,
                                one_of)
from eplb.cli.trtllm_output import layer_ids_arg
from placement.cluster import MAX_GPUS, MAX_SLOTS_PER_GPU


def add_advise_command(sub: argparse._SubParsersAction) -> None:
    """`eplb advise`: its flags (the card is checked by the command: the simulator's modules load only there)."""
    p = sub.add_parser("advise", help="how many GPUs and redundant experts to deploy, from a trace, model, card and "
                                      "latency target", description=advise_command.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=None,
                   help="decode routing trace, any file `eplb replay` reads (default: a synthetic 61 x 256 trace "
                        "of independent tokens); a top-k id log with --tokens-per-step, its tasks interleaved so "
                        "that every window holds the same mix")
    flags.add_topk_log(p, "interleaved")
    p.add_argument("--current", type=layout, default=None, metavar="GxS", dest="current_layout",
                   help="the layout serving now, GPUs x slots per GPU (for example 144x2): its row, the pick's gain "
                        "over it (a range over the traffic scenarios) and the break-even imbalance")
    p.add_argument("--model", default=None, metavar="CONFIG",
                   help="a simulator config (YAML or JSON) whose model section is the served model (default: "
                        "DeepSeek-V3's shape, FP8)")
    p.add_argument("--card", default="H800",
                   help="the decode GPU or NPU, a simulator hardware profile: H800, H100, H20, Ascend910C, L20 "
                        "(default H800)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--tokens-per-user", type=number(0, low_open=True, high=10_000), default=20.0,
                        help="the speed each user must see, output tokens/s (default 20: TPOT 50 ms)")
    target.add_argument("--tpot-ms", type=number(0, low_open=True, high=10_000), default=None,
                        help="the TPOT target, ms per output token (instead of --tokens-per-user)")
    p.add_argument("--context", type=integer(1, 10_000_000), default=4096,
                   help="tokens in each sequence's KV cache (default 4096)")
    p.add_argument("--mtp", action="store_true", help="decode with one MTP draft token (DeepSeek-V3's acceptance)")
    _add_advise_layouts(p)
    _add_advise_prefill(p)
    _add_advise_costs(p)
    _add_advise_engine_files(p)
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw tokens/s per GPU and the imbalance against redundant experts to this file")
    flags.add_scenarios(p, "rerun the pick, the layouts within 5%% of it and --current over")
    flags.add_common(p)


def _add_advise_layouts(p: argparse.ArgumentParser) -> None:
    """`eplb advise`: the layouts it tries and how each is replayed."""
    p.add_argument("--ep-sizes", type=comma_separated(integer(1, MAX_GPUS)),
                   default=[32, 64, 72, 128, 144, 160, 256], metavar="G,G,...",
                   help="EP sizes to try (default 32,64,72,128,144,160,256)")
    p.add_argument("--slots-per-gpu", type=comma_separated(integer(1, MAX_SLOTS_PER_GPU)),
                   default=list(range(1, 13)), metavar="S,S,...",
                   help="expert slots per GPU to try (default 1-12); a pair is tried when it holds every expert "
                        "and at most --max-redundant more")
    p.add_argument("--max-redundant", type=integer(0, 100_000), default=128,
                   help="the most redundant experts a layout may have (default 128)")
    p.add_argument("--redundant", type=comma_separated(integer(0, 100_000)), default=None, metavar="R,R,...",
                   help="only layouts with these redundant expert counts (each EP size with the slots per GPU that "
                        "give them)")
    p.add_argument("--node-limits", type=comma_separated(one_of(("none", "groups"))), default=["none", "groups"],
                   metavar="L,L,...",
                   help="try layouts without node limits (none) and with them (groups: every expert group on one "
                        "node, where the groups are a multiple of the nodes; DeepSeek's hierarchical rule, which "
                        "vLLM and SGLang apply there by themselves), decode and prefill (default none,groups)")
    p.add_argument("--layers", type=integer(1, 512), default=8,
                   help="evenly spaced layers of the trace replayed for each layout (default 8; the imbalance is "
                        "their mean)")
    p.add_argument("--refit-every", type=integer(1, 100_000), default=50,
                   help="steps between refits, as your rebalancer runs (default 50)")
    p.add_argument("--window", type=integer(1, 100_000), default=50, help="steps each fit sees (default 50)")
    p.add_argument("--work-limit", type=number(0, low_open=True, high=3600), default=None,
                   help="cpsat's deterministic budget per fit of the replayed layers (default 0.25 a layer)")
    p.add_argument("--max-batch-per-gpu", type=integer(1, 4096), default=256,
                   help="sequences per GPU at most, the engine's batch cap (default 256)")


def _add_advise_prefill(p: argparse.ArgumentParser) -> None:
    """`eplb advise`'s prefill flags."""
    p.add_argument("--ttft-s", type=number(0, low_open=True, high=3600), default=None,
                   help="also advise prefill instances: the longest a prefill batch may take, seconds")
    p.add_argument("--prompt-tokens", type=integer(1, 1_000_000), default=4096,
                   help="with --ttft-s: mean prompt length (default 4096)")
    p.add_argument("--cached-share", type=number(0, high=0.99), default=0.0,
                   help="with --ttft-s: share of each prompt read from the KV cache, not computed (default 0)")
    p.add_argument("--prefill-nodes", type=comma_separated(integer(1, 16)), default=[1, 2, 4, 8],
                   metavar="N,N,...", help="with --ttft-s: prefill instance sizes in 8-GPU nodes, at most 16 (each a "
                                           "replay of batches of up to 16,384 tokens a GPU; default 1,2,4,8)")
    p.add_argument("--prefill-redundant", type=comma_separated(integer(0, 4096)), default=[0, 32],
                   metavar="R,R,...", help="with --ttft-s: redundant experts of a prefill instance (default 0,32)")


def _add_advise_costs(p: argparse.ArgumentParser) -> None:
    """`eplb advise`'s load and price flags."""
    p.add_argument("--load", type=number(0, low_open=True, high=1e12), default=None, metavar="TOKENS_PER_S",
                   help="decode output tokens/s to serve: each row then says how many GPUs it needs")
    p.add_argument("--price-per-gpu-hour", type=number(0, high=1e6), default=None, metavar="USD",
                   help="USD a GPU-hour, for the cost of a million output tokens (default: the card's profile "
                        "price, where it has one)")


def _add_advise_engine_files(p: argparse.ArgumentParser) -> None:
    """`eplb advise`'s engine-file flags (as `eplb place`'s, for the recommended layout)."""
    p.add_argument("--sglang-out", default=None, metavar="FILE",
                   help="also write the recommended layout's SGLang --init-expert-location file, fitted on the whole "
                        "trace (layers from an SGLang dump, else --sglang-num-layers and --sglang-first-moe-layer)")
    p.add_argument("--sglang-num-layers", type=POSITIVE_INT, default=None, metavar="N",
                   help="with --sglang-out: the model's decoder layers (61 for DeepSeek-V3)")
    p.add_argument("--sglang-first-moe-layer", type=NON_NEGATIVE_INT, default=None, metavar="K",
                   help="with --sglang-out: the model's first MoE layer (3 for DeepSeek-V3)")
    p.add_argument("--trtllm-out", default=None, metavar="YAML",
                   help="also write the recommended layout's TensorRT-LLM moe_load_balancer.yaml, fitted on the "
                        "whole trace")
    p.add_argument("--trtllm-layers", type=layer_ids_arg, default=None, metavar="IDS",
                   help="with --trtllm-out: the decoder-layer index of each MoE layer of the trace (3-60 for "
                        "DeepSeek-V3; default: a TensorRT-LLM dump's)")
    p.add_argument("--trtllm-mtp-layers", type=layer_ids_arg, default=None, metavar="IDS",
                   help="with --trtllm-out, to serve with MTP: the MTP layers' ids TensorRT-LLM also looks up (61 for "
                        "DeepSeek-V3), each holding the trace's last layer's placement unless the trace recorded it")
