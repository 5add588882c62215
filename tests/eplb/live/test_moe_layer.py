"""The MoE decode layer on real Gloo processes equals the single-process dense layer (fp32, max error <= 1e-5) in
every routing mode, with and without shared experts, with uneven token counts and a rank with no tokens; every rank
plans the same quotas and each slot computes exactly its quota; a recorder of the group's counts holds on every
rank what the ranks' own recorders sum to; tokens shaped [batch, seq, hidden] give the flattened tokens' output."""

import numpy as np
import pytest
import torch

from collectives import run_local_group
from eplb.live import LoadRecorder, MoEDecodeLayer, MoELayerConfig
from eplb.harness.dense_reference import dense_moe
from eplb.live.experts import ExpertWeights
from placement import ClusterSpec, PlacementFormatError, fit_placement

HIDDEN, INNER, EXPERTS = 16, 24, 8
CONFIGS = {
    "softmax": MoELayerConfig(hidden_size=HIDDEN, intermediate_size=INNER, num_experts=EXPERTS, top_k=2),
    "deepseek-v3-like": MoELayerConfig(hidden_size=HIDDEN, intermediate_size=INNER, num_experts=EXPERTS, top_k=3,
                                       scoring="sigmoid", n_group=4, topk_group=2, use_correction_bias=True,
                                       norm_topk_prob=True, routed_scaling_factor=2.5, num_shared_experts=1),
}


def model_weights(config: MoELayerConfig, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    gate = torch.randn(config.num_experts, config.hidden_size, generator=generator)
    bias = torch.randn(config.num_experts, generator=generator) * 0.1 if config.use_correction_bias else None
    experts = ExpertWeights.random(config.num_experts, config.hidden_size, config.intermediate_size, seed + 1)
    shared = ExpertWeights.random(config.num_shared_experts, config.hidden_size, 2 * config.intermediate_size,
                                  seed + 2) if config.num_shared_experts else None
    return gate, bias, experts, shared


def tokens_of(tokens_per_rank: list[int], seed: int = 5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sum(tokens_per_rank), HIDDEN, generator=generator)


def placement_for(world_size: int, slots: int, policy: str):
    counts = np.random.default_rng(1).poisson(np.linspace(40, 2, EXPERTS), size=(20, 1, EXPERTS))
    return fit_placement(policy, counts, ClusterSpec(num_gpus=world_size, slots_per_gpu=slots))


MODES = [(config_name, routing) for config_name in sorted(CONFIGS) for routing in ("static", "dynamic", "oblivious")]


def run_layer_in_every_mode(comm, placement, tokens_per_rank):
    """This rank's output, planned quotas and computed rows for each (config, routing) of MODES."""
    results = {}
    for config_name, routing in MODES:
        config = CONFIGS[config_name]
        gate, bias, experts, shared = model_weights(config)
        mine = MoEDecodeLayer.slots_of_rank(placement, 0, comm.rank)
        layer = MoEDecodeLayer(config, placement, 0, comm, gate, experts.select(mine), shared_experts=shared,
                               correction_bias_E=bias, routing=routing)
        start = sum(tokens_per_rank[: comm.rank])
        x = tokens_of(tokens_per_rank)[start : start + tokens_per_rank[comm.rank]]
        out = layer(x)
        results[config_name, routing] = (out, layer.last_step["quota_P"], layer.last_step["computed_S"])
    return results


CASES = [
    (2, 5, "deepseek", [7, 5]),
    (4, 3, "deepseek", [6, 0, 9, 3]),
    (4, 3, "trivial", [1, 4, 0, 8]),
]


@pytest.mark.parametrize(("world_size", "slots", "policy", "tokens_per_rank"), CASES,
                         ids=["2-ranks", "4-ranks-one-empty", "4-ranks-trivial-placement"])
def test_layer_equals_the_dense_reference_and_computes_the_planned_tokens_in_every_mode(world_size, slots, policy,
                                                                                        tokens_per_rank):
    placement = placement_for(world_size, slots, policy)
    by_rank = run_local_group(run_layer_in_every_mode, world_size, placement, tokens_per_rank)
    for config_name, routing in MODES:
        config = CONFIGS[config_name]
        gate, bias, experts, shared = model_weights(config)
        expected = dense_moe(tokens_of(tokens_per_rank), gate, experts, config, shared, bias)
        results = [ranks[config_name, routing] for ranks in by_rank]
        got = torch.cat([out for out, _, _ in results])
        assert (got - expected).abs().max().item() <= 1e-5, (config_name, routing)
        quotas = [quota for _, quota, _ in results]
        assert all(torch.equal(quota, quotas[0]) for quota in quotas), f"ranks planned different quotas: {routing}"
        assert quotas[0].sum().item() == sum(tokens_per_rank) * config.top_k
        for rank, (_, quota, computed) in enumerate(results):
            assert computed.tolist() == quota[rank * slots : (rank + 1) * slots].tolist(), (config_name, routing)


def record_both_scopes(comm, placement, tokens_per_rank):
    """This rank's window from a rank-scope recorder (all-reduced) and from a group-scope one, over 3 steps."""
    config = CONFIGS["softmax"]
    gate, _, experts, _ = model_weights(config)
    mine = experts.select(MoEDecodeLayer.slots_of_rank(placement, 0, comm.rank))
    recorders = {scope: LoadRecorder(4, 1, EXPERTS, scope=scope) for scope in ("rank", "group")}
    layers = {scope: MoEDecodeLayer(config, placement, 0, comm, gate, mine, recorder=recorder)
              for scope, recorder in recorders.items()}
    for step in range(3):
        start = sum(tokens_per_rank[: comm.rank])
        x = tokens_of(tokens_per_rank, seed=step)[start : start + tokens_per_rank[comm.rank]]
        for scope in layers:
            layers[scope](x)
            recorders[scope].next_step()
    return comm.all_reduce_sum(recorders["rank"].counts_TLE()), recorders["group"].counts_TLE()


def test_a_group_recorder_holds_the_groups_counts_on_every_rank():
    placement = placement_for(3, 4, "deepseek")
    for summed, group in run_local_group(record_both_scopes, 3, placement, [5, 0, 7]):
        assert group.sum() == 3 * 12 * CONFIGS["softmax"].top_k
        assert torch.equal(summed, group)


def batched_and_flat(comm, placement):
    """This rank's output for its tokens as [batch, seq, D] (2 x 3 on rank 0, 1 x 2 on rank 1), and for the same
    tokens flattened to [N, D]."""
    config = CONFIGS["deepseek-v3-like"]
    gate, bias, experts, shared = model_weights(config)
    mine = experts.select(MoEDecodeLayer.slots_of_rank(placement, 0, comm.rank))
    layer = MoEDecodeLayer(config, placement, 0, comm, gate, mine, shared_experts=shared, correction_bias_E=bias)
    batch, seq = [(2, 3), (1, 2)][comm.rank]
    x_BSD = tokens_of([batch * seq], seed=comm.rank).view(batch, seq, HIDDEN)
    return layer(x_BSD), layer(x_BSD.reshape(-1, HIDDEN))


def test_tokens_shaped_batch_seq_hidden_give_the_flattened_tokens_output_in_their_shape():
    for batched, flat in run_local_group(batched_and_flat, 2, placement_for(2, 5, "deepseek")):
        assert batched.shape[:-1] in ((2, 3), (1, 2)) and batched.shape[-1] == HIDDEN
        assert torch.equal(batched.reshape(-1, HIDDEN), flat)


def raise_on_rank_one(comm, placement):
    config = CONFIGS["softmax"]
    gate, bias, experts, shared = model_weights(config)
    mine = MoEDecodeLayer.slots_of_rank(placement, 0, comm.rank)
    layer = MoEDecodeLayer(config, placement, 0, comm, gate, experts.select(mine))
    x = tokens_of([4, 4])[:4]
    if comm.rank == 1:
        x = x[:, :3]  # a bug: the wrong hidden size
    return layer(x)


def test_a_rank_that_raises_makes_the_other_fail_promptly():
    results = run_local_group(raise_on_rank_one, 2, placement_for(2, 5, "deepseek"), timeout_s=3.0,
                              allow_failures=True)
    assert isinstance(results[1], RuntimeError)
    assert "rank 0 of 2: all_gather" in str(results[0])


def test_a_placement_for_another_group_or_model_is_refused_before_anything_runs():
    placement = placement_for(2, 5, "deepseek")
    gate, _, experts, _ = model_weights(CONFIGS["softmax"])

    class FourRanks:
        rank, world_size, device = 0, 4, torch.device("cpu")

    with pytest.raises(PlacementFormatError, match="2 GPUs, the EP group has 4 ranks"):
        MoEDecodeLayer(CONFIGS["softmax"], placement, 0, FourRanks(), gate, experts.select(torch.arange(5)))
    other = MoELayerConfig(hidden_size=HIDDEN, intermediate_size=INNER, num_experts=16, top_k=2)
    with pytest.raises(PlacementFormatError, match="8 experts, the model has 16; .*no layer 3"):
        MoEDecodeLayer(other, placement, 3, FourRanks(), torch.zeros(16, HIDDEN), experts.select(torch.arange(5)))
