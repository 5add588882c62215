"""The MoE gate: router logits -> each token's top-k experts and their weights (DeepSeek-V3's rules, optional).

Legend: N tokens, D hidden size, E experts, K top-k, Q expert groups (`n_group`).
"""

import torch

from eplb.live.moe_config import MoELayerConfig


def gate_topk(
    logits_NE: torch.Tensor, config: MoELayerConfig, correction_bias_E: torch.Tensor | None = None,
    chosen_NK: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's K experts and weights.

    Steps: scores from the logits (softmax, sigmoid or sqrt(softplus)); when `chosen_NK` [N, K] (int64 expert ids,
    duplicates allowed) is given, those are the experts (hash routing: `tid2eid[input_ids]`); else, with `n_group`
    > 1, keep only the `topk_group` groups of experts whose best two biased scores sum highest (a group's score is
    its top score when a group holds one expert), and take the top K by biased score (the bias, if any, only
    chooses); weights are the unbiased scores of the chosen experts, renormalised if `norm_topk_prob`, times
    `routed_scaling_factor`.

    Returns:
        topk_ids_NK: [N, K] int64 expert ids.
        topk_weights_NK: [N, K] float32 weights.
    """
    scores = _scores(logits_NE.float(), config.scoring)
    if chosen_NK is not None:
        return _weights(scores, chosen_NK.to(torch.int64), config)
    choice = scores if correction_bias_E is None else scores + correction_bias_E.float()
    if config.n_group > 1:
        # grouped: [N, Q, E / Q] biased scores by group; best: [N, Q] each group's score.
        grouped = choice.view(choice.shape[0], config.n_group, config.num_experts // config.n_group)
        best = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        keep = torch.zeros_like(best).scatter_(1, best.topk(config.topk_group, dim=-1).indices, 1.0)
        choice = grouped.masked_fill(keep[..., None] == 0, float("-inf")).view_as(choice)
    return _weights(scores, choice.topk(config.top_k, dim=-1).indices, config)


def _scores(logits_NE: torch.Tensor, scoring: str) -> torch.Tensor:
    if scoring == "softmax":
        return logits_NE.softmax(-1)
    if scoring == "sigmoid":
        return logits_NE.sigmoid()
    return torch.nn.functional.softplus(logits_NE).sqrt()


def _weights(scores_NE: torch.Tensor, topk_ids_NK: torch.Tensor, config: MoELayerConfig):
    """The picks and their weights: unbiased scores at the picks, renormalised if asked, times the scaling."""
    weights = scores_NE.gather(1, topk_ids_NK)
    if config.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-20)
    return topk_ids_NK, weights * config.routed_scaling_factor
