"""Expert parallelism for a transformers causal LM: each sparse MoE block becomes this project's `MoEDecodeLayer`.

Legend: L MoE layers (the placement's layers: the model's sparse blocks in depth order), E experts, K top-k,
D hidden size, F an expert's inner size, A a stack of experts, S slots of this rank.

Supported families (transformers 5.23): DeepSeek-V3 (`DeepseekV3MoE`: sigmoid gate, group-limited top-k, correction
bias, shared experts), DeepSeek-V4 (`DeepseekV4SparseMoeBlock`: sqrt(softplus) gate, correction bias or a hash table
`tid2eid` picking experts by token id, SwiGLU clamp, a shared expert) and Qwen3-MoE (`Qwen3MoeSparseMoeBlock`:
softmax top-k, optional renormalisation, no shared expert). Each block's fused expert weights (`gate_up_proj`
[E, 2F, D], rows [:F] the gate and [F:] the up projection; `down_proj` [E, D, F]) are cut into the slots this rank
holds; its gate weight, correction bias and table are copied; its shared expert stays the model's own module, added
after the routed sum as the block does. Attention and every other module stay the model's own.

Ranks split the batch (data-parallel attention): every rank runs the whole model on its own sequences, and the MoE
layers exchange the tokens over the group. Every rank must therefore run the same number of forwards (the same
prompt length and number of new tokens, no early stop on EOS), or the group's collectives hang until they time out.
DeepSeek-V4's decoder layers hand `input_ids` to their MoE block by keyword; the hash layers route by them.

transformers is imported only by the caller (this module reads the model's modules and config; it never imports
transformers), so `import eplb` never imports it.
"""

from torch import nn

from collectives import Communicator
from eplb.live.experts import ExpertWeights
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_config import MoELayerConfig
from eplb.live.moe_layer import MoEDecodeLayer
from placement import Placement

FAMILIES = ("deepseek_v3", "deepseek_v4", "qwen3_moe")


def sparse_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(decoder layer index, its sparse MoE block) of each MoE layer of `model`, in depth order.

    Raises:
        ValueError: the model is not of a supported family (`FAMILIES`), or its experts are not SwiGLU (silu).
    """
    config = model.config
    if config.model_type not in FAMILIES:
        raise ValueError(f"expert_parallel supports model types {FAMILIES}; got {config.model_type!r}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"the experts must be SwiGLU (hidden_act 'silu'); this model has {config.hidden_act!r}")
    return [(index, layer.mlp) for index, layer in enumerate(model.model.layers)
            if isinstance(layer.mlp, nn.Module) and hasattr(getattr(layer.mlp, "experts", None), "gate_up_proj")]


def is_hash_block(block: nn.Module) -> bool:
    """True for a DeepSeek-V4 hash layer (its gate holds a `tid2eid` table)."""
    return hasattr(getattr(block, "gate", None), "tid2eid")


def block_config(model_config, block: nn.Module) -> MoELayerConfig:
    """The `MoELayerConfig` that computes what `block` computes (the model's config `model_config`)."""
    experts, gate = block.experts, block.gate
    num_experts, hidden = gate.weight.shape
    common = dict(hidden_size=hidden, intermediate_size=experts.gate_up_proj.shape[1] // 2, num_experts=num_experts,
                  top_k=model_config.num_experts_per_tok)
    kind = model_config.model_type
    if kind == "deepseek_v3":
        return MoELayerConfig(**common, scoring="sigmoid", n_group=model_config.n_group,
                              topk_group=model_config.topk_group, use_correction_bias=True,
                              norm_topk_prob=model_config.norm_topk_prob,
                              routed_scaling_factor=model_config.routed_scaling_factor,
                              num_shared_experts=model_config.n_shared_experts)
    if kind == "deepseek_v4":
        hashed = is_hash_block(block)
        return MoELayerConfig(**common, scoring=model_config.scoring_func, use_correction_bias=not hashed,
                              norm_topk_prob=True,  # V4 always renormalises
                              routed_scaling_factor=model_config.routed_scaling_factor, num_shared_experts=1,
                              hash_routing=hashed, swiglu_limit=getattr(model_config, "swiglu_limit", None) or None)
    return MoELayerConfig(**common, scoring="softmax", norm_topk_prob=model_config.norm_topk_prob)


def block_experts(block: nn.Module) -> ExpertWeights:
    """The E routed experts of `block` as an `ExpertWeights` stack ([E, D, F], [E, D, F], [E, F, D]; views)."""
    gate_up_A2FD, down_ADF = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    inner = gate_up_A2FD.shape[1] // 2
    return ExpertWeights(gate_up_A2FD[:, :inner].transpose(1, 2), gate_up_A2FD[:, inner:].transpose(1, 2),
                         down_ADF.transpose(1, 2))


def expert_parallel(model: nn.Module, comm: Communicator, placement: Placement, *, routing: str = "dynamic",
                    recorder: LoadRecorder | None = None) -> list[int]:
    """Replace every sparse MoE block of `model` (in place) by a `MoEDecodeLayer` sharded by `placement`.

    Placement layer l serves the l-th sparse block in depth order; this rank keeps only its slots' experts. Called
    on every rank of the group with the same model weights and placement.

    Args:
        model: a transformers causal LM of a family in `FAMILIES`, float32 for the blocks' routing to be reproduced
            exactly (the layer's gate computes in the hidden states' dtype, then float32 scores).
        comm: this rank's communicator.
        placement: L layers (one per sparse block) of E experts, for a group of `comm.world_size` GPUs.
        routing: the replica choice of every layer (`eplb.live.ROUTING_MODES`).
        recorder: records each layer's picks (its layer index is the placement's).

    Returns:
        The decoder layer indices whose block was replaced, ascending.

    Raises:
        ValueError: the model is not supported, or the placement has not one layer per sparse block.
    """
    blocks = sparse_blocks(model)
    if placement.num_layers != len(blocks):
        raise ValueError(f"the placement has {placement.num_layers} layers; the model has {len(blocks)} sparse MoE "
                         f"blocks (layers {[index for index, _ in blocks]}): place one layer per block")
    for moe_index, (layer_index, block) in enumerate(blocks):
        config = block_config(model.config, block)
        mine = MoEDecodeLayer.slots_of_rank(placement, moe_index, comm.rank)
        gate = block.gate
        bias = getattr(gate, "e_score_correction_bias", None) if config.use_correction_bias else None
        layer = MoEDecodeLayer(
            config, placement, moe_index, comm, gate.weight.detach().clone(), block_experts(block).select(mine),
            correction_bias_E=None if bias is None else bias.detach().clone(), routing=routing, recorder=recorder,
            shared_module=getattr(block, "shared_experts", None),
            tid2eid=gate.tid2eid.detach().clone() if config.hash_routing else None)
        model.model.layers[layer_index].mlp = layer
    return [index for index, _ in blocks]
