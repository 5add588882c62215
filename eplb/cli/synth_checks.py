"""`eplb synth --requests`: the flags each mode uses, and its work bounded before it starts.

Prefill batches take whole prompts (their output lengths play no part), decode steps keep live requests until their
output is done (their prompt lengths play no part): a flag of the other mode is refused, not ignored.

The work is drawing each request's pick probabilities, L x E values per request (`traces.request_traffic`): prefill
draws the requests of T batches of N tokens, about N / prompt length each; decode draws the B = N /
tokens_per_request live requests once and, every step, the B / (output length / tokens_per_request) that finished.
A run estimated past `MAX_DRAWN_VALUES` is refused in one line with the estimate and the flags that lower it.
"""

import argparse
import math

from traces import TraceFormatError, load_request_trace
from traces.request_traffic import RequestTrafficConfig

# Values a run may draw: about 4 to 8 minutes at the 50-120 ns a value takes here (CPU, one core).
MAX_DRAWN_VALUES = 1 << 32
SECONDS_PER_VALUE = 1e-7

# Flags that shape only one mode's requests, by argparse destination.
MODE_ONLY = {"tokens_per_request": ("--tokens-per-request", "decode"), "output_tokens": ("--output-tokens", "decode"),
             "prompt_tokens": ("--prompt-tokens", "prefill")}


def check_mode_flags(args: argparse.Namespace) -> None:
    """`TraceFormatError` naming a flag given that `--requests` MODE does not use."""
    for dest, (flag, mode) in MODE_ONLY.items():
        if getattr(args, dest) is not None and args.requests != mode:
            raise TraceFormatError(f"{flag} applies to --requests {mode} only (--requests {args.requests} does not "
                                   f"use it); drop it or use --requests {mode}")


def check_work(config: RequestTrafficConfig) -> None:
    """`TraceFormatError` when `config` would draw more than MAX_DRAWN_VALUES values, with the estimate and the fix."""
    prompt, output = _mean_lengths(config)
    per_request = config.num_layers * config.num_experts
    if config.mode == "prefill":
        requests = config.num_steps * (config.tokens_per_step / prompt + 1)
        fix = "lower --steps, --tokens-per-step or --layers, or raise --prompt-tokens"
    else:
        live = config.tokens_per_step // config.tokens_per_request
        life = max(1.0, output / config.tokens_per_request)  # steps a request stays
        requests = live + config.num_steps * live / life
        fix = "lower --steps, --tokens-per-step or --layers, or raise --output-tokens"
    values = requests * per_request
    if values > MAX_DRAWN_VALUES:
        hours = values * SECONDS_PER_VALUE / 3600
        raise TraceFormatError(
            f"--requests {config.mode} would draw about {requests:.3g} requests' preferences over {config.num_layers} "
            f"layers x {config.num_experts} experts ({values:.3g} values, about {_duration(hours)} on one core), more "
            f"than the {MAX_DRAWN_VALUES:.3g} a run may draw; {fix}")


def _mean_lengths(config: RequestTrafficConfig) -> tuple[float, float]:
    """(mean prompt, mean output) tokens of the requests: the request trace's, else the configured means."""
    if config.request_trace is None:
        return config.prompt_tokens, config.output_tokens
    requests = load_request_trace(config.request_trace)
    return (math.fsum(r.input_tokens for r in requests) / len(requests),
            math.fsum(r.output_tokens for r in requests) / len(requests))


def _duration(hours: float) -> str:
    return f"{hours * 60:.0f} minutes" if hours < 2 else f"{hours:.3g} hours"
