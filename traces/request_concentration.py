"""How strongly a request keeps its own experts: the concentration of per-request expert preferences, estimated from
routing logs that keep sequences apart (the ESFT logs' `<task>_seq_offsets`).

Legend: S sequences (requests), L layers, E experts, K top-k, N tokens.

The model (`traces.request_traffic`): request s has, per layer, pick probabilities q_s ~ Dirichlet(alpha * p), p the
layer's popularity; every one of its tokens picks from q_s. So a request's share of expert e has mean p_e and
variance p_e (1 - p_e) rho with rho = 1 / (alpha + 1); the smaller alpha, the more a request sticks to its own experts.

The estimator is the one-way random-effects analysis of variance with unequal group sizes, per expert, in units of
picks (m_s = K n_s picks of sequence s, M their total):

    SSB_e = sum_s m_s (c_se / m_s - p_e)^2,  p_e = sum_s c_se / M
    E[SSB_e] = (S - 1) sigma_within_e^2 + (M - sum_s m_s^2 / M) sigma_between_e^2

with sigma_within_e^2 = p_e (1 - K p_e) (a token picks K distinct experts, so a pick varies less than a free draw)
and sigma_between_e^2 = rho p_e (1 - p_e). Dividing each by p_e and summing over experts and layers gives one rho:

    rho = (sum_le SSB_le / p_le - L (S - 1) (E - K)) / (L (M - sum_s m_s^2 / M) (E - 1))

Pooled over layers and experts the estimate weighs every pick alike; the per-layer values are kept for reading.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError
from traces.topk_log import topk_tasks


@dataclass(frozen=True)
class Concentration:
    """The estimate.

    Attributes:
        alpha: the Dirichlet concentration of one request's pick probabilities around the popularity (> 0; inf when
            the sequences vary no more than independent tokens would).
        rho_L: [L] the per-layer estimates of 1 / (alpha + 1) (may be <= 0 where a layer shows no excess).
        sequences, picks: S and M, the data behind it.
    """

    alpha: float
    rho_L: np.ndarray
    sequences: int
    picks: int


def estimate_concentration(counts_SLE: np.ndarray, tokens_S: np.ndarray, top_k: int) -> Concentration:
    """Estimate the per-request concentration from per-sequence pick counts (see the module docstring).

    Args:
        counts_SLE: [S, L, E] picks of each sequence per layer and expert (rows sum to top_k * tokens_S).
        tokens_S: [S] tokens of each sequence (>= 1).
        top_k: K, distinct experts a token picks.
    """
    counts = np.asarray(counts_SLE, dtype=np.float64)
    tokens = np.asarray(tokens_S, dtype=np.int64)
    if counts.ndim != 3 or tokens.shape != counts.shape[:1]:
        raise ValueError(f"counts_SLE must be [S, L, E] and tokens_S [S]; got {counts.shape} and {tokens.shape}")
    sequences, layers, experts = counts.shape
    if sequences < 2 or (tokens < 1).any() or not 1 <= top_k < experts:
        raise ValueError(f"need 2 or more sequences of >= 1 token and 1 <= top_k < experts={experts}; got "
                         f"{sequences} sequences, shortest {tokens.min() if tokens.size else 0}, top_k={top_k}")
    picks_S = (tokens * top_k).astype(np.float64)
    total = picks_S.sum()
    share_LE = counts.sum(axis=0) / total
    used = share_LE > 0
    deviation = counts / picks_S[:, None, None] - share_LE
    ssb_L = (picks_S[:, None, None] * deviation**2 / np.where(used, share_LE, 1.0)).sum(axis=(0, 2))
    within_L = (sequences - 1) * (used.sum(axis=1) - top_k)
    between = (total - (picks_S**2).sum() / total) * (used.sum(axis=1) - 1)
    rho_L = (ssb_L - within_L) / between
    rho = float((ssb_L - within_L).sum() / between.sum())
    alpha = 1.0 / rho - 1.0 if rho > 0 else float("inf")
    return Concentration(alpha=alpha, rho_L=rho_L, sequences=sequences, picks=int(total))


def sequence_counts(path: str | Path, tasks: list[str] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-sequence pick counts of a top-k id log with `<task>_seq_offsets` (the ESFT logs).

    Returns:
        counts_SLE: [S, L, E] int64 picks of each sequence, the tasks' sequences in file (or `tasks`) order.
        tokens_S: [S] int64 tokens of each sequence.
        top_k: K of the log.
    Raises:
        TraceFormatError: the file lacks the arrays, or names no such task.
    """
    file = Path(path)
    try:
        data = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TraceFormatError(f"cannot read {file}: {exc}; expected an .npz top-k id log") from None
    with data:
        available = topk_tasks(list(data.keys()))
        chosen = tasks or available
        missing = [t for t in chosen if t not in available or f"{t}_seq_offsets" not in data]
        if not chosen or missing:
            raise TraceFormatError(f"{file.name} has no <task>_topk_ids with <task>_seq_offsets for "
                                   f"{', '.join(missing) or 'any task'}; available: {', '.join(available) or 'none'}")
        ids = {t: data[f"{t}_topk_ids"].astype(np.int64) for t in chosen}
        offsets = {t: data[f"{t}_seq_offsets"].astype(np.int64) for t in chosen}
    experts = int(max(int(i.max()) for i in ids.values())) + 1
    top_k = next(iter(ids.values())).shape[2]
    counts, tokens = [], []
    for task in chosen:
        layers = ids[task].shape[0]
        for start, stop in zip(offsets[task][:-1], offsets[task][1:]):
            picks = ids[task][:, start:stop].reshape(layers, -1)
            flat = (np.arange(layers)[:, None] * experts + picks).ravel()
            counts.append(np.bincount(flat, minlength=layers * experts).reshape(layers, experts))
            tokens.append(stop - start)
    return np.stack(counts), np.asarray(tokens, dtype=np.int64), top_k
