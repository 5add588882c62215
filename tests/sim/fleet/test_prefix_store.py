"""The prefix store: more capacity or a longer retention never lowers the hit share; a store too small for a day's
writes keeps only what sessions re-read within minutes; a store without limits keeps every return; from empty the
hit share climbs to its steady state; the fleet bills and sizes prefill at the store's hit share."""

import math
from pathlib import Path

import pytest
from sim.calibration import fitted
from sim.config import load_sim_config
from sim.fleet.config import PrefixStoreConfig
from sim.fleet.prefix_store import days_from_empty, store_state
from sim.fleet.run import run_fleet

CONFIGS = Path(__file__).resolve().parents[3] / "sim" / "configs"
TOKENS = 608e9  # prompt tokens a day: DeepSeek's Feb-2025 day
BYTES = 70_272.0  # KV bytes per token of DeepSeek-V3's MLA as the engine stores it
KEPT = {"chat": 7.0, "agent": 3.0}  # days per class: DeepSeek's retention


def test_more_capacity_or_retention_never_lowers_the_hit_share():
    shares = [store_state(PrefixStoreConfig(), capacity, KEPT, TOKENS, BYTES).hit_share
              for capacity in (1, 10, 25, 50, 100, 1000)]
    assert shares == sorted(shares) and shares[0] < shares[-1]
    shares = [store_state(PrefixStoreConfig(), 100, {"chat": days, "agent": days}, TOKENS, BYTES).hit_share
              for days in (0.01, 0.5, 1, 3, 7, 30)]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_a_store_too_small_keeps_the_sessions_and_one_without_limits_every_return():
    store = PrefixStoreConfig()
    tiny = store_state(store, 0.001, KEPT, TOKENS, BYTES)
    assert tiny.binding == "capacity" and tiny.capacity_days < 0.01
    assert tiny.hit_share == pytest.approx(store.session_share, abs=0.002)
    free = store_state(PrefixStoreConfig(), 1e6, {"chat": 3650, "agent": 3650}, TOKENS, BYTES)
    assert free.binding == "retention" and math.isinf(free.capacity_days)
    assert free.hit_share == pytest.approx(store.session_share + fitted("store.return_share"), abs=0.01)
    assert free.written_pb_per_day == pytest.approx(TOKENS * (1 - free.hit_share) * BYTES / 1e15)


def test_from_empty_the_hit_share_climbs_to_its_steady_state():
    store = PrefixStoreConfig()
    days = [state.hit_share for state in days_from_empty(store, 100, KEPT, TOKENS, BYTES, 30)]
    assert days == sorted(days) and days[0] < days[-1]
    assert days[-1] == pytest.approx(store_state(store, 100, KEPT, TOKENS, BYTES).hit_share, abs=1e-9)


def test_the_fleet_bills_and_sizes_prefill_at_the_stores_hit_share():
    config = load_sim_config(CONFIGS / "seed-fleet-day.yaml")
    report = run_fleet(config)
    store = report["prefix_store"]
    assert store["binding"] == "capacity" and store["hit_share"] < config.fleet.traffic.cache_hit_share
    tokens = report["input_cache_hit_tokens"] / report["input_tokens"]
    assert tokens == pytest.approx(store["hit_share"], rel=1e-6)
    without = run_fleet(config.model_copy(update={"fleet": config.fleet.model_copy(update={"store": None})}))
    assert "prefix_store" not in without and without["nodes_mean"] < report["nodes_mean"]


def test_a_store_started_empty_fills_day_by_day_and_prefill_needs_fewer_nodes_as_it_does():
    config = load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml")
    fleet = config.fleet.model_copy(update={"days": 3.0, "compare_policies": [], "store": config.fleet.store.model_copy(
        update={"start_empty": True})})
    report = run_fleet(config.model_copy(update={"fleet": fleet}))
    daily = report["prefix_store"]["hit_share_by_day_from_empty"][:3]
    assert daily == sorted(daily) and daily[0] < daily[2] < report["prefix_store"]["hit_share"]
    billed = report["input_cache_hit_tokens"] / report["input_tokens"]
    assert daily[0] < billed < daily[2]
    hours = report["timeline"]["hour"]
    prefill = report["timeline"]["prefill_nodes"]
    first = [nodes for hour, nodes in zip(hours, prefill) if 6 <= hour < 18]
    third = [nodes for hour, nodes in zip(hours, prefill) if 54 <= hour < 66]
    assert sum(first) / len(first) > sum(third) / len(third)
