"""The exact optimum of one step's split by a linear program: the reference the routers are checked against.

Legend: E logical experts, G GPUs, P slots.
"""

import numpy as np


def exact_max_load(counts_E: np.ndarray, phy2log_P: np.ndarray, gpu_of_slot_P: np.ndarray, num_gpus: int) -> float:
    """The smallest possible busiest-GPU load of one step (fractional tokens), by scipy's HiGHS.

    min t  s.t.  sum_g x[e, g] = c_e over the GPUs holding e,  sum_e x[e, g] <= t,  x >= 0.
    """
    from scipy.optimize import linprog  # imported on use: nothing that starts up needs scipy

    pairs = np.unique(np.asarray(phy2log_P) * num_gpus + np.asarray(gpu_of_slot_P))
    expert, gpu = pairs // num_gpus, pairs % num_gpus
    n = len(pairs)
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    a_eq = np.zeros((len(counts_E), n + 1))
    a_eq[expert, np.arange(n)] = 1.0
    a_ub = np.zeros((num_gpus, n + 1))
    a_ub[gpu, np.arange(n)] = 1.0
    a_ub[:, -1] = -1.0
    result = linprog(cost, A_ub=a_ub, b_ub=np.zeros(num_gpus), A_eq=a_eq, b_eq=np.asarray(counts_E, dtype=float),
                     method="highs")
    return float(result.fun)
