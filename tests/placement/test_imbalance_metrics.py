"""The named imbalance metrics against hand computations on a small trace (docs/formats.md, 'Imbalance metrics')."""

import numpy as np
import pytest

from placement import ClusterSpec, Placement, score_placement
from placement.imbalance_metrics import WINDOWS, group_metric, named_metrics
from placement.noise_floor import noise_floor

# Four cards on two nodes of two; even steps load the cards 4, 2, 1, 1 and odd steps 1, 1, 2, 4.
EVEN, ODD = [4.0, 2.0, 1.0, 1.0], [1.0, 1.0, 2.0, 4.0]


def alternating_loads_TLG(steps: int) -> np.ndarray:
    return np.array([EVEN if t % 2 == 0 else ODD for t in range(steps)])[:, None, :]


def test_each_metric_matches_its_hand_computation():
    metrics = named_metrics(alternating_loads_TLG(20), gpus_per_node=2)
    assert metrics["card_step"]["value"] == pytest.approx(4 / 2), "every step: busiest card 4, mean 2"
    assert metrics["node_step"]["value"] == pytest.approx(6 / 4), "nodes carry 6 and 2 (or 2 and 6): 6 / 4"
    assert metrics["card_window_10"]["value"] == pytest.approx(25 / 20), "10 steps sum to 25, 15, 15, 25"
    assert metrics["card_window_10"]["rows"] == 2, "20 steps are two blocks of 10"
    assert metrics["card_step"]["rows"] == 20


def test_a_window_longer_than_the_steps_and_a_single_node_say_why_they_have_no_value():
    metrics = named_metrics(alternating_loads_TLG(20), gpus_per_node=8)
    assert metrics["node_step"]["value"] is None and "one node" in metrics["node_step"]["why"]
    for window in WINDOWS[1:]:
        assert metrics[f"card_window_{window}"]["value"] is None
        assert f"fewer than {window}" in metrics[f"card_window_{window}"]["why"]


def test_the_group_metric_sums_contiguous_experts_and_needs_no_placement():
    counts_TLE = np.array([[[3, 1, 0, 0]], [[1, 1, 1, 1]]])
    metric = group_metric(counts_TLE, groups=2)
    assert metric["value"] == pytest.approx((4 / 2 + 2 / 2) / 2), "groups carry 4 and 0, then 2 and 2"
    with pytest.raises(ValueError, match="divide"):
        group_metric(counts_TLE, groups=3)


def test_each_floor_is_the_noise_floor_at_the_metric_s_own_load_and_cells():
    metrics = named_metrics(alternating_loads_TLG(20), gpus_per_node=2)
    picks = 8.0  # every step and layer carries 8 tokens
    assert metrics["card_step"]["noise_floor"] == noise_floor(picks, 4)
    assert metrics["node_step"]["noise_floor"] == noise_floor(picks, 2)
    assert metrics["card_window_10"]["noise_floor"] == noise_floor(10 * picks, 4)
    assert metrics["card_window_10"]["noise_floor"] < metrics["card_step"]["noise_floor"], "more load, less noise"


def test_score_placement_summary_carries_the_metrics_and_the_noise_floor_of_its_served_loads():
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=1, gpus_per_node=2)
    placement = Placement.equal_split(np.array([[0, 1, 2, 3]]), cluster, 4)
    counts_TLE = np.array([EVEN if t % 2 == 0 else ODD for t in range(20)], dtype=np.int64)[:, None, :]
    summary = score_placement(placement, counts_TLE, "static").summary()
    assert summary["imbalance_mean"] == pytest.approx(2.0)
    assert summary["metrics"]["card_step"]["value"] == pytest.approx(summary["imbalance_mean"])
    assert summary["metrics"]["node_step"]["value"] == pytest.approx(1.5)
    assert summary["noise_floor"] == summary["metrics"]["card_step"]["noise_floor"] == noise_floor(8, 4)
