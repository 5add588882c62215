"""`eplb sim`: the embedded default's shape through a small config, one JSON object with the contract keys, the
report and figure in --out-dir, and a bad config as a one-line error."""

import json


def test_sim_prints_one_json_object_and_writes_the_report(tmp_path, run_eplb_here):
    config = tmp_path / "small.yaml"
    config.write_text("duration_s: 5\ncluster: {prefill_nodes: 1, decode_cards: 16}\n"
                      "balance: {policy: deepseek, layers: 2, steps: 40, refit_every: 10, window: 10}\n")
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
