"""The placement benchmark runs end to end on tiny shapes (a smoke test, not a timing test)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_placement.py"


def test_bench_placement_quick_run_writes_every_row(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_placement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "r.json"
    assert module.main(["--quick", "--window", "10", "--every", "10", "--time-limit", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert all(s["identical"] for s in results["speed"])
    assert len(results["synthetic"]) == 2  # two clusters
    for block in results["synthetic"]:
        # policies x (static fitted, static held-out, dynamic fitted, dynamic held-out, live held-out)
        assert len(block["rolling"]) == 2 * 5
        for row in block["rolling"]:
            assert 1.0 <= row["lower_bound"] <= row["imbalance_mean"] <= row["imbalance_max"]
        # policies x (dynamic, live) with refits on drift, each beside its fixed-cadence figure
        assert [(r["policy"], r["routing"]) for r in block["drift"]] == [
            (p, r) for p in ("deepseek", "cpsat") for r in ("dynamic", "live")]
        for row in block["drift"]:
            assert row["fits"] >= 2 and 0 <= row["drift_refits"] < row["fits"] and row["imbalance_mean"] >= 1.0
    assert "| data |" in capsys.readouterr().out
