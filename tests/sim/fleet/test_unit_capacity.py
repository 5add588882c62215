"""The fleet's units: capacity mode's rates at the traffic's operating point, with the placement code's imbalance,
times the declared day utilisation."""

from pathlib import Path

import pytest

from sim.calibration import fitted
from sim.capacity import decode_capacity, prefill_capacity
from sim.config import load_sim_config
from sim.fleet.unit_capacity import unit_capacity
from sim.speculative import expected_step

CONFIGS = Path(__file__).resolve().parents[3] / "sim" / "configs"


def test_unit_capacities_are_capacity_mode_at_the_days_operating_point():
    # The day's decode unit is the operating point the day utilisation is fitted at (sim/anchors/
    # deepseek-decode.yaml): 14.8k output tokens/s per node at 21 tokens/s per user, one MTP draft token.
    config = load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml")
    unit = unit_capacity(config)
    assert unit.decode_tokens_per_s / unit.decode_nodes == pytest.approx(14_800, rel=0.02)
    tokens_per_step = expected_step(config.speculative, config.seed).tokens_per_step
    assert unit.decode_step_s / tokens_per_step <= 1 / 21.0 * (1 + 1e-9)
    assert unit.decode_imbalance > 1.0 and unit.prefill_imbalance > 1.0
    point = config.capacity.model_copy(update={
        "prompt_tokens": 4989, "prompt_length_spread": config.fleet.traffic.prompt_length_spread,
        "cached_share": config.fleet.traffic.cache_hit_share, "prefill_instance_nodes": 4,
        "decode_context_tokens": 4989, "tpot_slo_ms": 1000 / 21.0})
    at = config.model_copy(update={"capacity": point})
    prefill, decode = prefill_capacity(at), decode_capacity(at)
    day = fitted("utilisation.day")
    assert unit.prefill_tokens_per_s == pytest.approx(prefill["tokens_per_s_per_card"] * 32 * day, rel=1e-9)
    assert unit.decode_sequences == decode["sequences"]
    assert unit.decode_imbalance == decode["imbalance"] and unit.prefill_imbalance == prefill["imbalance"]


def test_a_fixed_imbalance_skips_the_placement_code_and_slows_the_units_as_it_grows():
    config = load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml")
    rates = []
    for imbalance in (1.0, 1.5):
        fleet = config.fleet.model_copy(update={"decode_imbalance": imbalance, "prefill_imbalance": imbalance})
        unit = unit_capacity(config.model_copy(update={"fleet": fleet}))
        assert unit.decode_imbalance == unit.prefill_imbalance == imbalance
        rates.append((unit.decode_tokens_per_s, unit.prefill_tokens_per_s))
    assert rates[1][0] < rates[0][0] and rates[1][1] < rates[0][1]
