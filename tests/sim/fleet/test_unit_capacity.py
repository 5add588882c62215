"""The fleet's units: their rates are DeepSeek's calibrated ones, with the detailed run's disk reads charged."""

from pathlib import Path

import pytest

from sim.config import load_sim_config
from sim.cost_model import kv_cache_read_seconds, prefill_seconds
from sim.fleet.unit_capacity import unit_capacity
from sim.hardware import PROFILES
from sim.stage_costs import disk_bytes_per_block

CONFIGS = Path(__file__).resolve().parents[3] / "sim" / "configs"


def test_unit_capacities_are_deepseeks_calibrated_rates_with_the_detailed_runs_disk_reads():
    # Decode: the calibrated 14.8k per node. Prefill: the calibrated compute (73.7k per node, fitted without the
    # disk) plus reading the cached prefixes at the configured bandwidth, as the request-level engine charges it.
    config = load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml")
    unit = unit_capacity(config)
    assert unit.decode_tokens_per_s / unit.decode_nodes == pytest.approx(14_800, rel=0.02)
    assert unit.decode_step_s <= 1 / 21.0
    prompt, nodes = 4989, unit.prefill_nodes
    cached = round(prompt * config.fleet.traffic.cache_hit_share)
    cards = 8 * nodes
    compute = prefill_seconds(config.model, PROFILES["H800"], cards, [prompt - cached] * cards, [cached] * cards)
    read = kv_cache_read_seconds(cards * cached / 512 * disk_bytes_per_block(config), 40.0 * nodes)
    assert unit.prefill_tokens_per_s == pytest.approx(cards * prompt / (compute.total_s + read), rel=1e-9)
    assert 0.90 < unit.prefill_tokens_per_s / nodes / 73_700 < 0.95  # the read is what the calibration left out
