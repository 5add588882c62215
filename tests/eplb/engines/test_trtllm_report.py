"""`report_load_statistics.py`'s imbalance-ratio computed by `eplb.engines.trtllm.report` equals an independent
re-computation that follows the script step by step (torch, float32, pandas' NaN-skipping average) on the same
dump: as recorded, and projected onto the file `--trtllm-out` writes."""

import numpy as np
import pytest
import yaml

from eplb.engines.trtllm.load_balancer_file import trtllm_yaml
from eplb.engines.trtllm.report import projected_imbalance_ratio, recorded_imbalance_ratio
from placement import ClusterSpec, Placement, fit_placement, score_placement
from traces import load_trace

LAYER_IDS = (3, 4, 5)
CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=5)


@pytest.fixture()
def dump_and_counts(tmp_path, write_trtllm_dump):
    counts_RTLE = np.random.default_rng(1).integers(0, 60, size=(4, 12, len(LAYER_IDS), 16))
    counts_RTLE[:, :, 1, :3] *= 8  # a few hot experts in one layer
    return write_trtllm_dump(tmp_path / "dump", counts_RTLE, LAYER_IDS), counts_RTLE.sum(axis=0)


def test_recorded_figure_equals_report_load_statistics_on_the_dump(dump_and_counts, report_load_statistics):
    dump, counts_TLE = dump_and_counts
    ours = recorded_imbalance_ratio(load_trace(dump).counts_TLE, num_ranks=4)
    assert ours == pytest.approx(report_load_statistics(dump), rel=1e-5)


def test_projected_figure_equals_report_load_statistics_on_the_written_yaml(dump_and_counts,
                                                                            report_load_statistics):
    dump, counts_TLE = dump_and_counts
    placement = fit_placement("deepseek", counts_TLE, CLUSTER)
    projection = yaml.safe_load(trtllm_yaml(placement, LAYER_IDS) + "ep_size: 4\n")  # the key the script needs
    ours = projected_imbalance_ratio(placement, counts_TLE)
    assert ours == pytest.approx(report_load_statistics(dump, projection), rel=1e-5)


def test_projected_figure_of_an_equal_split_placement_is_its_static_imbalance_less_one(dump_and_counts):
    _, counts_TLE = dump_and_counts
    placement = fit_placement("deepseek", counts_TLE, CLUSTER)
    assert placement.is_equal_split()
    static = score_placement(placement, counts_TLE, "static").summary()["imbalance_mean"]
    assert projected_imbalance_ratio(placement, counts_TLE) == pytest.approx(static - 1, rel=1e-12)


def test_projection_splits_equally_whatever_shares_the_placement_holds(dump_and_counts):
    _, counts_TLE = dump_and_counts
    equal = fit_placement("deepseek", counts_TLE, CLUSTER)
    weights = equal.weights_LP.copy()
    for layer in range(3):  # give each expert's first replica 0.9 of the share, the others the rest equally
        for expert in np.flatnonzero(equal.logcnt_LE[layer] > 1):
            slots = np.flatnonzero(equal.phy2log_LP[layer] == expert)
            weights[layer, slots] = [0.9] + [0.1 / (len(slots) - 1)] * (len(slots) - 1)
    skewed = Placement(equal.phy2log_LP, weights, CLUSTER, 16)
    assert not skewed.is_equal_split()
    assert projected_imbalance_ratio(skewed, counts_TLE) == projected_imbalance_ratio(equal, counts_TLE)


def test_a_layer_with_an_iteration_of_no_tokens_is_left_out_as_the_script_leaves_it(tmp_path, write_trtllm_dump,
                                                                                    report_load_statistics):
    counts_RTLE = np.random.default_rng(2).integers(1, 40, size=(2, 6, len(LAYER_IDS), 8))
    counts_RTLE[:, 2, 1] = 0  # layer 4 routes no token at iteration 102: 0 / 0 there
    dump = write_trtllm_dump(tmp_path / "dump", counts_RTLE, LAYER_IDS)
    counts_TLE = counts_RTLE.sum(axis=0)
    ours = recorded_imbalance_ratio(counts_TLE, num_ranks=2)
    assert ours == pytest.approx(report_load_statistics(dump), rel=1e-5)
    kept = counts_TLE[:, [0, 2]]
    assert ours == pytest.approx(recorded_imbalance_ratio(kept, num_ranks=2), rel=1e-12)


def test_recorded_figure_is_none_when_the_ids_do_not_split_over_the_ranks():
    assert recorded_imbalance_ratio(np.ones((2, 1, 10), dtype=np.int64), num_ranks=4) is None
