"""Hash-routed MoE layers (DeepSeek-V4's first layers): their expert loads follow from the token ids alone.

Legend: V vocabulary, E experts, K experts per token, T steps, N tokens per step, H hash layers.

A hash layer sends token v to the K experts `tid2eid[v]`, a frozen table, whatever the hidden state. So expert e's
load in a step is the number of that step's tokens whose row of the table names e, and the traffic a hash layer
will see is known from the token frequencies alone: no routing window is needed to place it. `table_steps_TE`
draws steps of N tokens from a token-count table (the recorder's token ids over any horizon, or a tokenizer's
corpus counts) and maps them through the table: steps a policy fits on (`fit_placement`) like recorded ones, with
each step's sampling spread, and as many of them as the fit wants. `hash_counts_TE` gives a step's actual loads
from its token ids.
"""

import numpy as np

from placement.errors import PlacementInfeasibleError


def check_table(tid2eid_VK: np.ndarray, num_experts: int) -> np.ndarray:
    """`tid2eid_VK` as an int64 array [V, K] of expert ids in [0, num_experts).

    Raises:
        PlacementInfeasibleError: not a 2-D integer table of expert ids in range.
    """
    table = np.asarray(tid2eid_VK)
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1 or not np.issubdtype(table.dtype, np.integer):
        raise PlacementInfeasibleError(f"tid2eid_VK must be an integer table [vocab, top_k]; got shape "
                                       f"{table.shape} {table.dtype}")
    if table.min() < 0 or table.max() >= num_experts:
        raise PlacementInfeasibleError(f"tid2eid_VK holds expert ids outside [0, {num_experts}): "
                                       f"[{table.min()}, {table.max()}]")
    return table.astype(np.int64)


def hash_counts_TE(tid2eid_VK: np.ndarray, tokens_TN: np.ndarray, num_experts: int) -> np.ndarray:
    """[T, E] int64: each step's picks per expert of a hash layer, from the step's token ids `tokens_TN` [T, N]
    (ids < 0 are padding and pick nothing)."""
    table = check_table(tid2eid_VK, num_experts)
    tokens = np.asarray(tokens_TN, dtype=np.int64)
    if tokens.ndim != 2 or tokens.max(initial=-1) >= table.shape[0]:
        raise PlacementInfeasibleError(f"tokens_TN must be token ids [steps, tokens] below the table's vocabulary "
                                       f"of {table.shape[0]}; got shape {tokens.shape}")
    steps, top_k = tokens.shape[0], table.shape[1]
    picks_TNK = table[tokens.clip(0)]
    cells = (np.arange(steps)[:, None, None] * num_experts + picks_TNK)[np.broadcast_to(tokens[..., None] >= 0,
                                                                                       picks_TNK.shape)]
    return np.bincount(cells, minlength=steps * num_experts).reshape(steps, num_experts).astype(np.int64)


def expected_load_E(tid2eid_VK: np.ndarray, token_counts_V: np.ndarray, num_experts: int) -> np.ndarray:
    """[E] float: the picks per expert the token counts `token_counts_V` [V] give (their sum's worth of tokens)."""
    table = check_table(tid2eid_VK, num_experts)
    counts = _check_token_counts(token_counts_V, table.shape[0])
    return np.bincount(table.reshape(-1), weights=np.repeat(counts, table.shape[1]), minlength=num_experts)


def table_steps_TE(tid2eid_VK: np.ndarray, token_counts_V: np.ndarray, num_experts: int, tokens_per_step: int,
                   steps: int, seed: int = 0) -> np.ndarray:
    """[steps, E] int64: steps of `tokens_per_step` tokens each, drawn from the frequencies of `token_counts_V` [V]
    (any non-negative counts, e.g. the recorder's token ids over any horizon), mapped through the table."""
    table = check_table(tid2eid_VK, num_experts)
    counts = _check_token_counts(token_counts_V, table.shape[0])
    if tokens_per_step < 1 or steps < 1:
        raise PlacementInfeasibleError(f"tokens_per_step and steps must be >= 1; got {tokens_per_step}, {steps}")
    seen = np.flatnonzero(counts)
    rng = np.random.default_rng(seed)
    tokens = seen[rng.choice(len(seen), size=(steps, tokens_per_step), p=counts[seen] / counts[seen].sum())]
    return hash_counts_TE(table, tokens, num_experts)


def _check_token_counts(token_counts_V: np.ndarray, vocab: int) -> np.ndarray:
    counts = np.asarray(token_counts_V, dtype=float)
    if counts.shape != (vocab,) or (counts < 0).any() or not counts.sum() > 0:
        raise PlacementInfeasibleError(f"token_counts_V must be [{vocab}] non-negative counts, not all zero (one per "
                                       f"token id of the table); got shape {counts.shape}")
    return counts
