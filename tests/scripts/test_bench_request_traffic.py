"""`scripts/bench_request_traffic.py`: ESFT's whole-prompt batches against the model, the balancers' rows on request
traffic, and one-line refusals."""

import numpy as np
import pytest

from placement import ClusterSpec
from placement.noise_floor import noise_floor
from traces.request_traffic import RequestTrafficConfig, request_traffic_with_expectation


def test_esft_batches_are_whole_prompts_cut_at_the_budget_and_the_shuffle_keeps_the_tokens(load_script):
    bench = load_script("bench_request_traffic")
    if not bench.ESFT.is_file():
        pytest.skip("../shared/data/esft-dsv2lite is absent")
    whole, prompts = bench.esft_batches(("law",), 1024, orders=2)
    shuffled, _ = bench.esft_batches(("law",), 1024, orders=2, shuffled=True)
    assert whole.shape == shuffled.shape and whole.shape[1:] == (26, 64)
    assert (whole.sum(axis=-1) == 1024 * 6).all() and prompts.size == 2 * 33
    # The same tokens moved between batches (each order drops its own last partial batch): the same pooled load.
    assert np.corrcoef(whole.sum(axis=0).ravel(), shuffled.sum(axis=0).ravel())[0, 1] > 0.99


def test_a_recovery_row_sets_the_balancers_beside_the_yardsticks(load_script):
    bench = load_script("bench_request_traffic")
    counts, expected = request_traffic_with_expectation(RequestTrafficConfig(
        mode="prefill", num_steps=40, num_layers=2, num_experts=32, top_k=4, tokens_per_step=2048,
        prompt_tokens=256))
    cluster = ClusterSpec(num_gpus=8, slots_per_gpu=5, gpus_per_node=8)
    row = bench._recovery_row("small", counts, cluster, 0.5, 10, 10, expected)
    assert row["greedy_static"] >= row["greedy_best_split"] >= row["in_batch_bound"] >= 1.0
    assert row["cpsat_live"] >= row["in_batch_bound"]
    assert row["noise_floor"] == noise_floor(2048 * 4, 8)
    assert 1.0 <= row["granularity_bound"] <= row["expectation_oracle"] + 0.01, "a bound in expectation"
    oracle = row["expectation_oracle"]
    if row["greedy_best_split"] > oracle:
        assert row["recovered_of_best_split"] == pytest.approx(
            (row["greedy_best_split"] - row["cpsat_live"]) / (row["greedy_best_split"] - oracle))
    blind = bench._recovery_row("no expectation", counts, cluster, 0.5, 10, 10)
    assert blind["expectation_oracle"] is None and blind["recovered_of_static"] is None
    assert blind["granularity_bound"] is None


@pytest.mark.parametrize("flags", [["--part", "nothing"], ["--work-limit", "nan"], ["--work-limit", "0"],
                                   ["--json", "README.md"]])
def test_a_bad_flag_is_refused_in_one_line(load_script, capsys, monkeypatch, flags):
    bench = load_script("bench_request_traffic")
    monkeypatch.chdir(bench.__file__.rsplit("/", 2)[0])  # README.md is the repository's own
    with pytest.raises(SystemExit) as exit_info:
        bench.main(flags)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
