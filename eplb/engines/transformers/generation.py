"""Greedy generation with a tiny transformers MoE model, whole in one process or expert-parallel on a group: what
`scripts/hf_demo.py` and its tests run.

Legend: B sequences, N new tokens (decode steps), T forwards of the model (N of them), L MoE layers, E experts,
G ranks. Vocabulary-sized dimensions are written out (`vocab`).

Every process builds the same model from the seed (`build_model`), so no weight travels; each rank keeps its
contiguous share of the B sequences (`rank_rows`) and generates them with its MoE blocks replaced by
`expert_parallel` (`hf_serving`). transformers is imported inside the functions that build models, never by
importing this module.
"""

import torch

from eplb.engines.transformers.models import sparse_blocks
from eplb.live.load_recorder import count_picks_E

_COMMON = dict(vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3,
               max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               initializer_range=0.1,  # 0.02 gives near-uniform top-k weights; a wrong weight would barely show
               experts_implementation="eager")

# The tiny configs (E = 8 experts, K = 2, 3 layers) passed to `AutoConfig.for_model(arch, **config)`.
TINY_CONFIGS = {
    "deepseek_v3": dict(_COMMON, intermediate_size=128, first_k_dense_replace=1,  # layer 0 dense, 1 and 2 MoE
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
                        n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                        kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                        num_nextn_predict_layers=0),
    "deepseek_v4": dict(_COMMON, mlp_layer_types=["hash_moe", "moe", "moe"],
                        layer_types=["sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention"],
                        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                        num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32, o_groups=2,
                        o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, sliding_window=16,
                        hc_mult=2, hc_sinkhorn_iters=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                        scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=10.0,
                        num_nextn_predict_layers=0),
    "qwen3_moe": dict(_COMMON, intermediate_size=128, decoder_sparse_step=1, mlp_only_layers=[0],  # layer 0 dense
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True),
}

PERTURBATION = ("after construction, with torch.Generator().manual_seed(seed): every gate's e_score_correction_bias "
                "(zero at init) <- (uniform - 0.5) * 0.1, and each row of a hash gate's tid2eid (zero at init: every "
                "token would pick expert 0 twice) <- the first K of a random permutation of the E experts")


def build_model(arch: str, config: dict, seed: int):
    """`torch.manual_seed(seed); AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config))` in float32,
    in eval mode, with its zero-initialised routing buffers perturbed as `PERTURBATION` says."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, block in sparse_blocks(model):
            gate = block.gate
            if hasattr(gate, "e_score_correction_bias"):
                bias = gate.e_score_correction_bias
                bias.copy_((torch.rand(bias.shape, generator=generator) - 0.5) * 0.1)
            if hasattr(gate, "tid2eid"):
                experts, (vocab, top_k) = gate.weight.shape[0], gate.tid2eid.shape
                gate.tid2eid.copy_(torch.stack([torch.randperm(experts, generator=generator)[:top_k]
                                                for _ in range(vocab)]))
    return model


def rank_rows(batch: int, world_size: int, rank: int) -> slice:
    """The sequences rank `rank` generates: a contiguous share of the B, the first B % G ranks one more."""
    base, extra = divmod(batch, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def greedy(model, prompt_BS: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy generation of exactly `new_tokens` tokens (no stop on EOS, so that every rank runs the same
    forwards): tokens [B, N] int64 and the logits each was picked from [B, N, vocab] float32."""
    with torch.no_grad():
        out = model.generate(prompt_BS, attention_mask=torch.ones_like(prompt_BS), max_new_tokens=new_tokens,
                             do_sample=False, eos_token_id=None, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[:, prompt_BS.shape[1]:], torch.stack(out.logits, dim=1).float()


def record_picks(model) -> tuple[list[list[torch.Tensor]], list]:
    """Hooks on the gates of `model`'s sparse blocks: per forward, each layer's picks per expert [E] (into the
    returned list, one list of L tensors per forward); remove the returned handles when done."""
    per_forward: list[list[torch.Tensor]] = []
    blocks = sparse_blocks(model)
    handles = []
    for index, (_, block) in enumerate(blocks):
        experts = block.gate.weight.shape[0]

        def hook(module, args, output, index=index, experts=experts):
            if index == 0:
                per_forward.append([])
            per_forward[-1].append(count_picks_E(output[-1], experts))

        handles.append(block.gate.register_forward_hook(hook))
    return per_forward, handles
