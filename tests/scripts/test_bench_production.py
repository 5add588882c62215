"""`scripts/bench_production.py` and `scripts/bench_work_budget.py` refuse bad flags in one line with exit 2, before
any work (no usage block, no traceback, no node-limited row dropped in silence)."""

import numpy as np
import pytest

PRODUCTION_FLAGS = [["--layers", "0"], ["--every", "0"], ["--window", "0"], ["--seed", "-1"], ["--groups", "1000"],
                    ["--groups", "3"], ["--work-limit", "nan"], ["--skews", "nan"], ["--shapes", "2000x16"],
                    ["--shapes", "33x9"], ["--json", "README.md"]]
WORK_BUDGET_FLAGS = [["--work-limits", "nan"], ["--work-limits", "-1"], ["--repeats", "0"]]


@pytest.mark.parametrize(("script", "flags"), [("bench_production", f) for f in PRODUCTION_FLAGS]
                         + [("bench_work_budget", f) for f in WORK_BUDGET_FLAGS],
                         ids=[f"production{' '.join(f)}" for f in PRODUCTION_FLAGS]
                         + [f"work-budget{' '.join(f)}" for f in WORK_BUDGET_FLAGS])
def test_a_bad_flag_is_refused_in_one_line(load_script, capsys, monkeypatch, script, flags):
    bench = load_script(script)
    monkeypatch.chdir(bench.__file__.rsplit("/", 2)[0])  # README.md is the repository's own
    with pytest.raises(SystemExit) as exit_info:
        bench.main(flags)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_request_traffic_beside_independent_tokens(load_script):
    bench = load_script("bench_production")
    tokens, tokens_expected = bench.trace(32, 64, 0.6, 30, 2, seed=0)
    requests, expected = bench.trace(32, 64, 0.6, 30, 2, seed=0, traffic="requests", stage="prefill")
    twin, twin_expected = bench.trace(32, 64, 0.6, 30, 2, seed=0, sample_seed=5, traffic="requests", stage="prefill")
    assert tokens.shape == requests.shape == tokens_expected.shape == (30, 2, bench.NUM_EXPERTS)
    assert (requests.sum(axis=2) == 32 * 64 * bench.TOP_K).all() and not np.array_equal(requests, twin)
    np.testing.assert_array_equal(expected, twin_expected)  # the twin: the same requests, other samples


def test_every_row_carries_the_yardsticks_of_its_held_out_steps(load_script):
    bench = load_script("bench_production")
    rows = bench.measure(["16x20"], [0.6], steps=30, layers=1, every=10, window=10, seed=0, groups=None,
                         cpsat_options={"work_limit": 0.3}, oracle_every=10)
    greedy, cpsat = rows
    assert greedy["noise_floor"] == cpsat["noise_floor"] > 1.0
    assert 1.0 <= greedy["granularity_bound"] <= greedy["expectation_oracle"] + 0.01
    if greedy["recovered"] is not None:
        assert greedy["recovered"] == pytest.approx((greedy["held_out"] - cpsat["held_out"])
                                                    / (greedy["held_out"] - greedy["expectation_oracle"]))


def test_the_rows_never_replace_a_placement_file(load_script, capsys, tmp_path):
    bench = load_script("bench_production")
    placement = tmp_path / "placement.json"
    placement.write_text('{"physical_to_logical_map": [[0, 1]]}')
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--json", str(placement)])
    assert exit_info.value.code == 2 and "remove it first" in capsys.readouterr().err
    assert placement.read_text() == '{"physical_to_logical_map": [[0, 1]]}'
