"""`eplb sim`: the embedded default's shape through a small config, one JSON object with the contract keys, the
report and figure in --out-dir, and a bad config as a one-line error: a value out of its range, a run over a
budget, a routing trace of another model, each named by its config key before any work."""

import json

import numpy as np
import pytest

# A small decode balance (2 layers, readings over 100 scored steps): the sim's code paths at a fraction of the work.
SMALL_BALANCE = "balance: {policy: deepseek, layers: 2, steps: 40, refit_every: 10, window: 10, reading_steps: 100}\n"


def test_sim_prints_one_json_object_and_writes_the_report(tmp_path, run_eplb_here):
    config = tmp_path / "small.yaml"
    config.write_text("duration_s: 5\ncluster: {prefill_nodes: 1, decode_cards: 16}\n"
                      + SMALL_BALANCE)
    result = run_eplb_here("sim", "--config", str(config), "--json", "--out-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests_lost"] == 0 and report["requests"] > 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["requests"] == report["requests"]
    assert (tmp_path / "out" / "sim_timeline.png").stat().st_size > 0


def test_a_bad_config_is_one_line(tmp_path, run_eplb_here, one_line_error):
    config = tmp_path / "bad.yaml"
    config.write_text("duration_s: -1\n")
    one_line_error(run_eplb_here("sim", "--config", str(config)), "duration_s")
    one_line_error(run_eplb_here("sim", "--config", str(tmp_path / "missing.yaml")), "not found")


def test_a_fleet_config_runs_the_fleet_and_days_scale_it(tmp_path, run_eplb_here):
    config = "sim/configs/deepseek-feb2025-day.yaml"
    result = run_eplb_here("sim", "--config", config, "--json", "--out-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("cost_usd", "revenue_usd", "revenue_per_card_hour_usd", "nodes_mean", "nodes_peak", "requests_lost"):
        assert isinstance(report[key], (int, float)), key
    assert (tmp_path / "out" / "fleet_timeline.png").stat().st_size > 0
    two = json.loads(run_eplb_here("sim", "--config", config, "--json", "--days", "2").stdout)
    assert two["days"] == 2 and abs(two["output_tokens"] / report["output_tokens"] - 2) < 1e-6


def test_days_without_a_fleet_section_is_one_line(tmp_path, run_eplb_here, one_line_error):
    one_line_error(run_eplb_here("sim", "--days", "1"), "--days needs a config with a fleet section")
    one_line_error(run_eplb_here("sim", "--config", "sim/configs/seed-fleet-day.yaml", "--days", "0"),
                   "--days 0.0: Input should be greater than 0")


# (id, config, what the one line says): values that would hang, crash or name a flag `eplb sim` lacks, each refused.
BAD_CONFIGS = [
    ("duration-infinite", "duration_s: .inf",
     "duration_s: Input should be a finite number (found inf; allowed: > 0 and <= 86400)"),
    ("duration-1e12", "duration_s: 1.0e+12", "duration_s: Input should be less than or equal to 86400"),
    ("sessions-infinite", "workload: {synthetic: {sessions_per_s: .inf}}",
     "workload.synthetic.sessions_per_s: Input should be a finite number (found inf; allowed: > 0 and <= 100000)"),
    ("sessions-1e9", "workload: {synthetic: {sessions_per_s: 1.0e+9}}",
     "workload.synthetic.sessions_per_s: Input should be less than or equal to 100000"),
    ("turns-of-one-class", "workload: {synthetic: {turns_mean: {chat: 3}}}",
     "workload.synthetic.turns_mean: needs a value for each traffic class, chat and agent; agent is missing"),
    ("prefill-nodes-1e9", "cluster: {prefill_nodes: 1000000000}",
     "cluster.prefill_nodes: Input should be less than or equal to 1024 (found 1000000000; allowed: >= 1 and <= "
     "1024)"),
    ("decode-units-1e8", "cluster: {decode_units: 100000000}",
     "cluster.decode_units: Input should be less than or equal to 256"),
    ("fleet-tokens-infinite", "fleet: {traffic: {input_tokens_per_day: .inf}}",
     "fleet.traffic.input_tokens_per_day: Input should be a finite number"),
    ("fleet-drain-1e12", "fleet: {drain_s: 1.0e+12}", "fleet.drain_s: Input should be less than or equal to 604800"),
    ("fleet-input-1e30", "fleet: {traffic: {input_tokens_per_day: 1.0e+30}}",
     "fleet.traffic.input_tokens_per_day: Input should be less than or equal to"),
    ("fleet-output-1e30", "fleet: {traffic: {output_tokens_per_day: 1.0e+30}}",
     "fleet.traffic.output_tokens_per_day: Input should be less than or equal to"),
    ("failures-1e9", "fleet: {faults: {card_failures_per_hour: 1.0e+9}}",
     "fleet.faults.card_failures_per_hour: Input should be less than or equal to 1"),
    ("retention-nan", "cache: {retention_days: {chat: .nan, agent: 3}}",
     "cache.retention_days.chat: Input should be a finite number"),
    ("retention-negative-days", "cache: {retention_days: {chat: -1, agent: 3}}",
     "cache.retention_days.chat: Input should be greater than 0 (found -1; allowed: > 0 and <= 3650)"),
    ("decode-cards-1e9", "cluster: {decode_cards: 1000000000}",
     "cluster.decode_cards: Input should be less than or equal to 1024"),
    ("slots-per-card-1000", "balance: {slots_per_card: 1000}",
     "balance.slots_per_card: Input should be less than or equal to 256"),
    ("slots-too-few-for-the-experts", "balance: {slots_per_card: 1}",
     "cluster.decode_cards=128 x balance.slots_per_card=1 = 128 slots cannot hold model.num_routed_experts=256 "
     "experts; use balance.slots_per_card >= 2"),
    ("node-limits-on-16-nodes", "balance: {node_limits: true}",
     "balance.node_limits: model.expert_groups=8 is not a multiple of the 16 nodes; set balance.node_limits: false, "
     "or change cluster.decode_cards"),
    ("prefill-node-limits-on-3-nodes", "capacity: {prefill_node_limits: true, prefill_instance_nodes: 3}",
     "capacity.prefill_node_limits: model.expert_groups=8 is not a multiple of the 3 nodes"),
    ("prefill-node-limits-over-the-nodes-the-network-sees",
     "cluster: {cards_per_node: 12, prefill_nodes: 2}\n"
     "capacity: {prefill_node_limits: true, prefill_instance_nodes: 2}",
     "capacity.prefill_node_limits: model.expert_groups=8 is not a multiple of the 3 nodes of hardware.prefill's "
     "scale-up domain (H800: 8 cards)"),
    ("node-limits-without-a-policy", "cluster: {decode_cards: 64}\nbalance: {node_limits: true, policy: none}",
     "node limits need a balancing policy; balance.policy none places one replica per expert"),
    ("more-groups-a-token-than-groups", "model: {expert_groups: 4, groups_per_token: 5}",
     "model: groups_per_token=5 exceeds expert_groups=4"),
    ("routing-steps-1e8", "balance: {steps: 100000000}", "balance.steps: Input should be less than or equal to "
                                                         "100000"),
    ("a-day-request-by-request", "duration_s: 86400",
     "decode steps; budget 20,000,000): lower workload.synthetic.sessions_per_s or duration_s"),
    ("routing-steps-over-budget", "balance: {steps: 100000}",
     "slot-steps (99,950 steps x 4 layers x 384 expert slots; budget 4,000,000): lower balance.steps"),
    ("a-refit-every-step", "balance: {refit_every: 1}", "(250 refits x 4 layers; budget 500): raise "
                                                        "balance.refit_every"),
    ("fleet-second-steps-for-a-year", "fleet: {days: 366, step_s: 1}",
     "this fleet run would take 31,626,000 steps (budget 600,000): raise fleet.step_s"),
    ("fleet-failing-every-second", "fleet: {faults: {card_failures_per_hour: 1, failure_multiplier: 1000}}",
     "card failures (2,560 cards at most over 25 h, 2 pass(es); budget 500,000): lower "
     "fleet.faults.card_failures_per_hour"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_a_value_out_of_range_or_a_run_over_budget_is_one_line_naming_the_config_key(tmp_path, run_eplb_here,
                                                                                      one_line_error, text,
                                                                                      expected):
    config = tmp_path / "c.yaml"
    config.write_text(text + "\n")
    result = run_eplb_here("sim", "--config", config, "--json")
    one_line_error(result, expected)
    assert "--" not in result.stderr  # no flag of the placement commands (`eplb sim` has none of theirs)


@pytest.mark.parametrize("shape, expected", [
    ((20, 2, 32), "has 32 experts per layer, the model (model.num_routed_experts) 256; give a routing trace of the "
                  "served model, or set model.num_routed_experts: 32"),
    ((1, 2, 256), "has 1 step; the cpsat replay needs at least 2"),
], ids=["another-models-experts", "one-step"])
def test_a_routing_trace_that_does_not_fit_the_model_is_refused(tmp_path, run_eplb_here, one_line_error, shape,
                                                                expected):
    np.save(tmp_path / "routing.npy", np.full(shape, 3, dtype=np.int64))
    config = tmp_path / "c.yaml"
    config.write_text("balance: {routing_trace: routing.npy}\n")
    one_line_error(run_eplb_here("sim", "--config", config, "--json"), f"routing.npy {expected}")


def test_capacity_prints_both_stages_and_its_targets_come_from_the_flags(tmp_path, run_eplb_here, one_line_error):
    config = tmp_path / "small.yaml"
    config.write_text("model: {sliding_window_share: 0.0}\n" + SMALL_BALANCE)
    result = run_eplb_here("sim", "--config", str(config), "--capacity", "--tpot-slo-ms", "30", "--ttft-slo-s",
                           "0.2", "--scenarios", "none", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["tpot_slo_ms"] == 30 and report["settings"]["ttft_slo_s"] == 0.2
    assert report["decode"]["tpot_ms"] <= 30 and report["prefill"]["batch_s"] <= 0.2
    assert report["decode"]["tokens_per_s_per_card"] > 0 and report["prefill"]["tokens_per_s_per_card"] > 0
    assert "ranges" not in report, "--scenarios none: the central figure alone"
    one_line_error(run_eplb_here("sim", "--config", str(config), "--tpot-slo-ms", "30"), "add --capacity")
    one_line_error(run_eplb_here("sim", "--capacity", "--tpot-slo-ms", "0"), "--tpot-slo-ms")


def test_capacity_reports_each_figure_s_range_over_the_traffic_cases(tmp_path, run_eplb_here, one_line_error):
    config = tmp_path / "small.yaml"
    config.write_text("model: {sliding_window_share: 0.0}\n" + SMALL_BALANCE)
    result = run_eplb_here("sim", "--config", str(config), "--capacity", "--scenarios", "single-dataset,production-mix",
                           "--bursts", "off", "--seeds", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ranges = report["ranges"]
    assert [(row["scenario"], row["bursts"]) for row in ranges["cases"]] == [("single-dataset", "off"),
                                                                            ("production-mix", "off")]
    for stage in ("decode", "prefill"):
        for figure in ("tokens_per_s_per_card", "imbalance"):
            found = ranges[stage][figure]
            assert found["central"] == report[stage][figure]
            values = [found["central"], *(row[stage][figure] for row in ranges["cases"])]
            assert (found["min"], found["max"]) == (min(values), max(values))
    skewed, mixed = ranges["cases"]
    assert skewed["decode"]["imbalance"] > mixed["decode"]["imbalance"], "the pooled mix is less skewed"
    text = run_eplb_here("sim", "--config", str(config), "--capacity", "--scenarios", "production-mix", "--bursts",
                         "on", "--seeds", "1")
    assert "over 1 traffic cases (production-mix bursts on; 1 seed)" in text.stdout
    one_line_error(run_eplb_here("sim", "--config", str(config), "--capacity", "--scenarios", "busy-day"),
                   "unknown traffic scenario 'busy-day'")


def test_capacity_curve_prints_every_target_and_plots_it(tmp_path, run_eplb_here, one_line_error):
    config = tmp_path / "small.yaml"
    config.write_text("model: {sliding_window_share: 0.0}\n" + SMALL_BALANCE)
    plot = tmp_path / "curve.png"
    result = run_eplb_here("sim", "--config", str(config), "--capacity", "--curve", "50", "10", "20", "30", "--plot",
                           str(plot), "--scenarios", "none", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["decode_curve"]
    assert [row["tpot_slo_ms"] for row in rows] == [10, 20, 30, 50]
    rates = [row["tokens_per_s_per_card"] for row in rows]
    assert rates == sorted(rates) and all(row["tpot_ms"] <= row["tpot_slo_ms"] for row in rows[1:])
    # 10 ms is below what one sequence's step takes (the fixed time per layer alone is most of it): no batch meets it
    assert rows[0]["tokens_per_s_per_card"] == 0 and rows[0]["binding"] == "tpot_slo" and rows[0]["tpot_ms"] > 10
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run_eplb_here("sim", "--config", str(config), "--capacity", "--curve", "--scenarios", "none")
    assert text.returncode == 0 and "latency-throughput curve" in text.stdout and text.stdout.count(" | ") >= 9 * 6
    one_line_error(run_eplb_here("sim", "--config", str(config), "--curve"), "add --capacity")
    one_line_error(run_eplb_here("sim", "--capacity", "--curve", "0"), "--curve")
    one_line_error(run_eplb_here("sim", "validate", "--plot", str(plot)), "drop --plot")


def test_capacity_refuses_an_out_dir_it_would_not_use(run_eplb_here, tmp_path, one_line_error):
    one_line_error(run_eplb_here("sim", "--capacity", "--out-dir", str(tmp_path / "d")), "drop --out-dir")
    assert not (tmp_path / "d").exists()


def test_an_out_dir_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch):
    from eplb.cli import sim_command
    from sim import SimConfigError

    monkeypatch.setattr(sim_command.os, "access", lambda path, mode: False)
    with pytest.raises(SimConfigError, match="cannot be written"):
        sim_command._check_out_dir(tmp_path / "new" / "folder")
