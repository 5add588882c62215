"""The drift swaps bench (`scripts/bench_drift_swaps.py`) on its quick shape: the bounded search and the exhaustive
baseline make the same swaps on every ring layer, which lower the layers' objective. No figure of a run is pinned."""

import json

import pytest


def test_the_bounded_search_and_the_exhaustive_baseline_swap_alike(load_script, tmp_path):
    out = tmp_path / "rows.json"
    bench = load_script("bench_drift_swaps")
    assert bench.main(["--quick", "--gpus", "16", "--slots-per-gpu", "3", "--repeats", "1", "--later", "200",
                       "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["gpus"] == 16 and row["layers"] >= 1
    assert row["layers_chosen_otherwise"] == 0
    assert row["bounded_ms_per_layer"] > 0 and row["exhaustive_ms_per_layer"] > 0
    assert row["experts_moved"] > 0 and row["objective_after"] < row["objective_before"]


def test_unmatched_cluster_lists_are_refused(load_script, capsys):
    bench = load_script("bench_drift_swaps")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--quick", "--gpus", "16", "32", "--slots-per-gpu", "3"])
    assert exit_info.value.code == 2
    assert "--gpus and --slots-per-gpu" in capsys.readouterr().err
