"""`scripts/bench_generalisation.py`: its independent generator makes seeded traces of the stated shape whose rows
carry every pick, no expert above the tokens of a step, a mix that changes and bursts; the bench prints one row per
popularity with a per-seed difference for each seed and refuses bad flags in one line."""

import numpy as np
import pytest


def test_the_regime_generator_is_seeded_whole_and_moves(load_script):
    bench = load_script("bench_generalisation")
    counts_TLE = bench.regime_trace(200, 2, 1024, 0.9, seed=4)
    assert counts_TLE.shape == (200, 2, bench.NUM_EXPERTS) and counts_TLE.dtype == np.int64
    assert np.array_equal(counts_TLE, bench.regime_trace(200, 2, 1024, 0.9, seed=4))
    assert not np.array_equal(counts_TLE, bench.regime_trace(200, 2, 1024, 0.9, seed=5))
    assert counts_TLE.max() <= 1024 and (counts_TLE.sum(axis=2) <= 1024 * bench.TOP_K).all()
    assert (counts_TLE.sum(axis=2) >= 0.99 * 1024 * bench.TOP_K).all()  # only a saturated expert's overflow is lost
    early, late = counts_TLE[:50].sum(axis=0), counts_TLE[150:].sum(axis=0)
    assert np.abs(early / early.sum(axis=1, keepdims=True) - late / late.sum(axis=1, keepdims=True)).sum() > 0.1


def test_a_row_reports_each_seed_against_the_greedy(load_script, capsys, tmp_path):
    bench = load_script("bench_generalisation")
    out = tmp_path / "rows.json"
    assert bench.main(["--rows", "64x4", "--seeds", "1", "2", "--work-limit", "0.5", "--json", str(out)]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert len(table) == 2 + 2  # header, rule, lognormal 0.6 and 1.2 at lag 0
    cells = table[2].split("|")
    assert cells[2].strip() == "64 x 4" and len(cells[7].split()) == 2 and cells[10].strip() in ("yes", "no")
    assert out.exists()


@pytest.mark.parametrize("flags", [["--seeds", "-1"], ["--work-limit", "0"], ["--rows", "9x9"]],
                         ids=["negative-seed", "zero-budget", "unknown-shape"])
def test_bad_flags_are_refused_in_one_line(load_script, capsys, flags):
    bench = load_script("bench_generalisation")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(flags)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("stage", ["decode", "prefill"])
def test_request_traffic_rows_draw_the_stage_of_their_shape(load_script, stage):
    bench = load_script("bench_generalisation")
    counts_TLE = bench.trace("requests", 32, 64, 0.6, seed=1, stage=stage)
    assert counts_TLE.shape == (bench.STEPS, bench.LAYERS, bench.NUM_EXPERTS)
    assert (counts_TLE.sum(axis=2) == 32 * 64 * bench.TOP_K).all()
    assert np.array_equal(counts_TLE, bench.trace("requests", 32, 64, 0.6, seed=1, stage=stage))


def test_the_aside_generator_is_seeded_whole_and_moves(load_script):
    aside = load_script("aside_traffic")
    counts_TLE = aside.aside_trace(300, 2, 64, 2048, 1.0, seed=3)
    assert counts_TLE.shape == (300, 2, 64) and counts_TLE.dtype == np.int64
    assert np.array_equal(counts_TLE, aside.aside_trace(300, 2, 64, 2048, 1.0, seed=3))
    assert not np.array_equal(counts_TLE, aside.aside_trace(300, 2, 64, 2048, 1.0, seed=4))
    # Each topic's tokens pick at most once an expert: no expert above the step's tokens, nearly every pick kept.
    assert counts_TLE.max() <= 2048 and (counts_TLE.sum(axis=2) <= 2048 * aside.TOP_K).all()
    assert (counts_TLE.sum(axis=2) >= 0.99 * 2048 * aside.TOP_K).all()
    early, late = counts_TLE[:50].sum(axis=0), counts_TLE[250:].sum(axis=0)
    assert np.abs(early / early.sum(axis=1, keepdims=True) - late / late.sum(axis=1, keepdims=True)).sum() > 0.1


def test_capped_pick_probabilities_sum_to_one_under_the_cap(load_script):
    aside = load_script("aside_traffic")
    p_E = aside._capped(np.array([100.0, 50.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    assert p_E.sum() == pytest.approx(1.0) and p_E.max() <= 1 / aside.TOP_K + 1e-12
    assert p_E[0] == pytest.approx(1 / aside.TOP_K) and p_E[1] == pytest.approx(1 / aside.TOP_K)
    assert np.allclose(p_E[2:], (1 - 2 / aside.TOP_K) / 8)


def test_the_geometry_generator_is_seeded_whole_and_its_batch_follows_the_sessions(load_script):
    geometry = load_script("aside_geometry")
    counts_TLE = geometry.geometry_trace(300, 2, 64, 2048, 1.0, seed=3)
    assert counts_TLE.shape == (300, 2, 64) and counts_TLE.dtype == np.int64
    assert np.array_equal(counts_TLE, geometry.geometry_trace(300, 2, 64, 2048, 1.0, seed=3))
    assert not np.array_equal(counts_TLE, geometry.geometry_trace(300, 2, 64, 2048, 1.0, seed=4))
    # A step serves at most `tokens` sessions, each picking an expert at most once; the batch moves with arrivals.
    picks_TL = counts_TLE.sum(axis=2)
    assert counts_TLE.max() <= 2048 and (picks_TL <= 2048 * geometry.TOP_K).all()
    assert np.allclose(picks_TL[:, 0], picks_TL[:, 1], rtol=0.05)  # every layer serves the same tokens
    assert picks_TL[:, 0].min() < picks_TL[:, 0].max() and picks_TL.min() > 0.5 * 2048 * geometry.TOP_K
    early, late = counts_TLE[:50].sum(axis=0), counts_TLE[250:].sum(axis=0)
    assert np.abs(early / early.sum(axis=1, keepdims=True) - late / late.sum(axis=1, keepdims=True)).sum() > 0.1


def test_water_filled_probabilities_sum_to_one_under_the_cap(load_script):
    geometry = load_script("aside_geometry")
    p_E = geometry._water_filled(np.log(np.array([100.0, 50.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])))
    assert p_E.sum() == pytest.approx(1.0) and p_E.max() <= 1 / geometry.TOP_K + 1e-12
    assert p_E[0] == pytest.approx(1 / geometry.TOP_K) and p_E[1] == pytest.approx(1 / geometry.TOP_K)
    assert np.allclose(p_E[2:], (1 - 2 / geometry.TOP_K) / 8)


@pytest.mark.parametrize("traffic", ["esft", "olmoe"])
def test_real_routing_rows_replay_the_shared_data(load_script, traffic):
    bench = load_script("bench_generalisation")
    if not (bench.ESFT.exists() and bench.OLMOE.exists()):
        pytest.skip("the shared ESFT and OLMoE data are absent")
    counts_TLE = bench.trace(traffic, 36, 128, None, seed=1)
    assert counts_TLE.shape[1:] == ((bench.LAYERS, 64) if traffic == "esft" else (3, 64))
    assert np.array_equal(counts_TLE, bench.trace(traffic, 36, 128, None, seed=1))
    assert not np.array_equal(counts_TLE, bench.trace(traffic, 36, 128, None, seed=2))
    if traffic == "olmoe":
        assert counts_TLE.shape[0] == bench.STEPS and (counts_TLE.sum(axis=2) == 36 * 128 * bench.OLMOE_TOP_K).all()
