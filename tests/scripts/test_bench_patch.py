"""The burst patch bench (`scripts/bench_patch.py`) on its quick shape: a refit row and the patch rows of each cluster,
a patch moving at most `patch_moves` slots per layer (and its drift swaps' replica sets) and a small share of the
refit's bytes, its host copies following its few slots (not re-planned wholesale), and its steps to the switch as
the module docstring counts them; `live_pace` hands the medians' pace to the replay. No figure of a run is pinned."""

import json
import math
import statistics

import pytest

from eplb.rebalance.attempt import layers_per_step
from eplb.rebalance.config import RebalanceConfig
from placement.patch_planner import PatchSettings


@pytest.fixture(scope="module")
def rows(load_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "rows.json"
    bench = load_script("bench_patch")
    assert bench.main(["--quick", "--gpus", "8", "--slots-per-gpu", "5", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_each_cluster_has_a_refit_and_its_patches(rows):
    steady = [f"steady patch {turn}" for turn in range(1, 7)] + ["steady patches (median of 6)"]
    assert [row["job"].split(",")[0] for row in rows] == ["refit", "patch", "patch", "patch", "patch"] + steady
    assert rows[1]["job"].endswith("no drift swaps")
    refit = rows[0]
    assert not refit["kept"] and refit["bytes"] > 0 and refit["slots_moved"] > 0
    assert refit["seconds_vs_refit"] == 1 and refit["bytes_vs_refit"] == 1


def test_a_patch_moves_a_few_slots_and_the_host_copies_that_follow_them(rows):
    patches, layers = PatchSettings(), 4
    everywhere = rows[4]  # a burst in every layer: the fit serves it above the threshold
    assert not everywhere["kept"] and everywhere["slots_moved"] >= 1
    for row in rows[1:5]:
        # burst moves, and but in the first row drift swaps: two replica sets each, a set at most one slot a GPU
        swaps = 0 if row["job"].endswith("no drift swaps") else 2 * 8 * patches.drift_swaps
        assert row["slots_moved"] <= (patches.max_moves + swaps) * layers
        assert row["slot_fills"] == row["slots_moved"]
        assert row["host_copy_fills"] <= 3 * row["slots_moved"]
        assert row["bytes_vs_refit"] < 0.25 and row["changed_layers"] <= layers
        if row["kept"]:
            assert row["bytes"] == 0 and row["steps_to_switch"] == 0


def test_the_steps_to_a_switch_are_the_job_the_broadcast_the_moves_and_the_switch(rows):
    for row in rows:
        if not row["kept"] and "pace_every" not in row:  # the medians' row is no job
            job_steps = math.ceil(row["seconds"] * 1000 / 50.0)
            per_step = layers_per_step(row["changed_layers"], row["rounds"])
            # the broadcast's step posts the first round and prepares the first tables
            moving = max(row["rounds"], math.ceil(row["changed_layers"] / per_step) - 1)
            assert row["moving_steps"] == moving
            assert abs(row["steps_to_switch"] - (job_steps + 1 + moving + 1)) <= 1  # seconds are rounded in the row
            # the layers whose burst moves come or go are planned first and switch as their weights land
            assert (row["steps_to_burst_layers"] is None) == (row["burst_layers"] == 0)
            if row["burst_layers"]:
                assert job_steps + 3 - 1 <= row["steps_to_burst_layers"] <= row["steps_to_switch"] + 1


def test_steady_patches_take_turns_by_the_swaps_budget_and_their_medians_give_the_pace(rows):
    steady, median = rows[5:11], rows[11]
    for row in steady:
        assert row["drift_stride"] >= PatchSettings().drift_stride
        assert row["swap_ms_per_layer"] is None or row["swap_ms_per_layer"] >= 0
    job_steps = math.ceil(median["seconds"] * 1000 / 50.0)
    # the moving steps: the rounds, or the steps preparing the changed layers where those take longer
    assert median["pace_every"] == max(median["moving_steps"] + 1, job_steps + 1)
    assert median["pace_lag"] == job_steps + median["moving_steps"] + 2
    burst_lag = median["pace_burst_lag"]
    assert burst_lag is None or median["pace_lag"] - median["pace_every"] < burst_lag <= median["pace_lag"]
    assert median["rounds"] == math.ceil(statistics.median(row["rounds"] for row in steady))  # rounded up
    assert median["moving_steps"] == math.ceil(statistics.median(row["moving_steps"] for row in steady))
    assert median["moving_steps"] >= median["rounds"]


def test_a_larger_byte_budget_a_step_moves_a_patch_in_fewer_rounds(load_script, tmp_path, rows):
    out = tmp_path / "rows.json"
    bench = load_script("bench_patch")
    budget_mib = RebalanceConfig().max_bytes_per_step / 2**20
    assert bench.main(["--quick", "--gpus", "8", "--slots-per-gpu", "5", "--max-bytes-per-step",
                       str(budget_mib * 8), "--json", str(out)]) == 0
    wider = json.loads(out.read_text())
    assert [row["job"] for row in wider] == [row["job"] for row in rows]
    # The refit moves its bytes in fewer rounds (a time-limited fit may differ from run to run, so a job's bytes are
    # compared only where they are equal).
    assert 0 < wider[0]["rounds"] < rows[0]["rounds"]
    assert all(wide["rounds"] <= narrow["rounds"] for narrow, wide in zip(rows, wider)
               if wide["bytes"] == narrow["bytes"])


def test_a_byte_budget_of_nothing_is_refused(load_script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_patch").main(["--quick", "--max-bytes-per-step", "0"])
    assert exit_info.value.code == 2 and "--max-bytes-per-step: expected a number > 0" in capsys.readouterr().err


def test_the_live_pace_is_the_steady_medians_as_the_replay_takes_them(load_script):
    bench = load_script("bench_patch")
    settings, pace = bench.live_pace(8, 5, quick=True)
    median = bench.measure_cluster(8, 5, bench.QUICK, 50.0, 0)[-1]
    assert settings.every == median["pace_every"] and settings.drift_stride == median["drift_stride"]
    assert pace.lag == median["pace_lag"] and pace.burst_lag == median["pace_burst_lag"]
    assert pace.problems(settings.every) == []
