"""What `scripts/hf_demo.py` reports of a generation on an EP group, against the unmodified model's in one process.

Legend: B sequences, N new tokens, F forwards of the group, L MoE layers, W ranks as first formed.
"""

import numpy as np
import torch

from eplb.engines.transformers.serving import RankGeneration


def summarize(ranks: list, tokens_ref_BN: torch.Tensor, logits_ref_BNV: torch.Tensor) -> dict:
    """The report's measured keys from the ranks' results (`RankGeneration`, or an exception for a rank that died).

    tokens: each sequence's N tokens as the rank that finished it holds them (the tokens its first rank streamed
    before dying included); max_abs_logit_diff: over every (sequence, token) logits a live rank kept;
    imbalance_measured: max / mean of the rows each member computed, mean over forwards and layers; tokens_lost:
    picks no slot computed in the forwards the group completed, plus tokens missing from the sequences.
    """
    alive = [rank for rank in ranks if isinstance(rank, RankGeneration)]
    batch, new_tokens = tokens_ref_BN.shape
    finished = {sequence: row for rank in alive for sequence, row in rank.tokens.items()}
    tokens = [finished.get(sequence, []) for sequence in range(batch)]
    diffs = [float((logits - logits_ref_BNV[sequence, index]).abs().max())
             for rank in alive for (sequence, index), logits in rank.logits.items()]
    forwards = next(rank.forwards for rank in alive if rank.forwards)
    imbalance, unserved = forward_figures(forwards)
    stats = [rank.stats for rank in alive if rank.stats]
    summary = {
        "tokens": tokens, "tokens_reference": tokens_ref_BN.tolist(),
        "tokens_identical": tokens == tokens_ref_BN.tolist(), "max_abs_logit_diff": max(diffs),
        "logits_compared": len(diffs), "layers_swapped": alive[0].layers_swapped,
        "imbalance_measured": imbalance,
        "tokens_lost": unserved + sum(new_tokens - len(row) for row in tokens),
        "forwards": len({forward for forward, _ in forwards}),
    }
    if stats:
        summary.update({"rebalances": stats[0]["rebalances"], "switch_forwards": stats[0]["switch_steps"],
                        "bytes_moved": int(sum(rank["bytes_received"] for rank in stats)),
                        "experts_moved": experts_moved(stats),
                        "requests_requeued": sum(len(rank.requeued) for rank in alive),
                        "recoveries": alive[0].recoveries})
    return summary


def experts_moved(stats: list[dict]) -> int | None:
    """Experts moved over every switch, as the group's rank 0 counted them at each (None when a rank 0 that
    counted one is gone)."""
    counted = max((rank["expert_moves"] for rank in stats), key=len)
    return sum(counted) if len(counted) == stats[0]["rebalances"] else None


def forward_figures(forwards: dict[tuple[int, int], dict]) -> tuple[float, int]:
    """(mean over forwards and layers of max / mean rows computed per member, picks not computed) from the
    (forward, original rank) records of the forwards the group completed."""
    by_forward: dict[int, list[dict]] = {}
    for (forward, _), record in sorted(forwards.items()):
        by_forward.setdefault(forward, []).append(record)
    ratios, unserved = [], 0
    for records in by_forward.values():
        computed_WL = np.array([record["computed_L"] for record in records], dtype=float)
        ratios.extend(computed_WL.max(0) / np.maximum(computed_WL.mean(0), 1e-12))
        unserved += int(sum(records[0]["picks_L"]) - computed_WL.sum())
    return float(np.mean(ratios)), unserved
