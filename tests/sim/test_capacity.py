"""Capacity mode: the batch found is the largest that meets the latency target (or the cache or batch cap binds),
a looser target never lowers the rate, speculative decoding counts its accepted tokens, the imbalance comes from
the placement code, and every shipped config has a capacity."""

from pathlib import Path

import pytest

from sim import load_sim_config
from sim.capacity import (_prefill_seconds, capacity_report, decode_capacity, decode_curve, decode_tpot,
                          prefill_capacity)
from sim.config import SimConfig
from sim.cost_model import max_decode_batch
from sim.hardware import PROFILES
from sim.stage_costs import redundant_experts

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "sim" / "configs").glob("*.yaml"))
QUICK_BALANCE = {"policy": "deepseek", "layers": 2, "steps": 40, "refit_every": 10, "window": 10}


def small(**capacity) -> SimConfig:
    return SimConfig.model_validate({"model": {"sliding_window_share": 0.0}, "balance": QUICK_BALANCE,
                                     "cluster": {"decode_cards": 64}, "capacity": capacity})


def test_the_decode_batch_is_the_largest_that_meets_the_tpot_target():
    config = small(tpot_slo_ms=40.0, decode_context_tokens=3000)
    decode = decode_capacity(config)
    assert decode["binding"] == "tpot_slo" and decode["tpot_ms"] <= 40.0
    sequences, imbalance = decode["sequences"], decode["imbalance"]
    assert decode_tpot(config, sequences + 1, imbalance)[0] > 0.040
    assert decode["tokens_per_s_per_card"] == pytest.approx(sequences / (decode["step_ms"] / 1000) / 64)
    assert decode["imbalance"] >= 1.0


def test_a_looser_target_never_lowers_the_rate_and_the_cache_binds_at_last():
    rates = [decode_capacity(small(tpot_slo_ms=slo, decode_context_tokens=30_000)) for slo in (20.0, 60.0, 5000.0)]
    assert [r["tokens_per_s_per_card"] for r in rates] == sorted(r["tokens_per_s_per_card"] for r in rates)
    loosest = rates[-1]
    config = small(decode_context_tokens=30_000)
    assert loosest["binding"] == "kv_cache"
    assert loosest["sequences"] == max_decode_batch(config.model, PROFILES["H800"], 64, 30_000,
                                                    redundant_experts=redundant_experts(config))


def test_speculative_decoding_counts_its_accepted_tokens_per_step():
    config = small(tpot_slo_ms=50.0).model_copy(
        update={"speculative": SimConfig.model_fields["speculative"].default.model_copy(update={"enabled": True})})
    decode = decode_capacity(config)
    assert decode["tokens_per_step"] > 1.5
    assert decode["tpot_ms"] == pytest.approx(decode["step_ms"] / decode["tokens_per_step"])
    assert decode["tokens_per_s_per_card"] == pytest.approx(
        decode["sequences"] * decode["tokens_per_step"] / (decode["step_ms"] / 1000) / 64)


def test_prefill_batches_stop_at_the_ttft_target_and_count_cached_tokens_as_served():
    capped = prefill_capacity(small(prompt_tokens=2000))
    assert capped["binding"] == "max_prefill_batch_tokens" and capped["prompts_per_batch"] == 16384 * 4 // 2000
    bound = prefill_capacity(small(prompt_tokens=2000, ttft_slo_s=0.2))
    assert bound["binding"] == "ttft_slo" and bound["batch_s"] <= 0.2
    config = small(prompt_tokens=2000, ttft_slo_s=0.2)
    assert _prefill_seconds(config, bound["prompts_per_batch"] + 1, 32, bound["imbalance"]) > 0.2
    cached = prefill_capacity(small(prompt_tokens=2000, cached_share=0.5))
    assert cached["cached_tokens"] == 1000 and cached["tokens_per_s_per_card"] > capped["tokens_per_s_per_card"]


@pytest.mark.parametrize("path", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_every_shipped_config_has_a_capacity(path):
    config = load_sim_config(str(path))
    config = config.model_copy(update={"balance": config.balance.model_copy(update=QUICK_BALANCE)})
    report = capacity_report(config)
    for stage in ("decode", "prefill"):
        assert report[stage]["tokens_per_s_per_card"] > 0 and report[stage]["imbalance"] >= 1.0
    assert report["decode"]["tpot_ms"] <= config.capacity.tpot_slo_ms


@pytest.mark.parametrize("path", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_capacity_never_falls_with_a_looser_target_or_a_larger_batch_cap(path):
    config = load_sim_config(str(path))
    config = config.model_copy(update={"balance": config.balance.model_copy(update=QUICK_BALANCE)})
    curve = decode_curve(config, (5.0, 10.0, 15.0, 20.0, 30.0, 50.0, 80.0, 100.0, 200.0))
    rates = [row["tokens_per_s_per_card"] for row in curve]
    assert rates == sorted(rates) and rates[-1] > rates[0]
    assert all(row["tpot_ms"] <= row["tpot_slo_ms"] for row in curve if row["sequences"] > 1)

    def with_cluster(**cluster) -> SimConfig:
        return config.model_copy(update={"cluster": config.cluster.model_copy(update=cluster)})

    capped = [decode_capacity(with_cluster(max_decode_batch_per_card=cap))["tokens_per_s_per_card"]
              for cap in (8, 32, 64, 128, 256)]
    assert capped == sorted(capped)
    prefill = [prefill_capacity(with_cluster(max_prefill_batch_tokens=cap))["tokens_per_s_per_card"]
               for cap in (4096, 16384, 65536)]
    assert prefill == sorted(prefill)
    by_ttft = [prefill_capacity(config.model_copy(update={"capacity": config.capacity.model_copy(
        update={"ttft_slo_s": ttft})}))["tokens_per_s_per_card"] for ttft in (0.05, 0.2, 1.0)]
    assert by_ttft == sorted(by_ttft)
