"""`scripts/bench_tracking.py`: a switch is priced by the most experts one GPU receives, scaled to the served model's
layers, over the link; a replay serves each fit after its fit and moves; the table sets every cadence between the
greedy (0% of the gap closed) and the expectation oracle (100%), and bad flags are refused in one line."""

import json

import pytest

from placement import ClusterSpec, Placement


def test_a_switch_costs_the_busiest_receiver_s_bytes_over_the_link(load_script):
    bench = load_script("bench_tracking")
    cluster = ClusterSpec(num_gpus=2, slots_per_gpu=2, gpus_per_node=2)
    before = Placement.equal_split([[0, 1, 2, 3]], cluster, 4)
    # Each GPU keeps one expert whichever way the GPUs are labelled, and receives the other.
    after = Placement.equal_split([[0, 2, 1, 3]], cluster, 4)
    seconds = bench.switch_seconds([before, after, after], link_gbs=10.0)
    assert seconds[0] == pytest.approx(bench.MODEL_LAYERS * bench.EXPERT_BYTES / 10e9)
    assert seconds[1] == 0.0  # nothing moves when the fit does not change


def test_the_table_runs_from_the_greedy_to_the_oracle(load_script, monkeypatch, capsys, tmp_path):
    bench = load_script("bench_tracking")
    monkeypatch.setattr(bench, "STEPS", 60)
    monkeypatch.setattr(bench, "LAYERS", 1)
    monkeypatch.setattr(bench, "SCORED_FROM", 30)
    monkeypatch.setattr(bench, "CADENCES", (30, 10))
    out = tmp_path / "rows.json"
    assert bench.main(["--shapes", "64x4", "--skews", "0.5", "--seeds", "1", "--link-gbs", "50",
                       "--work-limit", "0.2", "--json", str(out)]) == 0
    rows = {row["row"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"greedy, best split, every 30", "cpsat every 30, 50 GB/s", "cpsat every 10, 50 GB/s",
                         "greedy every 10, 50 GB/s", "cpsat every 30 + patches, 50 GB/s", "expectation oracle"}
    greedy, oracle = rows["greedy, best split, every 30"], rows["expectation oracle"]
    if greedy["imbalance"] > oracle["imbalance"]:
        assert greedy["closed"] == 0 and oracle["closed"] == 1
    assert all(row["lag_max"] >= 1 for name, row in rows.items() if name != "expectation oracle")
    assert rows["cpsat every 10, 50 GB/s"]["link_share_max"] >= 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2 + len(rows)


@pytest.mark.parametrize("flags", [["--link-gbs", "0"], ["--step-ms", "-1"], ["--shapes", "9x9"],
                                   ["--fit-cores", "0"]], ids=["no-link", "negative-step", "unknown-shape", "no-cores"])
def test_bad_flags_are_refused_in_one_line(load_script, capsys, flags):
    bench = load_script("bench_tracking")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(flags)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
