"""The hf demo's report counts a pick no slot computed, and a token a sequence lacks, as lost."""

import torch

from eplb.engines.transformers.serving import RankGeneration
from eplb.engines.transformers.summary import forward_figures, summarize


def test_forward_figures_take_max_over_mean_per_layer_and_count_unserved_picks():
    records = {(0, 0): {"computed_L": [3, 1], "picks_L": [4, 4]}, (0, 1): {"computed_L": [1, 3], "picks_L": [4, 4]},
               (1, 0): {"computed_L": [2, 2], "picks_L": [4, 4]}}  # forward 1: rank 1's record is missing
    imbalance, unserved = forward_figures(records)
    assert unserved == 4  # forward 1: 8 picks, 4 rows computed
    assert abs(imbalance - (1.5 + 1.5 + 1.0 + 1.0) / 4) < 1e-12


def test_summarize_counts_missing_tokens_as_lost_and_compares_the_kept_logits():
    logits_ref_BNV = torch.zeros(2, 2, 3)
    rank = RankGeneration(tokens={0: [5, 6]}, logits={(0, 0): torch.tensor([0.0, 1e-3, 0.0])}, layers_swapped=[1],
                          forwards={(0, 0): {"computed_L": [2], "picks_L": [2]}})
    summary = summarize([rank, RuntimeError("killed")], torch.tensor([[5, 6], [7, 8]]), logits_ref_BNV)
    assert summary["tokens"] == [[5, 6], []] and not summary["tokens_identical"]
    assert summary["tokens_lost"] == 2 and summary["logits_compared"] == 1
    assert abs(summary["max_abs_logit_diff"] - 1e-3) < 1e-9
