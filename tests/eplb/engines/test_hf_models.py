"""`expert_parallel` replaces each sparse MoE block of a tiny DeepSeek-V3, DeepSeek-V4 (hash and learned layers) and
Qwen3-MoE model by a `MoEDecodeLayer` whose output equals the block's bit for bit (fp32, one rank, a placement with
replicas); the layer's new options (sqrt(softplus) scores, hash routing, the SwiGLU clamp) refuse inconsistent
settings; and neither `import eplb` nor the adapter modules import transformers."""


import numpy as np
import pytest
import torch

from eplb.live import MoEDecodeLayer, MoELayerConfig
from eplb.live.experts import ExpertWeights, swiglu
from eplb.live.gate import gate_topk
from placement import ClusterSpec, Placement


class OneRank:
    """A group of one rank, in this process: the collectives are identities."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def all_gather(self, tensor):
        return tensor[None]

    def all_to_all(self, rows, send_counts, recv_counts):
        return rows.clone()


def placement_with_replicas(layers: int, experts: int, extra: int = 3) -> Placement:
    rng = np.random.default_rng(0)
    phy2log = np.stack([np.concatenate([np.arange(experts), rng.integers(0, experts, extra)]) for _ in range(layers)])
    return Placement.equal_split(phy2log, ClusterSpec(num_gpus=1, slots_per_gpu=experts + extra), experts)


@pytest.mark.parametrize("arch, swapped, hashed", [("deepseek_v3", [1, 2], []), ("deepseek_v4", [0, 1, 2], [0]),
                                                   ("qwen3_moe", [1, 2], [])],
                         ids=["deepseek_v3", "deepseek_v4", "qwen3_moe"])
def test_each_swapped_layer_equals_the_models_own_block_bit_for_bit(arch, swapped, hashed):
    pytest.importorskip("transformers")
    from eplb.engines.transformers.generation import TINY_CONFIGS, build_model
    from eplb.engines.transformers.models import expert_parallel, is_hash_block, sparse_blocks

    torch.set_num_threads(1)
    model = build_model(arch, TINY_CONFIGS[arch], seed=0)
    blocks = sparse_blocks(model)
    assert [index for index, block in blocks if is_hash_block(block)] == hashed
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, model.config.hidden_size, generator=generator)
    ids = torch.randint(0, model.config.vocab_size, (3, 7), generator=generator)
    with torch.no_grad():
        expected = {index: block(x, input_ids=ids) if is_hash_block(block) else block(x) for index, block in blocks}
        assert expert_parallel(model, OneRank(), placement_with_replicas(len(blocks), 8)) == swapped
        for index in swapped:
            layer = model.model.layers[index].mlp
            assert isinstance(layer, MoEDecodeLayer)
            assert torch.equal(layer(x, input_ids=ids), expected[index]), f"layer {index}"


def test_a_placement_without_one_layer_per_block_is_refused():
    pytest.importorskip("transformers")
    from eplb.engines.transformers.generation import TINY_CONFIGS, build_model
    from eplb.engines.transformers.models import expert_parallel

    model = build_model("qwen3_moe", TINY_CONFIGS["qwen3_moe"], seed=0)
    with pytest.raises(ValueError, match="the placement has 3 layers; the model has 2 sparse MoE blocks"):
        expert_parallel(model, OneRank(), placement_with_replicas(3, 8))


def test_sqrtsoftplus_hash_routing_weighs_the_tables_experts_by_the_gate():
    config = MoELayerConfig(hidden_size=4, intermediate_size=4, num_experts=4, top_k=2, scoring="sqrtsoftplus",
                            norm_topk_prob=True, routed_scaling_factor=1.5, hash_routing=True)
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0]])
    ids, weights = gate_topk(logits, config, chosen_NK=torch.tensor([[3, 3]]))
    assert ids.tolist() == [[3, 3]] and torch.allclose(weights, torch.tensor([[0.75, 0.75]]))
    scores = torch.nn.functional.softplus(logits).sqrt()
    ids, weights = gate_topk(logits, config, chosen_NK=torch.tensor([[2, 0]]))
    assert torch.allclose(weights, 1.5 * scores[:, [2, 0]] / scores[:, [2, 0]].sum())


def test_the_swiglu_clamp_caps_the_gate_above_and_the_up_projection_both_sides():
    x, eye = torch.tensor([[30.0, -30.0]]), torch.eye(2)
    out = swiglu(x, eye, eye, eye, limit=10.0)  # gate = (10, -30), up = (10, -10)
    assert torch.allclose(out, torch.nn.functional.silu(torch.tensor([[10.0, -30.0]])) * torch.tensor([[10.0, -10.0]]))
    assert torch.equal(swiglu(x, eye, eye, eye), torch.nn.functional.silu(x) * x)


def test_inconsistent_hash_settings_are_refused():
    with pytest.raises(ValueError, match="no n_group > 1 and no correction bias"):
        MoELayerConfig(hidden_size=4, intermediate_size=4, num_experts=4, top_k=2, hash_routing=True,
                       use_correction_bias=True)
    config = MoELayerConfig(hidden_size=4, intermediate_size=4, num_experts=4, top_k=2, hash_routing=True)
    placement = placement_with_replicas(1, 4)
    weights = ExpertWeights.random(7, 4, 4, seed=0)
    args = (config, placement, 0, OneRank(), torch.randn(4, 4), weights)
    with pytest.raises(ValueError, match="a hash layer needs its table"):
        MoEDecodeLayer(*args)
    with pytest.raises(ValueError, match="outside"):
        MoEDecodeLayer(*args, tid2eid=torch.full((10, 2), 4))
    layer = MoEDecodeLayer(*args, tid2eid=torch.zeros(10, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="needs input_ids"):
        layer(torch.randn(3, 4))
    assert layer(torch.randn(3, 4), input_ids=torch.tensor([1, 2, 3])).shape == (3, 4)


def test_a_hash_layer_counts_its_token_ids_into_the_recorders_table_once_per_token():
    from eplb.live import LoadRecorder

    config = MoELayerConfig(hidden_size=4, intermediate_size=4, num_experts=4, top_k=2, hash_routing=True)
    placement = placement_with_replicas(2, 4)
    recorder = LoadRecorder(4, 2, 4, vocab_size=10)
    table = torch.tensor([[v % 4, (v + 1) % 4] for v in range(10)])
    layers = [MoEDecodeLayer(config, placement, index, OneRank(), torch.randn(4, 4),
                             ExpertWeights.random(7, 4, 4, seed=index), tid2eid=table, recorder=recorder)
              for index in range(2)]
    ids = torch.tensor([[1, 1, 7], [0, 9, 1]])
    for layer in layers:  # two hash layers see the same ids: each id counts once
        layer(torch.randn(2, 3, 4), input_ids=ids)
    assert recorder.token_counts_V.tolist() == [1, 3, 0, 0, 0, 0, 0, 1, 0, 1]
    assert LoadRecorder(4, 2, 4).token_counts_V is None
