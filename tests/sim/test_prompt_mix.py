"""Prompt-length mixes in capacity mode: the lengths keep the mean and reach the spread asked for, a spread of 1 is
the old all-at-the-mean batch, a wider mix costs more per prompt token once attention matters, and the spread the
shipped DeepSeek configs state is the one measured on the request trace they cite."""

from pathlib import Path

import pytest
import yaml

from sim.capacity import prefill_capacity
from sim.config import SimConfig
from sim.prompt_mix import length_spread, prompt_lengths
from sim.stage_costs import prefill_seconds_of
from traces.request_trace import load_request_trace

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE_CONVERSATION = ROOT / ".." / "shared" / "data" / "requests" / "mooncake_conversation_trace.jsonl"
QUICK_BALANCE = {"policy": "deepseek", "layers": 2, "steps": 40, "refit_every": 10, "window": 10}


def small(**capacity) -> SimConfig:
    return SimConfig.model_validate({"model": {"sliding_window_share": 0.0}, "balance": QUICK_BALANCE,
                                     "cluster": {"max_prefill_batch_tokens": 131072}, "capacity": capacity})


@pytest.mark.parametrize("count", [2, 8, 64, 240, 1000])
@pytest.mark.parametrize("spread", [1.0, 1.5, 1.92, 2.72])
def test_lengths_keep_the_mean_and_reach_the_spread(count, spread):
    lengths = prompt_lengths(4989, spread, count)
    assert len(lengths) == count and min(lengths) >= 1
    assert sum(lengths) / count == pytest.approx(4989, rel=2e-3)
    assert length_spread(lengths) == pytest.approx(min(spread, 0.99 * count), rel=1e-2)


def test_one_prompt_or_no_spread_is_every_prompt_at_the_mean():
    assert prompt_lengths(4096, 2.72, 1) == [4096]
    assert prompt_lengths(4096, 1.0, 5) == [4096] * 5
    assert prompt_lengths(4096, 2.72, 0) == []


@pytest.mark.parametrize("mean, spread, count", [(0, 2.0, 4), (100, 0.5, 4), (100, 2.0, -1)])
def test_impossible_mixes_are_refused_naming_the_parameter(mean, spread, count):
    with pytest.raises(ValueError, match="mean=|spread=|count="):
        prompt_lengths(mean, spread, count)


def test_no_spread_is_the_batch_of_prompts_all_at_the_mean():
    config = small(prompt_tokens=4989, cached_share=0.5625)
    report = prefill_capacity(config, imbalance=1.0)
    prompts, cached = report["prompts_per_batch"], report["cached_tokens"]
    seconds = prefill_seconds_of(config, [4989] * prompts, [cached] * prompts, [0] * prompts, nodes=4,
                                 imbalance=1.0, redundant_experts=32)
    assert report["batch_s"] == pytest.approx(seconds)
    assert report["tokens_per_s_per_card"] == pytest.approx(prompts * 4989 / seconds / 32)


def test_a_wider_mix_costs_more_per_prompt_token_and_more_so_for_longer_prompts():
    def rate(prompt, spread):
        return prefill_capacity(small(prompt_tokens=prompt, prompt_length_spread=spread),
                                imbalance=1.0)["tokens_per_s_per_card"]

    rates = [rate(4989, spread) for spread in (1.0, 1.5, 2.0, 2.72)]
    assert rates == sorted(rates, reverse=True) and rates[-1] < 0.8 * rates[0]
    short_loss = rate(500, 2.72) / rate(500, 1.0)
    long_loss = rates[-1] / rates[0]
    assert long_loss < short_loss < 1.0  # attention, which the spread raises, is a small part of a short prompt


@pytest.mark.skipif(not MOONCAKE_CONVERSATION.exists(), reason="../shared/data/requests is absent")
def test_the_configs_spread_is_the_one_measured_on_mooncake_s_conversation_trace():
    measured = length_spread([request.input_tokens for request in load_request_trace(MOONCAKE_CONVERSATION)])
    assert round(measured, 2) == 2.72
    stated = [yaml.safe_load((ROOT / "sim" / "anchors" / "deepseek-prefill.yaml").read_text())["capacity"],
              *(yaml.safe_load((ROOT / "sim" / "configs" / f"{name}.yaml").read_text())["fleet"]["traffic"]
                for name in ("deepseek-feb2025-day", "seed-fleet-day"))]
    assert [section["prompt_length_spread"] for section in stated] == [round(measured, 2)] * 3


def test_with_a_spread_capacity_still_never_falls_with_a_larger_batch_cap_or_a_looser_ttft():
    def rate(cap, ttft=None):
        config = small(prompt_tokens=4989, prompt_length_spread=2.72, cached_share=0.5625, ttft_slo_s=ttft)
        config = config.model_copy(update={"cluster": config.cluster.model_copy(
            update={"max_prefill_batch_tokens": cap})})
        return prefill_capacity(config)["tokens_per_s_per_card"]

    by_cap = [rate(cap) for cap in (2048, 4096, 8192, 16384, 32768, 65536, 131072)]
    by_ttft = [rate(1 << 20, ttft) for ttft in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert by_cap == sorted(by_cap) and by_ttft == sorted(by_ttft)
