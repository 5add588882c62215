"""The busiest decode card's share of a step's expert work, from the project's own placement code.

A decode routing trace (a file in issue 2's formats, or synthetic at the model's shape) is replayed through the
configured policy exactly as `eplb replay` does (`placement.replay.rolling_replay`: refit every `refit_every` steps
on the last `window`, the per-step router splitting tokens over replicas), and each served step's max / mean card
load, averaged over layers, becomes that step's MoE imbalance in the decode cost model. Policy "none" serves one
replica per expert on contiguous slots with no rebalancing, as an unbalanced deployment would.

Legend: T steps, L layers, E experts.
"""

import numpy as np

from placement import ClusterSpec, fit_placement
from placement.replay import rolling_replay
from placement.scoring import score_placement
from sim.config import SimConfig
from traces import load_trace
from traces.synthetic import SyntheticConfig, generate_trace


def decode_imbalance_T(config: SimConfig, tokens_per_step: int) -> np.ndarray:
    """[T] float, max / mean card load of each served step (mean over layers), replayed cyclically by the decode
    units; `tokens_per_step` is the unit's typical batch x top-k / top-k (tokens, not picks)."""
    balance, model = config.balance, config.model
    cards = config.cluster.decode_cards
    if balance.routing_trace is not None:
        counts_TLE = load_trace(balance.routing_trace).counts_TLE
    else:
        counts_TLE = generate_trace(SyntheticConfig(
            num_steps=balance.steps, num_layers=balance.layers, num_experts=model.num_routed_experts, top_k=model.top_k,
            tokens_per_step=max(tokens_per_step, 1), seed=config.seed)).counts_TLE
    num_experts = counts_TLE.shape[2]
    slots = balance.slots_per_card or -(-num_experts // cards) + (0 if balance.policy == "none" else 1)
    gpus_per_node = 8 if cards % 8 == 0 else cards
    cluster = ClusterSpec(num_gpus=cards, slots_per_gpu=slots, gpus_per_node=gpus_per_node)
    if balance.policy == "none":
        placement = fit_placement("trivial", counts_TLE[:1], cluster)
        return score_placement(placement, counts_TLE, "static").imbalance_TL.mean(axis=1)
    options = {"time_limit_s": balance.time_limit_s, "routing": "dynamic"} if balance.policy == "cpsat" else {}
    window = min(balance.window, counts_TLE.shape[0] // 2)
    result = rolling_replay(counts_TLE, cluster, balance.policy, every=balance.refit_every, window=window,
                            routing="live", policy_options=options)
    return result.held_out.imbalance_TL.mean(axis=1)
