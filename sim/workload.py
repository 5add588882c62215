"""The simulator's requests: a trace read by `traces.request_trace`, or synthetic multi-turn sessions.

Synthetic sessions: conversations start as a Poisson process (optionally modulated by a daily curve); each is chat
or agent; each turn resends the whole history (earlier prompts and replies) plus new tokens, so a returning turn
can reuse the cached prefix. Prompts are cut into 512-token blocks whose ids are stable along a session (block k of
session s is the same block in every later turn) except the last, partial block, which changes as the history
grows, as Mooncake's `hash_ids` behave. The next turn arrives after the reply would take at
`TYPICAL_OUTPUT_TOKENS_PER_S` plus a think time (an open loop: arrivals do not wait on the simulated service); that
speed is DeepSeek's published per-user one (docs/simulator.md, 'Workload').
"""

import math

import numpy as np

from sim.config import SimConfig, SimConfigError, SyntheticWorkload
from traces.errors import TraceFormatError
from traces.request_trace import Request, load_request_trace

TYPICAL_OUTPUT_TOKENS_PER_S = 20.0  # the reply time a user waits before the next turn (DeepSeek's published speed)
BLOCK_ID_STRIDE = 1 << 20  # block ids: session * stride + position (a partial block gets a fresh id per turn)


def trace_requests(config: SimConfig) -> list[Request] | None:
    """The requests of `workload.trace` arriving within [0, config.duration_s) once rescaled, in arrival order;
    None when the workload is synthetic.

    Raises:
        SimConfigError: the trace cannot be read (the message names the key, the file and the line).
    """
    workload = config.workload
    if workload.trace is None:
        return None
    try:
        requests = load_request_trace(workload.trace, traffic_class=workload.trace_class)
    except TraceFormatError as exc:
        raise SimConfigError(f"workload.trace: {' '.join(str(exc).split())}") from exc
    scaled = [_rescaled(r, workload.time_scale) for r in requests]
    return [r for r in scaled if r.arrival_s < config.duration_s]


def synthetic_requests(workload: SyntheticWorkload, duration_s: float, block_tokens: int, seed: int) -> list[Request]:
    """Turns of sessions starting in [0, duration_s), those arriving before duration_s, in arrival order."""
    rng = np.random.default_rng([seed, 7])
    requests: list[Request] = []
    fresh_block = iter(range(1 << 40, 1 << 62))
    for session, start in enumerate(_session_starts(workload, duration_s, rng)):
        kind = "agent" if rng.random() < workload.agent_share else "chat"
        turns = int(rng.geometric(1.0 / max(1.0, workload.turns_mean[kind])))
        history, arrival = 0, start
        for turn in range(turns):
            mean_new = workload.first_input_tokens[kind] if turn == 0 else workload.turn_input_tokens[kind]
            new_tokens = max(1, int(rng.exponential(mean_new)))
            output = max(1, int(rng.exponential(workload.output_tokens[kind])))
            prompt = history + new_tokens
            full = prompt // block_tokens
            blocks = tuple(session * BLOCK_ID_STRIDE + k for k in range(full))
            if prompt % block_tokens:
                blocks += (next(fresh_block),)
            if arrival >= duration_s:
                break
            requests.append(Request(arrival_s=float(arrival), input_tokens=prompt, output_tokens=output,
                                    block_hashes=blocks, traffic_class=kind,
                                    images=int(rng.poisson(workload.images_per_request)), session=session))
            history = prompt + output
            arrival += output / TYPICAL_OUTPUT_TOKENS_PER_S + rng.exponential(workload.think_time_s[kind])
    requests.sort(key=lambda r: (r.arrival_s, r.session))
    return requests


def daily_rate_factor(t_s, peak_to_mean: float, peak_hour: float = 15.0):
    """Load at time of day `t_s` (seconds from midnight; a float, or an array of them) over the daily mean: a
    cosine with its peak at `peak_hour`."""
    amplitude = min(1.0, peak_to_mean - 1.0)
    cos = np.cos if isinstance(t_s, np.ndarray) else math.cos
    return 1.0 + amplitude * cos(2 * math.pi * (t_s / 86400.0 - peak_hour / 24.0))


def _session_starts(workload: SyntheticWorkload, duration_s: float, rng: np.random.Generator) -> list[float]:
    """Poisson session starts at `sessions_per_s`, thinned by the daily curve when it is on."""
    peak = workload.sessions_per_s * (1 + min(1.0, workload.daily_peak_to_mean - 1) if workload.daily_curve else 1)
    starts, t = [], 0.0
    while True:
        t += rng.exponential(1.0 / peak)
        if t >= duration_s:
            return starts
        if not workload.daily_curve or rng.random() < (
                workload.sessions_per_s * daily_rate_factor(t, workload.daily_peak_to_mean) / peak):
            starts.append(t)


def _rescaled(request: Request, time_scale: float) -> Request:
    if time_scale == 1.0:
        return request
    return Request(request.arrival_s / time_scale, request.input_tokens, request.output_tokens, request.block_hashes,
                   request.traffic_class, request.images, request.session)
