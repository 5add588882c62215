"""`scripts/bench_forecast.py` on its quick shape: every policy has its rolling rows (with and without the trend
forecast) at every lag and its oracle row, all scored on the same steps; the gaps are measured against the oracle;
the twin trace shares its popularity."""

import json

import numpy as np
import pytest

from traces.synthetic import SyntheticConfig, generate_trace


def test_a_twin_shares_popularity_but_not_samples():
    config = SyntheticConfig(num_steps=400, num_layers=2, num_experts=32, top_k=4, tokens_per_step=4096, seed=3)
    trace = generate_trace(config).counts_TLE
    twin = generate_trace(config.model_copy(update={"sample_seed": 11})).counts_TLE
    other = generate_trace(config.model_copy(update={"seed": 4})).counts_TLE
    assert not np.array_equal(trace, twin)
    # same popularity: the twin's expert totals track the trace's far closer than another seed's do
    totals = trace.sum(axis=0).ravel()
    assert np.corrcoef(totals, twin.sum(axis=0).ravel())[0, 1] > 0.99
    assert np.corrcoef(totals, other.sum(axis=0).ravel())[0, 1] < 0.9
    assert np.array_equal(twin, generate_trace(config.model_copy(update={"sample_seed": 11})).counts_TLE)


def test_the_quick_bench_reports_rolling_rows_at_every_lag_beside_the_oracle(load_script, tmp_path, capsys):
    bench = load_script("bench_forecast")
    out = tmp_path / "forecast.json"
    assert bench.main(["--quick", "--lags", "0", "20", "--work-limit", "0.2", "--json", str(out)]) == 0
    found_json = json.loads(out.read_text())
    assert found_json["esft"] == []  # --quick leaves the real routing out
    rows = found_json["synthetic"]
    assert {row["traffic"] for row in rows} == {"drift"}  # --quick runs the drifting traffic alone
    for traffic in ("drift",):
        for policy in ("deepseek", "cpsat"):
            found = {row["fit"]: row for row in rows if row["traffic"] == traffic and row["policy"] == policy}
            assert set(found) == {"rolling, lag 0", "rolling, lag 20", "rolling + forecast, lag 0",
                                  "rolling + forecast, lag 20", "oracle, bursts unknown", "oracle (popularity known)"}
            assert len({row["scored_steps"] for row in found.values()}) == 1
            oracle = found["oracle (popularity known)"]
            assert oracle["forecast_gap"] == 0.0
            for row in found.values():
                assert row["imbalance_mean"] >= 1.0 and row["fits"] >= 1
                assert abs(row["forecast_gap"] - (row["imbalance_mean"] - oracle["imbalance_mean"])) < 1e-12
    assert "| oracle (popularity known) |" in capsys.readouterr().out


def test_the_bench_runs_the_seeds_policies_and_patches_asked_for(load_script, tmp_path):
    bench = load_script("bench_forecast")
    out = tmp_path / "forecast.json"
    assert bench.main(["--quick", "--lags", "0", "--seeds", "3", "--policies", "deepseek", "--patch-lag", "5",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["synthetic"]
    assert {(row["seed"], row["policy"]) for row in rows} == {(3, "deepseek")}
    (patched,) = [row for row in rows if row["fit"] == "rolling + forecast + patches, lag 0 (patch lag 5)"]
    assert patched["patch_moves"] >= 0 and patched["imbalance_mean"] >= 1.0
    assert bench.main(["--quick", "--lags", "0", "--seeds", "3", "--policies", "deepseek", "--patch-lag", "5",
                       "--burst-lag", "4", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["synthetic"]
    (early,) = [row for row in rows if row["fit"].endswith("(patch lag 5, burst layers at lag 4)")]
    assert early["imbalance_mean"] >= 1.0
    for argv in (["--patch-lag", "5", "--burst-lag", "0"], ["--burst-lag", "4"], ["--patch-lag", "5", "--live-pace"]):
        with pytest.raises(SystemExit):
            bench.main(["--quick", "--lags", "0", *argv])
    assert not np.array_equal(bench.traces(32, 64, "drift", 140, 1, 3)[0], bench.traces(32, 64, "drift", 140, 1, 0)[0])


def test_iid_draws_keep_each_row_s_picks_and_the_mean_rows_carry_the_mean(load_script):
    bench = load_script("bench_forecast")
    counts_TLE = np.random.default_rng(1).integers(0, 50, size=(16, 3, 8))
    window_TLE, fresh_TLE, mean_TLE = bench.iid_draws(counts_TLE, 8, 5, np.random.default_rng(0))
    assert window_TLE.shape == (8, 3, 8) and fresh_TLE.shape == (5, 3, 8) and mean_TLE.shape == (8, 3, 8)
    assert (window_TLE.sum(axis=2) == counts_TLE[0].sum(axis=1)).all()
    assert (fresh_TLE.sum(axis=2) == counts_TLE[0].sum(axis=1)).all()
    shares_LE = counts_TLE.sum(axis=0) / counts_TLE.sum(axis=(0, 2))[:, None]
    assert np.allclose(mean_TLE[0] / counts_TLE[0].sum(axis=1)[:, None], shares_LE, atol=0.02)
    assert (mean_TLE == mean_TLE[0]).all()


def test_the_burst_rows_split_the_ceiling_placements_score_into_burst_and_calm_rows(load_script, tmp_path, capsys):
    bench = load_script("bench_forecast")
    out = tmp_path / "bursts.json"
    assert bench.main(["--bursts", "--quick", "--lags", "0", "20", "--policies", "deepseek", "--json",
                       str(out)]) == 0
    (row,) = json.loads(out.read_text())["bursts"]
    assert (row["policy"], row["traffic"], row["burst_factor"]) == ("deepseek", "drift", 4.0)
    assert 0 < row["burst_share"] < 1 and row["bursts_per_burst_row"] >= 1  # seed 0's quick trace has a burst
    share = row["burst_share"]
    assert row["measured"] == pytest.approx((1 - share) * row["calm_rows"] + share * row["burst_rows"])
    assert row["predicted"] == pytest.approx((1 - share) * row["calm_rows"] + share * row["exposure"])
    assert row["exposure"] >= 1.0 and row["burst_rows"] > row["calm_rows"]
    assert "| 32 x 9, 64 tokens/GPU | drift | 0 | deepseek |" in capsys.readouterr().out
    for argv in (["--bursts", "--esft-only"], ["--bursts", "--quick"]):  # the latter's default lag 100 scores nothing
        with pytest.raises(SystemExit):
            bench.main(argv)


def test_the_refit_block_rows_set_the_live_schedule_beside_the_yardstick_s(load_script, tmp_path, capsys):
    bench = load_script("bench_forecast")
    out = tmp_path / "schedules.json"
    assert bench.main(["--refit-block", "--quick", "--lags", "20", "--intervals", "40", "--work-limit", "0.2",
                       "--json", str(out)]) == 0
    rows = {row["fit"]: row for row in json.loads(out.read_text())["schedules"]}
    assert list(rows) == ["refits every 40 back to back, patches never blocked",
                          "a refit 40 after the last landed, patches blocked while one is in flight",
                          "a refit 40 after the last landed, no patches", "one fit, then patches alone"]
    yardstick, blocked, unpatched, alone = rows.values()
    assert yardstick["fits"] > blocked["fits"] == unpatched["fits"] > alone["fits"] == 1
    assert "patch_moves" not in unpatched
    assert min(yardstick["patch_moves"], blocked["patch_moves"]) > 0
    assert yardstick["patch_lag"] >= 1 and yardstick["patch_every"] >= 1  # the pace measured at the quick shape
    assert len({row["scored_steps"] for row in rows.values()}) == 1 and yardstick["scored_steps"] == 300 - 60
    assert all(row["imbalance_mean"] >= 1.0 for row in rows.values())
    assert "| one fit, then patches alone |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--refit-block", "--bursts"])
