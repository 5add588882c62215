"""The simulator's cost model: its calibration read from the declared file, and its shape.

Published figures it is fitted to or checked against are anchors (sim/anchors/anchors.yaml), tested in
tests/sim/test_validation.py. Here: DeepSeek's decode unit (Day-6 post, Mar 2025) sizes one check,
EP144 on 18 H800 nodes with 32 redundant experts, 14.8k output tok/s per node at 21 tok/s per user, KV length 4,989.
"""

import numpy as np
import pytest

from sim.calibration import load_calibration
from sim.cost_model import (MICRO_BATCHES, StepCost, all_to_all_latency_seconds, decode_step_seconds,
                            kv_cache_read_seconds, max_decode_batch, prefill_seconds, remote_domains_per_token,
                            vision_encode_seconds)
from sim.hardware import CALIBRATED, PROFILES, Efficiency
from sim.model_profile import ModelProfile

V3 = ModelProfile()
H800 = PROFILES["H800"]
ASCEND = PROFILES["Ascend910C"]

# DeepSeek's decode unit (Day-6 post)
DS_KV_LENGTH = 4989
DS_DECODE_TOK_S_PER_NODE = 14_800
DS_TOK_S_PER_USER = 21.0  # middle of 20-22
DS_DECODE_NODES = 18


def _deepseek_decode_unit() -> tuple[int, StepCost]:
    """Sequences and step cost of one EP144 decode unit at DeepSeek's per-node rate and per-user speed."""
    sequences = round(DS_DECODE_TOK_S_PER_NODE / DS_TOK_S_PER_USER * DS_DECODE_NODES)
    cost = decode_step_seconds(V3, H800, 8 * DS_DECODE_NODES, sequences, sequences * DS_KV_LENGTH,
                               redundant_experts=32)
    return sequences, cost


# ---- the model profile -----------------------------------------------------------------------------------------


def test_deepseek_v3_profile_has_671b_total_and_37b_active_parameters():
    assert V3.total_params() / 1e9 == pytest.approx(671.0, abs=0.5)
    assert V3.active_params_per_token() / 1e9 == pytest.approx(37.5, abs=0.6)


@pytest.mark.parametrize("dtype, expected", [("bf16", 61 * 576 * 2), ("fp8", 61 * 576)], ids=["bf16", "fp8"])
def test_kv_cache_holds_576_mla_values_per_token_and_layer(dtype, expected):
    model = ModelProfile(kv_cache_dtype=dtype)
    assert model.kv_bytes_per_token() == expected
    assert model.kv_bytes(1000) == 1000 * expected


def test_sliding_window_layers_cache_at_most_the_window():
    model = ModelProfile(sliding_window_share=0.5, sliding_window=128)
    counts = model.layer_counts()
    assert counts == {"full": 31, "sliding": 30, "compressed": 0}
    per_layer = V3.kv_bytes_per_token_per_layer
    assert model.kv_bytes(10_000) == (31 * 10_000 + 30 * 128) * per_layer
    assert model.kv_bytes(100) == 61 * 100 * per_layer  # shorter than the window: every layer holds it all


def test_sliding_window_layers_shrink_the_kv_cache_and_prefill_decoder_flops():
    sliding = ModelProfile(sliding_window_share=0.5)
    assert sliding.kv_bytes(5000) < 0.55 * V3.kv_bytes(5000)
    assert sliding.prefill_flops(2000, 3000).total < V3.prefill_flops(2000, 3000).total
    assert sliding.flops_per_token(5000).attention_core < 0.55 * V3.flops_per_token(5000).attention_core


def test_compressed_layers_cache_one_entry_per_ratio_tokens():
    model = ModelProfile(compressed_layers=(10, 20), compression_ratio=4)
    per_layer = V3.kv_bytes_per_token_per_layer
    assert model.kv_bytes(4000) == (59 * 4000 + 2 * 1000) * per_layer


def test_a_layer_cannot_be_both_sliding_and_compressed():
    with pytest.raises(ValueError, match="both sliding and compressed"):
        ModelProfile(sliding_window_layers=(3, 4), compressed_layers=(4,))


# ---- calibration on DeepSeek's H800 fleet ----------------------------------------------------------------------


def test_calibrated_factors_are_the_declared_calibration():
    # every factor is read from sim/calibration.yaml; tests/sim/test_validation.py checks the file
    # against its anchors
    constants = load_calibration()
    assert CALIBRATED.model_dump() == {name: constants[f"efficiency.{name}"].value for name in Efficiency.model_fields}


def test_calibrated_network_factor_is_deepep_39_of_50_gb_s():
    assert CALIBRATED.network == pytest.approx(39 / 50)


def test_deepseek_decode_fits_in_h800_memory():
    sequences, _ = _deepseek_decode_unit()
    assert max_decode_batch(V3, H800, 144, DS_KV_LENGTH, redundant_experts=32) >= sequences


def test_the_all_to_all_floor_is_what_deepeps_latencies_leave_after_their_bytes():
    # DeepEP's low-latency table (H800, 128 tokens a rank, EP16-256): the fitted floor makes the modelled calls'
    # mean the table's; each call within 15%; the floor is what a call of almost no tokens costs
    published = {16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}
    modelled = {cards: all_to_all_latency_seconds(V3, H800, cards, 128) for cards in published}
    assert sum(1e6 * sum(calls) for calls in modelled.values()) == pytest.approx(
        sum(sum(calls) for calls in published.values()), rel=0.005)
    for cards, calls in published.items():
        for seconds, us in zip(modelled[cards], calls):
            assert 1e6 * seconds == pytest.approx(us, rel=0.15), cards
    assert 0 < CALIBRATED.all_to_all_floor_us < min(min(calls) for calls in published.values())
    tiny = all_to_all_latency_seconds(V3, H800, 256, 1e-3)
    assert tiny == pytest.approx((CALIBRATED.all_to_all_floor_us * 1e-6,) * 2, rel=1e-3)
    assert all_to_all_latency_seconds(V3, H800, 1, 128) == (0.0, 0.0)  # one card sends nothing


def test_a_pass_pays_the_fixed_time_per_layer_and_micro_batch_whatever_its_work():
    layer_s = CALIBRATED.layer_overhead_us * 1e-6
    tiny = decode_step_seconds(V3, H800, 144, 144, 144 * 4096)
    large = decode_step_seconds(V3, H800, 144, 144 * 128, 144 * 128 * 4096)
    assert tiny.fixed_s == large.fixed_s == pytest.approx(V3.num_layers * MICRO_BATCHES * layer_s)
    assert decode_step_seconds(V3, H800, 144, 144, 144 * 4096, overlap=False).fixed_s == pytest.approx(
        V3.num_layers * layer_s)
    assert prefill_seconds(V3, H800, 32, [4096] * 32).fixed_s == tiny.fixed_s
    # a small batch is mostly fixed time (doubling it costs little); a large one mostly work
    assert tiny.fixed_s / tiny.total_s > 0.5 > large.fixed_s / large.total_s
    doubled = decode_step_seconds(V3, H800, 144, 288, 288 * 4096)
    assert doubled.total_s < 1.2 * tiny.total_s
    # without the fixed times the same small step is a fraction of it: the roofline alone does not bend
    bare = CALIBRATED.model_copy(update={"layer_overhead_us": 0.0, "all_to_all_floor_us": 0.0})
    roofline = decode_step_seconds(V3, H800, 144, 144, 144 * 4096, efficiency=bare)
    assert roofline.fixed_s == 0 and roofline.total_s < 0.5 * tiny.total_s


# ---- the cost model's shape ------------------------------------------------------------------------------------


def test_more_expert_imbalance_makes_a_decode_step_longer():
    steps = [decode_step_seconds(V3, H800, 144, 12_000, 12_000 * 5000, imbalance).total_s
             for imbalance in (1.0, 1.1, 1.3, 2.0)]
    assert steps == sorted(steps) and steps[0] < steps[-1]


def test_decode_step_reports_the_moe_share_and_it_grows_with_imbalance():
    balanced = decode_step_seconds(V3, H800, 144, 12_000, 12_000 * 5000, 1.0)
    skewed = decode_step_seconds(V3, H800, 144, 12_000, 12_000 * 5000, 1.5)
    assert 0 < balanced.moe_share < skewed.moe_share < 1
    assert balanced.moe_share == pytest.approx(balanced.moe_s / balanced.total_s)
    assert float(skewed) == skewed.total_s


def test_more_cached_tokens_make_the_same_prompt_prefill_faster():
    seconds = [prefill_seconds(V3, H800, 8, [8000 - cached] * 8, [cached] * 8).total_s
               for cached in (0, 2000, 4000, 6000)]
    assert seconds == sorted(seconds, reverse=True) and seconds[-1] < seconds[0]


def test_prefill_costs_a_batch_of_prompts_more_than_any_one_of_them():
    batch = prefill_seconds(V3, H800, 8, [1000, 3000], [500, 0]).total_s
    assert batch > prefill_seconds(V3, H800, 8, 3000, 0).total_s
    assert batch > prefill_seconds(V3, H800, 8, 1000, 500).total_s


def test_prefill_refuses_cached_counts_that_do_not_match_the_prompts():
    with pytest.raises(ValueError, match="one per prompt"):
        prefill_seconds(V3, H800, 8, [1000, 2000], [0, 0, 0])


def test_speculative_tokens_share_one_read_of_cache_and_weights():
    one = decode_step_seconds(V3, H800, 144, 1440, 1440 * 5000).total_s
    two = decode_step_seconds(V3, H800, 144, 1440, 1440 * 5000, tokens_per_sequence=2).total_s
    assert one < two < 2 * one


def test_an_empty_decode_step_or_prefill_batch_costs_nothing():
    assert decode_step_seconds(V3, H800, 144, 0, 0).total_s == 0.0
    assert prefill_seconds(V3, H800, 8, [0, 0], [100, 0]).total_s == 0.0


def _remote_domains_sampled(model: ModelProfile, domains: int, node_limited: bool, tokens: int = 200_000) -> float:
    """Remote domains a token reaches, counted on sampled tokens: node-limited routing picks `groups_per_token` of
    the groups at random and each copy one of those groups at random; with node limits each group sits on one
    domain (groups / domains a domain, consecutive), without them each copy on a domain at random."""
    rng = np.random.default_rng(3)
    groups, chosen, k = model.expert_groups, model.groups_per_token, model.top_k
    picked = np.argsort(rng.random((tokens, groups)), axis=1)[:, :chosen]  # the token's groups
    group_of_copy = np.take_along_axis(picked, rng.integers(0, chosen, (tokens, k)), axis=1)
    domain_of_copy = group_of_copy // (groups // domains) if node_limited else rng.integers(0, domains, (tokens, k))
    home = rng.integers(0, domains, tokens)
    reached = np.zeros((tokens, domains), dtype=bool)
    reached[np.arange(tokens)[:, None], domain_of_copy] = True
    reached[np.arange(tokens), home] = False
    return float(reached.sum(axis=1).mean())


@pytest.mark.parametrize("domains", [2, 4, 8])
def test_node_limits_cut_the_remote_domains_a_prefill_token_crosses_to_what_sampled_tokens_reach(domains):
    for limited in (False, True):
        assert remote_domains_per_token(V3, domains, limited) == pytest.approx(
            _remote_domains_sampled(V3, domains, limited), abs=0.01)
    assert remote_domains_per_token(V3, domains, True) < remote_domains_per_token(V3, domains, False)
    # one group a node: at most groups_per_token nodes in all, so at most that many remote ones
    assert remote_domains_per_token(V3, 8, True) < V3.groups_per_token
    with pytest.raises(ValueError, match="expert_groups=8"):
        remote_domains_per_token(V3, 3, True)


def test_node_limits_shorten_a_multi_node_prefill_and_leave_one_node_and_decode_alone():
    prompts = [4096] * 16
    free, limited = (prefill_seconds(V3, H800, 32, prompts, node_limited=flag) for flag in (False, True))
    assert limited.comm_s < free.comm_s and limited.total_s <= free.total_s
    assert prefill_seconds(V3, H800, 8, prompts, node_limited=True) == prefill_seconds(V3, H800, 8, prompts)


def test_the_ub_supernode_keeps_the_all_to_all_off_the_slower_nic():
    on_h800 = decode_step_seconds(V3, H800, 160, 15_360, 15_360 * 4096).comm_s
    on_ascend = decode_step_seconds(V3, ASCEND, 160, 15_360, 15_360 * 4096).comm_s
    assert on_ascend < on_h800 / 5


def test_max_decode_batch_is_zero_when_the_weights_alone_overflow_hbm():
    assert max_decode_batch(V3, H800, 8, 4000) == 0  # 32 expert slots x 2.55 GB per card
    assert max_decode_batch(V3, ASCEND, 160, 4000) > max_decode_batch(V3, H800, 160, 4000)


def test_kv_cache_read_takes_bytes_over_bandwidth():
    assert kv_cache_read_seconds(40e9, 40.0) == pytest.approx(1.0)


def test_vision_encoding_grows_with_images_and_is_tens_of_ms_per_image_on_l20():
    one = vision_encode_seconds(PROFILES["L20"], 1)
    assert 0.01 < one < 0.2
    assert vision_encode_seconds(PROFILES["L20"], 8) > 4 * one
    assert vision_encode_seconds(PROFILES["L20"], 0) == 0.0


@pytest.mark.parametrize("name", sorted(PROFILES), ids=sorted(PROFILES))
def test_every_profile_lists_dense_peaks_with_low_precision_at_twice_bf16(name):
    profile = PROFILES[name]
    assert profile.name == name
    assert profile.lowp_tflops == pytest.approx(2 * profile.bf16_tflops, rel=0.01)


def test_efficiency_factors_above_one_are_refused():
    with pytest.raises(ValueError):
        Efficiency(compute=1.2, memory=0.5, network=0.5)
