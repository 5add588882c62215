"""The placement benchmark runs end to end on tiny shapes (a smoke test, not a timing test)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_placement.py"


def test_bench_placement_quick_run_writes_every_row(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_placement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick", "--window", "10", "--every", "10", "--json", str(tmp_path / "r.json")]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) == 2  # one layer count x two clusters
    for result in results:
        assert result["speed"]["identical"] is True
        assert len(result["quality"]) == 4
        for row in result["quality"]:
            assert 1.0 <= row["lower_bound"] <= row["imbalance_mean"] <= row["imbalance_max"]
    assert "| shape |" in capsys.readouterr().out
