"""Shared oracles for the placement tests."""

import numpy as np
import pytest
from scipy.optimize import linprog


def _exact_lp_max_load(counts_E: np.ndarray, phy2log_P: np.ndarray, gpu_of_slot_P: np.ndarray, num_gpus: int) -> float:
    """min t s.t. sum_g x[e, g] = c_e over the GPUs holding e, sum_e x[e, g] <= t, x >= 0."""
    pairs = np.unique(phy2log_P * num_gpus + gpu_of_slot_P)
    expert, gpu = pairs // num_gpus, pairs % num_gpus
    n = len(pairs)
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    a_eq = np.zeros((len(counts_E), n + 1))
    a_eq[expert, np.arange(n)] = 1.0
    a_ub = np.zeros((num_gpus, n + 1))
    a_ub[gpu, np.arange(n)] = 1.0
    a_ub[:, -1] = -1.0
    result = linprog(cost, A_ub=a_ub, b_ub=np.zeros(num_gpus), A_eq=a_eq, b_eq=counts_E, method="highs")
    return result.fun


@pytest.fixture
def exact_lp_max_load():
    """The optimal per-step max GPU load by an exact LP (scipy HiGHS): (counts_E, phy2log_P, gpu_of_slot_P, G)."""
    return _exact_lp_max_load
