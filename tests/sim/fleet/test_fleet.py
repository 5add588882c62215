"""The fleet run: its economics, faults, quota and daily curve, and DeepSeek's published Feb-2025 day (the
autoscaler, the prices and the units have their own files)."""

from pathlib import Path

import numpy as np
import pytest

from sim.config import SimConfig, SimConfigError, load_sim_config
from sim.fleet.config import DailyTraffic, FleetConfig
from sim.fleet.run import run_fleet
from sim.fleet.steps import daily_load

CONFIGS = Path(__file__).resolve().parents[3] / "sim" / "configs"

# DeepSeek open-infra-index Day-6 post (Feb 2025): one day of V3/R1 serving on H800s.
DS_NODES_MEAN = 226.75
DS_NODES_PEAK = 278
DS_COST_USD = 87_072
DS_REVENUE_USD = 562_027


def _tiny(**fleet) -> SimConfig:
    """A small fleet: one hour of constant traffic that two prefill instances and one decode unit serve."""
    traffic = {"input_tokens_per_day": 86400 * 100_000.0, "output_tokens_per_day": 86400 * 20_000.0,
               "peak_to_mean": 1.0, "noise": 0.0, "bursts_per_day": 0, **fleet.pop("traffic", {})}
    settings = {"days": 1 / 24, "traffic": traffic, "decode_imbalance": 1.0, "prefill_imbalance": 1.0,
                "faults": {"card_failures_per_hour": 0.0, "spare_nodes": {"prefill": 0, "decode": 0}}, **fleet}
    return SimConfig(cluster={"decode_cards": 144}, balance={"slots_per_card": 2},
                     fleet=FleetConfig.model_validate(settings))


def test_fleet_run_reproduces_deepseeks_feb2025_day_within_15_percent():
    # The prefill nodes follow the predicted prefill rate (a stated prompt mix, not a rate fitted to the day), so the
    # node count is held to the predicted rows' 15%, not to an identity's.
    report = run_fleet(load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml"))
    assert report["nodes_mean"] == pytest.approx(DS_NODES_MEAN, rel=0.15)
    assert report["nodes_peak"] == pytest.approx(DS_NODES_PEAK, rel=0.15)
    assert report["cost_usd"] == pytest.approx(DS_COST_USD, rel=0.15)
    assert report["revenue_usd"] == pytest.approx(DS_REVENUE_USD, rel=0.01)
    assert report["requests_lost"] == 0
    assert report["input_tokens"] == pytest.approx(608e9, rel=1e-6)
    assert report["output_tokens"] == pytest.approx(168e9, rel=1e-6)
    policies = report["policies"]
    assert set(policies) == {"cpsat", "deepseek"}
    assert policies["deepseek"]["nodes_mean"] == report["nodes_mean"]  # the day runs under DeepSeek's policy
    assert report["cost_saved_usd_per_day"] == pytest.approx(
        policies["deepseek"]["cost_usd"] - policies["cpsat"]["cost_usd"], rel=1e-12)


def test_the_fleet_pays_for_imbalance_an_unbalanced_placement_needs_more_nodes():
    config = load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml")
    fleet = config.fleet.model_copy(update={"compare_policies": ["deepseek", "none"], "days": 0.25})
    policies = run_fleet(config.model_copy(update={"fleet": fleet}))["policies"]
    balanced, unbalanced = policies["deepseek"], policies["none"]
    assert unbalanced["decode_imbalance"] > balanced["decode_imbalance"]
    assert unbalanced["decode_tokens_per_s_per_node"] < balanced["decode_tokens_per_s_per_node"]
    assert unbalanced["nodes_mean"] > balanced["nodes_mean"] and unbalanced["cost_usd"] > balanced["cost_usd"]


def test_economics_add_up_to_the_hand_calculation_on_a_tiny_config():
    # 100k prompt tok/s (60% hits) and 20k output tok/s for an hour, on 8 + 18 nodes at $3 per card-hour; the
    # valley (half price) covers the hour's first half.
    config = _tiny(traffic={"cache_hit_share": 0.6},
                   autoscaler={"enabled": False, "fixed_prefill_nodes": 8, "fixed_decode_nodes": 18},
                   prices={"input_cache_hit_per_m_usd": 0.1, "input_cache_miss_per_m_usd": 0.5,
                           "output_per_m_usd": 2.0, "valley_hours": (0.0, 0.5), "valley_price_factor": 0.5,
                           "card_hour_usd": 3.0})
    report = run_fleet(config)
    hour = (100_000 * 3600 * (0.6 * 0.1 + 0.4 * 0.5) + 20_000 * 3600 * 2.0) / 1e6
    assert report["revenue_usd"] == pytest.approx(hour * (0.5 * 0.5 + 0.5 * 1.0), rel=1e-9)
    assert report["cost_usd"] == pytest.approx((8 + 18) * 8 * 3.0 * 1.0, rel=1e-9)
    assert report["revenue_per_card_hour_usd"] == pytest.approx(report["revenue_usd"] / ((8 + 18) * 8), rel=1e-9)
    assert report["nodes_mean"] == report["nodes_peak"] == 26
    assert report["requests_lost"] == 0 and report["queue_wait_p99_s"] == 0


def test_autoscaled_fleet_follows_the_daily_curve_and_waits_less_than_a_fixed_split_of_the_same_node_hours():
    config = load_sim_config(CONFIGS / "deepseek-feb2025-day.yaml")
    report = run_fleet(config)
    timeline = report["timeline"]
    held = np.array(timeline["nodes_held"])
    hours = np.array(timeline["hour"])
    assert held[np.abs(hours - 15).argmin()] > 1.3 * held[np.abs(hours - 3).argmin()]  # afternoon peak, night low
    fixed = report["fixed_split"]
    assert fixed["cost_usd"] == pytest.approx(report["cost_usd"], rel=0.05)
    assert report["queue_wait_p99_s"] < fixed["queue_wait_p99_s"] / 10


@pytest.mark.parametrize("handling", ["reroute", "restart"])
def test_every_request_finishes_or_is_requeued_with_faults_injected(handling):
    # About one failure per card-day (thousands of times the measured rate) on a small fleet.
    config = _tiny(days=0.25, faults={"card_failures_per_hour": 0.04, "handling": handling, "repair_hours": 0.5,
                                      "spare_nodes": {"prefill": 1, "decode": 1}},
                   autoscaler={"quota_nodes": 60, "min_prefill_nodes": 4, "min_decode_nodes": 18})
    report = run_fleet(config)
    assert report["faults"]["failures"] > 10
    assert report["requests_requeued"] > 0
    assert report["requests_lost"] == 0
    days = config.fleet.days
    assert report["input_tokens"] == pytest.approx(86400 * 100_000.0 * days, rel=1e-9)
    assert report["output_tokens"] == pytest.approx(86400 * 20_000.0 * days, rel=1e-9)


def test_restarting_a_unit_costs_more_waiting_than_rerouting_around_the_failed_card():
    waits = {}
    for handling in ("reroute", "restart"):
        config = _tiny(days=0.25, faults={"card_failures_per_hour": 0.02, "handling": handling,
                                          "repair_hours": 1.0, "spare_nodes": {"prefill": 1, "decode": 1}},
                       autoscaler={"enabled": False, "fixed_prefill_nodes": 8, "fixed_decode_nodes": 36})
        waits[handling] = run_fleet(config)["queue_wait_max_s"]
    assert waits["restart"] > 2 * waits["reroute"]


def test_daily_load_has_mean_one_and_peaks_at_the_configured_hour():
    traffic = DailyTraffic(peak_to_mean=1.3, peak_hour=14.0, noise=0.0, bursts_per_day=0)
    load = daily_load(traffic, 1440, 60.0, np.random.default_rng(0))
    assert load.mean() == pytest.approx(1.0)
    assert load.max() == pytest.approx(1.3, rel=1e-3)
    assert np.argmax(load) == 14 * 60


def test_fleet_days_scale_the_tokens_and_the_run_is_reproducible():
    config = _tiny(days=0.5, traffic={"noise": 0.05, "bursts_per_day": 4})
    first, again = run_fleet(config), run_fleet(config)
    assert first["cost_usd"] == again["cost_usd"] and first["timeline"] == again["timeline"]
    longer = run_fleet(config.model_copy(update={"fleet": config.fleet.model_copy(update={"days": 1.0})}))
    assert longer["output_tokens"] == pytest.approx(2 * first["output_tokens"], rel=1e-9)


def test_the_fleet_never_holds_more_than_its_quota_spares_included():
    config = _tiny(days=0.5, traffic={"peak_to_mean": 1.5, "bursts_per_day": 6, "burst_size": 1.0},
                   faults={"card_failures_per_hour": 0.0, "spare_nodes": {"prefill": 1, "decode": 1}},
                   autoscaler={"quota_nodes": 48, "min_prefill_nodes": 4, "min_decode_nodes": 18})
    report = run_fleet(config)
    assert report["nodes_peak"] <= 48 and report["nodes_min"] >= 4 + 18 + 2
    with pytest.raises(ValueError, match="quota_nodes=30 cannot hold"):
        run_fleet(_tiny(autoscaler={"quota_nodes": 30, "min_prefill_nodes": 4, "min_decode_nodes": 18},
                        faults={"card_failures_per_hour": 0.0, "spare_nodes": {"prefill": 8, "decode": 8}}))


def test_a_shifting_mix_moves_nodes_between_the_stages():
    # Prompts peak in the afternoon, replies (relative to prompts) at night: the stages' needs move in opposite
    # directions, so nodes move instead of being added and released. A fixed mix moves none.
    traffic = {"input_tokens_per_day": 86400 * 2e6, "output_tokens_per_day": 86400 * 1.2e6, "peak_to_mean": 1.3}
    autoscaler = {"quota_nodes": 200, "granularity": "node"}
    steady = run_fleet(_tiny(days=1.0, traffic=traffic, autoscaler=autoscaler))
    shifting = run_fleet(_tiny(days=1.0, traffic={**traffic, "mix_swing": 0.6, "mix_peak_hour": 3.0},
                               autoscaler=autoscaler))
    assert shifting["autoscaler"]["moves"] > 0 and steady["autoscaler"]["moves"] == 0
    assert shifting["output_tokens"] == pytest.approx(steady["output_tokens"], rel=1e-9)  # same day's totals


@pytest.mark.parametrize("fleet, match", [
    ({"autoscaler": {"enabled": False}}, "fixed_prefill_nodes and fixed_decode_nodes is not set"),
    ({"autoscaler": {"enabled": False, "fixed_prefill_nodes": 6, "fixed_decode_nodes": 18}},
     "fixed_prefill_nodes=6 is not a whole number of 4-node units"),
])
def test_a_fixed_split_must_be_given_in_whole_units(fleet, match):
    with pytest.raises(ValueError, match=match):
        run_fleet(_tiny(**fleet))


@pytest.mark.parametrize("text, message", [
    ("fleet: {faults: {spare_nodes: {decode: -3}}}", "spare_nodes must be >= 0"),
    ("fleet: {prices: {valley_hours: [30, -5]}}", "valley_hours must be two hours in"),
    ("fleet: {autoscaler: {quota: 3}}", "fleet.autoscaler.quota: unknown field"),
])
def test_a_bad_fleet_field_is_one_config_error_naming_it(tmp_path, text, message):
    path = tmp_path / "fleet.yaml"
    path.write_text(text + "\n")
    with pytest.raises(SimConfigError, match=message):
        load_sim_config(path)


