"""The busiest decode card's share of a step's expert work, from the project's own placement code.

A decode routing trace (a file `eplb replay` reads, or synthetic at the model's shape: request-level traffic by
default, `traces.request_traffic`) is replayed through the configured policy exactly as `eplb replay` does
(`placement.replay.rolling_replay`: refit every `refit_every` steps on the last `window`, the per-step live router
splitting tokens over replicas, or a fixed equal split under `balance.routing: static`), and each served step's max
/ mean card load, averaged over layers, becomes that step's MoE imbalance in the decode cost model. Policy "none"
serves one replica per expert on contiguous slots with no rebalancing, as an unbalanced deployment would.

A trace file must be of the served model: its experts per layer are `model.num_routed_experts` (a trace of another
model would be balanced over the wrong experts and its imbalance reported as this model's). Its layers may be any
number (the imbalance is their mean), and it needs two steps at least (one to fit on, one to serve).

Legend: T steps, L layers, E experts.
"""

import math

import numpy as np

from placement import ClusterSpec, fit_placement
from placement.replay import rolling_replay
from placement.scoring import StepScores, score_placement
from sim.config import SimConfig, SimConfigError
from traces import TraceFormatError, load_trace
from traces.request_traffic import (MAX_LIVE_VALUES, RequestTrafficConfig, request_traffic_TLE,
                                    request_traffic_with_expectation)
from traces.synthetic import SyntheticConfig, expected_counts_TLE, generate_trace

TOKENS_PER_CARD_PER_STEP = 64  # the synthetic routing trace's step: a decode card's typical batch


def read_routing_trace(config: SimConfig) -> np.ndarray | None:
    """[T, L, E] int64 counts of `balance.routing_trace`, checked against the model, its layers evenly sampled down to
    `balance.trace_layers` when set; None when the trace is synthetic.

    Raises:
        SimConfigError: the file cannot be read, its experts per layer are not the model's, or it has one step
            where the policy needs two.
    """
    path = config.balance.routing_trace
    if path is None:
        return None
    try:
        counts_TLE = load_trace(path).counts_TLE
    except TraceFormatError as exc:
        raise SimConfigError(f"balance.routing_trace: {' '.join(str(exc).split())}") from exc
    steps, layers, experts = counts_TLE.shape
    model_experts = config.model.num_routed_experts
    if experts != model_experts:
        raise SimConfigError(f"balance.routing_trace {path} has {experts} experts per layer, the model "
                             f"(model.num_routed_experts) {model_experts}; give a routing trace of the served model, "
                             f"or set model.num_routed_experts: {experts} to simulate the trace's")
    if steps < 2 and config.balance.policy != "none":
        raise SimConfigError(f"balance.routing_trace {path} has {steps} step; the {config.balance.policy} replay "
                             f"needs at least 2 (it fits on earlier steps and serves later ones)")
    kept = config.balance.trace_layers
    if kept is not None and kept < layers:  # evenly spaced, the first and last included
        counts_TLE = counts_TLE[:, np.unique(np.linspace(0, layers - 1, kept).round().astype(int))]
    return counts_TLE


def routing_shape(config: SimConfig, counts_TLE: np.ndarray | None) -> tuple[int, int, int]:
    """(T, L, E) of the trace the replay will run: the file's, else the synthetic one's."""
    if counts_TLE is not None:
        return counts_TLE.shape
    return config.balance.steps, config.balance.layers, config.model.num_routed_experts


def decode_imbalance_T(config: SimConfig, counts_TLE: np.ndarray | None = None,
                       tokens_per_card: int = TOKENS_PER_CARD_PER_STEP) -> np.ndarray:
    """[T] float, max / mean card load of each served step (mean over layers), replayed cyclically by the decode
    units; `counts_TLE` is the file's trace (`read_routing_trace`), None for the synthetic one, whose step carries
    `tokens_per_card` tokens per card (default: the unit's typical batch)."""
    cards = config.cluster.decode_cards
    if counts_TLE is None:
        counts_TLE = synthetic_counts(config, cards, tokens_per_card)
    return served_imbalance_T(config, cards, config.decode_slots_per_card, counts_TLE,
                              node_limited=config.balance.node_limits)[0]


def synthetic_counts(config: SimConfig, cards: int, tokens_per_card: float, stage: str = "decode") -> np.ndarray:
    """[T, L, E] the synthetic routing trace at the model's shape (`balance.steps` x `balance.layers`) for a group of
    `cards` cards at `tokens_per_card` tokens per card per step, drawn from `config.seed`: under `balance.traffic`
    "requests", `stage`'s request-level traffic (`traffic_config`), else independent tokens (`traces.synthetic`)."""
    balance = config.balance
    tokens = max(1, round(tokens_per_card * cards))
    if balance.traffic == "requests":
        return request_traffic_TLE(traffic_config(config, stage, tokens))
    return generate_trace(_token_traffic(config, tokens)).counts_TLE


def synthetic_counts_with_expectation(config: SimConfig, cards: int, tokens_per_card: float,
                                      stage: str = "decode") -> tuple[np.ndarray, np.ndarray]:
    """(`synthetic_counts`' trace [T, L, E], its expected counts [T, L, E]: the generator's mean of each step before
    the token sampling, what the expectation oracle fits on)."""
    tokens = max(1, round(tokens_per_card * cards))
    if config.balance.traffic == "requests":
        return request_traffic_with_expectation(traffic_config(config, stage, tokens))
    traffic = _token_traffic(config, tokens)
    return generate_trace(traffic).counts_TLE, expected_counts_TLE(traffic)


def _token_traffic(config: SimConfig, tokens: int) -> SyntheticConfig:
    """The independent-token traffic (`traces.synthetic`) of `balance.traffic: tokens` at `tokens` tokens a step."""
    balance, model = config.balance, config.model
    skew = {} if balance.skew is None else {"skew": balance.skew}
    return SyntheticConfig(num_steps=balance.steps, num_layers=balance.layers, num_experts=model.num_routed_experts,
                           top_k=model.top_k, tokens_per_step=tokens, seed=config.seed, burst_rate=balance.burst_rate,
                           **skew)


def traffic_config(config: SimConfig, stage: str, tokens: int) -> RequestTrafficConfig:
    """The request-level traffic of `stage` ("decode" or "prefill") with about `tokens` tokens a step:

    - decode: continuous batching; a request adds 1 + draft_tokens tokens a step under speculative decoding (the
      model verifies every draft), lives for lognormal outputs of mean `balance.output_tokens` (sigma 1);
    - prefill: chunked batches of the new tokens of `capacity.prompt_tokens`-long prompts (their cached share not
      computed), lognormal with `capacity.prompt_length_spread` = E[P^2] / E[P]^2 = exp(sigma^2).

    The popularity's skew is `balance.skew`, else the fitted `traffic.skew`; the concentration
    `balance.concentration`; the bursts `balance.burst_rate`."""
    from sim.calibration import fitted

    balance, model, capacity = config.balance, config.model, config.capacity
    common = dict(num_steps=balance.steps, num_layers=balance.layers, num_experts=model.num_routed_experts,
                  top_k=model.top_k, seed=config.seed, concentration=balance.concentration,
                  skew=fitted("traffic.skew") if balance.skew is None else balance.skew,
                  burst_rate=balance.burst_rate)
    if stage == "prefill":
        prompt = max(1.0, capacity.prompt_tokens * (1.0 - capacity.cached_share))
        return RequestTrafficConfig(mode="prefill", tokens_per_step=tokens, prompt_tokens=prompt,
                                    prompt_spread=math.sqrt(math.log(capacity.prompt_length_spread)), **common)
    per_request = 1 + config.speculative.draft_tokens if config.speculative.enabled else 1
    live = max(1, round(tokens / per_request))
    values = live * balance.layers * model.num_routed_experts
    if values > MAX_LIVE_VALUES:
        raise SimConfigError(f"the decode imbalance's request-level traffic would hold {values:,} preferences "
                             f"({live:,} live requests x {balance.layers} layers x {model.num_routed_experts} "
                             f"experts; limit {MAX_LIVE_VALUES:,}): lower balance.layers, or set balance.traffic: "
                             f"tokens")
    return RequestTrafficConfig(mode="decode", tokens_per_step=live * per_request, tokens_per_request=per_request,
                                output_tokens=balance.output_tokens, output_spread=1.0, **common)


def group_cluster(config: SimConfig, cards: int, slots: int) -> ClusterSpec:
    """The group of `cards` cards with `slots` slots each, on nodes of `cluster.cards_per_node` (one node where the
    cards are not whole nodes)."""
    per_node = config.cluster.cards_per_node
    return ClusterSpec(num_gpus=cards, slots_per_gpu=slots, gpus_per_node=per_node if cards % per_node == 0 else cards)


def served_routing(config: SimConfig) -> str:
    """How a served step splits a replicated expert's tokens: the live router, or the static split."""
    return "live" if config.balance.routing == "live" else "static"


def policy_options(config: SimConfig, node_limited: bool = False) -> dict:
    """`balance.policy`'s options: cpsat's budget and the split it fits for, and node limits (every one of the
    model's expert groups on one node) where asked."""
    balance = config.balance
    options = {"work_limit": balance.work_limit, "routing": "dynamic" if balance.routing == "live" else "static"} \
        if balance.policy == "cpsat" else {}
    if node_limited:
        groups = config.model.expert_groups
        options.update({"groups": groups, "nodes_per_group": 1} if balance.policy == "cpsat" else
                       {"num_groups": groups})
    return options


def replay_window(config: SimConfig, steps: int) -> int:
    """The fit window of a replay of `steps` steps: `balance.window`, or half the steps where they are fewer than two
    windows (so that some steps are scored)."""
    return min(config.balance.window, steps // 2)


def replay_basis(config: SimConfig, steps: int) -> dict:
    """What a replay of `steps` steps rests on: {"steps", "window", "refits", "scored_steps"} (`served_scores`'s
    schedule; policy none fits nothing and scores every step)."""
    if config.balance.policy == "none":
        return {"steps": steps, "window": 0, "refits": 0, "scored_steps": steps}
    window = replay_window(config, steps)
    return {"steps": steps, "window": window, "refits": -(-(steps - window) // config.balance.refit_every),
            "scored_steps": steps - window}


def served_imbalance_T(config: SimConfig, cards: int, slots: int, counts_TLE: np.ndarray,
                       also_TLE: tuple[np.ndarray, ...] = (), node_limited: bool = False) -> list[np.ndarray]:
    """[T] imbalance of each served step (mean over layers) of `counts_TLE` [T, L, E] replayed under
    `config.balance`'s policy on a group of `cards` cards with `slots` expert slots each (a decode unit or a prefill
    instance), then of each trace of `also_TLE` (the same traffic with fewer tokens, say) served by the very
    placements fitted on `counts_TLE`: `served_scores`, each step's mean over layers."""
    return [scores.imbalance_TL.mean(axis=1)
            for scores in served_scores(config, cards, slots, counts_TLE, also_TLE, node_limited)]


def served_scores(config: SimConfig, cards: int, slots: int, counts_TLE: np.ndarray,
                  also_TLE: tuple[np.ndarray, ...] = (), node_limited: bool = False) -> list[StepScores]:
    """The served steps' scores (`placement.scoring.StepScores`: per step and layer, with each card's load) of
    `counts_TLE` [T, L, E] replayed under `config.balance`'s policy on a group of `cards` cards with `slots` expert
    slots each, then of each trace of `also_TLE` served by the very placements fitted on `counts_TLE`.
    `node_limited`: every one of the model's expert groups on one node of `cluster.cards_per_node` cards (the greedy
    hierarchical, cpsat within its nodes). Policy "none" serves every step."""
    balance = config.balance
    cluster = group_cluster(config, cards, slots)
    if balance.policy == "none":
        placement = fit_placement("trivial", counts_TLE[:1], cluster)
        return [score_placement(placement, trace, "static") for trace in [counts_TLE, *also_TLE]]
    window = replay_window(config, counts_TLE.shape[0])
    result = rolling_replay(counts_TLE, cluster, balance.policy, every=balance.refit_every, window=window,
                            routing=served_routing(config), policy_options=policy_options(config, node_limited),
                            also_served={str(index): trace for index, trace in enumerate(also_TLE)})
    return [result.held_out, *(result.held_out_served[str(index)] for index in range(len(also_TLE)))]
