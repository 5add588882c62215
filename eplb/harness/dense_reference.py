"""The single-process dense reference of an MoE layer: every token through its top-k experts, no placement.

Legend: N tokens, D hidden size, E experts, K top-k.
"""

import torch

from eplb.live.experts import ExpertWeights, swiglu
from eplb.live.gate import gate_topk
from eplb.live.moe_config import MoELayerConfig


def dense_moe(x_ND: torch.Tensor, gate_weight_ED: torch.Tensor, experts: ExpertWeights, config: MoELayerConfig,
              shared: ExpertWeights | None = None, correction_bias_E: torch.Tensor | None = None) -> torch.Tensor:
    """[N, D]: sum over each token's top-k experts of weight x expert(token), plus the shared experts' outputs."""
    topk_ids, topk_weights = gate_topk(x_ND @ gate_weight_ED.T, config, correction_bias_E)
    out = torch.zeros_like(x_ND)
    for expert in range(config.num_experts):
        token, which = (topk_ids == expert).nonzero(as_tuple=True)
        if len(token):
            y = swiglu(x_ND[token], experts.gate_ADF[expert], experts.up_ADF[expert], experts.down_AFD[expert])
            out.index_add_(0, token, y * topk_weights[token, which, None].to(x_ND.dtype))
    for index in range(0 if shared is None else shared.gate_ADF.shape[0]):
        out += swiglu(x_ND, shared.gate_ADF[index], shared.up_ADF[index], shared.down_AFD[index])
    return out
