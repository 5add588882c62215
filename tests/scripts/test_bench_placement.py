"""The placement benchmark runs end to end on tiny shapes (a smoke test, not a timing test)."""

import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_placement.py"


def test_bench_placement_quick_run_writes_every_row(load_script, tmp_path, capsys):
    module = load_script("bench_placement")
    out = tmp_path / "r.json"
    assert module.main(["--quick", "--window", "10", "--every", "10", "--time-limit", "0.3", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert all(s["identical"] for s in results["speed"])
    assert len(results["synthetic"]) == 2  # two clusters
    for block in results["synthetic"]:
        # policies x (static fitted, static held-out, dynamic fitted, dynamic held-out, live held-out)
        assert len(block["rolling"]) == 2 * 5
        for row in block["rolling"]:
            # The bound holds for every placement, so never above the mean of one scored.
            assert row["lower_bound"] <= row["imbalance_mean"] + 1e-9
        # policies x (dynamic, live) with refits on drift, each beside its fixed-cadence figure
        assert [(r["policy"], r["routing"]) for r in block["drift"]] == [
            (p, r) for p in ("deepseek", "cpsat") for r in ("dynamic", "live")]
        held_out = {(r["policy"], r["routing"]): r for r in block["rolling"] if r["fit"] == "held-out"}
        for row in block["drift"]:
            assert row["fits"] >= 2 and 0 <= row["drift_refits"] < row["fits"]
            assert row["fixed_mean"] == held_out[row["policy"], row["routing"]]["imbalance_mean"]
            if row["policy"] == "deepseek" and row["drift_refits"] == 0:  # deterministic fits, no trigger
                assert row["imbalance_mean"] == pytest.approx(row["fixed_mean"], rel=1e-12)
        # the greedy and cpsat at its one quick budget, each under dynamic routing and the live router
        assert [(r["policy"], r["budget"], r["routing"]) for r in block["lag"]] == [
            (p, b, r) for p, b in (("deepseek", None), ("cpsat", 0.2)) for r in ("dynamic", "live")]
        for row in block["lag"]:
            assert row["lag"] == math.ceil((row["fit_seconds"] + row["transfer_seconds"]) / module.STEP_SECONDS)
            link_seconds = row["busiest_link_copies"] * module.EXPERT_BYTES / module.GPU_LINK_BYTES_PER_SECOND
            assert row["transfer_seconds"] == pytest.approx(link_seconds)
            assert row["lower_bound"] <= row["imbalance_mean"] + 1e-9
        # Every row of a cluster scores the same steps: the trace less the window and the largest lag.
        largest = max(r["lag"] for r in block["lag"])
        assert {r["held_out_steps"] for r in block["lag"]} == {4 * 10 - 10 - largest}
    assert "| data |" in capsys.readouterr().out
