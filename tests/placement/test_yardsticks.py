"""The yardsticks: the noise floor, the granularity bound and the expectation oracle."""

import numpy as np
import pytest

from placement import ClusterSpec, fit_placement, score_placement
from placement.noise_floor import noise_floor
from placement.yardsticks import expectation_oracle, granularity_bound, trace_yardsticks


def test_the_noise_floor_of_two_picks_on_two_cells_is_one_and_a_half():
    # (2, 0) or (0, 2) half the time (max 2 over a mean of 1), (1, 1) the other half (max 1): 1.5.
    assert noise_floor(2, 2) == pytest.approx(1.5, abs=0.03)


def test_the_noise_floor_is_one_for_one_cell_or_no_pick_and_repeats_exactly():
    assert noise_floor(1000, 1) == 1.0 and noise_floor(0, 8) == 1.0
    assert noise_floor(1024 * 72, 72, seed=3) == noise_floor(1024 * 72, 72, seed=3)


def test_the_noise_floor_at_128_tokens_of_top_8_over_72_cards_is_the_normal_approximation_s():
    # Each card draws about 1,024 picks, sd 32; the largest of 72 normals is about 2.4 sd: 1 + 2.4 * 32 / 1024.
    assert noise_floor(1024 * 72, 72) == pytest.approx(1 + 2.4 * 32 / 1024, abs=0.01)


def test_the_granularity_bound_is_the_replica_count_bound_of_the_expectation():
    expected = np.array([[6.0, 1.0, 1.0]])
    assert granularity_bound(expected, ClusterSpec(num_gpus=2, slots_per_gpu=2)) == pytest.approx(1.0)
    assert granularity_bound(expected, ClusterSpec(num_gpus=4, slots_per_gpu=1)) == pytest.approx(1.5)


def test_trace_yardsticks_use_the_expectation_where_given_and_block_means_elsewhere():
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=1)
    counts_TLE = np.tile(np.array([6, 1, 1, 0]), (10, 1, 1))
    plain = trace_yardsticks(counts_TLE, cluster)
    assert plain["granularity_bound"] == pytest.approx(6 / 2) and "blocks" in plain["granularity_from"]
    given = trace_yardsticks(counts_TLE, cluster, np.full((10, 1, 4), 2.0))
    assert given["granularity_bound"] == pytest.approx(1.0) and given["granularity_from"] == "expected load"
    assert plain["noise_floor"] == noise_floor(8, 4)


def _switching_traffic(steps: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Counts [T, 1, 16] drawn from an expectation that switches its hot experts halfway."""
    rng = np.random.default_rng(5)
    first, second = rng.lognormal(0, 1.2, 16), rng.lognormal(0, 1.2, 16)
    expected = np.array([first if t < steps // 2 else second for t in range(steps)])
    expected = expected / expected.sum(axis=1, keepdims=True) * 512
    counts = np.stack([rng.multinomial(512, row / row.sum()) for row in expected])
    return counts[:, None, :], expected[:, None, :]


def test_the_oracle_follows_the_expectation_where_one_fit_on_the_first_half_cannot():
    counts, expected = _switching_traffic()
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4)
    oracle = expectation_oracle(counts, expected, cluster, "deepseek", "dynamic", every=1)
    stale = fit_placement("deepseek", np.rint(expected[:1] * 64), cluster)
    assert oracle.imbalance_TL.shape == (40, 1)
    assert oracle.imbalance_TL[20:].mean() < score_placement(stale, counts[20:], "dynamic").imbalance_TL.mean()


def test_the_oracle_with_one_block_is_the_placement_fitted_on_the_block_s_mean_expectation():
    counts, expected = _switching_traffic()
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4)
    oracle = expectation_oracle(counts, expected, cluster, "deepseek", "static", every=40)
    once = fit_placement("deepseek", np.rint(expected.mean(axis=0, keepdims=True) * 64), cluster)
    np.testing.assert_array_equal(oracle.imbalance_TL, score_placement(once, counts, "static").imbalance_TL)


def test_the_oracle_refuses_arrays_of_two_shapes_and_an_empty_block():
    counts, expected = _switching_traffic()
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4)
    with pytest.raises(ValueError, match="shape of counts_TLE"):
        expectation_oracle(counts, expected[:10], cluster)
    with pytest.raises(ValueError, match="every must be >= 1"):
        expectation_oracle(counts, expected, cluster, every=0)
