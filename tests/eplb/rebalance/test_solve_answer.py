"""The solve's answer survives its one-array wire format whole: placement, fitted level (or none), fills, chunks."""

import numpy as np

from eplb.rebalance.background_solver import SolveResult
from eplb.rebalance.solve_answer import pack_answer, packed_size, unpack_answer
from placement import ClusterSpec, fit_placement


def test_an_answer_round_trips_through_one_int64_array():
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4)
    placement = fit_placement("deepseek", np.random.default_rng(0).poisson(np.linspace(60, 2, 16), (10, 2, 16)),
                              cluster)
    fills = np.arange(3 * 8, dtype=np.int64).reshape(3, 8)
    chunks = np.arange(5 * 6, dtype=np.int64).reshape(5, 6)
    for fitted in (1.0123, None):
        packed = pack_answer(SolveResult(placement, (3, 7), fitted, fills, chunks))
        assert packed.dtype == np.int64 and len(packed) == packed_size(placement, 3, 5)
        target, level, fills_U8, chunks_C6 = unpack_answer(packed, placement, 3, 5, "deepseek")
        assert np.array_equal(target.phy2log_LP, placement.phy2log_LP)
        assert np.array_equal(target.weights_LP, placement.weights_LP)
        assert level == fitted and np.array_equal(fills_U8, fills) and np.array_equal(chunks_C6, chunks)
