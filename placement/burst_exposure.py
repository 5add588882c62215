"""What an unforeseen burst costs a placement: the imbalance when one expert's load rises `factor`-fold.

Legend: L layers, E logical experts, G GPUs.

A placement is fitted on the traffic it has seen. When an expert that was not hot there turns hot (a topic shift,
a burst of one kind of request), its tokens can only reach the GPUs that hold its replicas, and the experts with
one replica on those GPUs cannot move out of the way. The busiest GPU under the best split is then
max over GPU sets H of c(experts whose replicas all lie in H) / |H| (`placement.routing.dynamic_split`), so the
cost of a burst depends on where the placement put the bursting expert, not only on how many replicas it has.

`burst_exposure` measures it: for every layer and every expert e, the layer's load with c_e multiplied by
`factor`, split over the replicas at the certified optimum (the `dynamic` scorer's split, which the live router
reaches within its gap), scored as max / mean GPU load. The mean over experts is the expected imbalance while a
uniformly chosen expert bursts; with a fraction q of steps carrying such a burst, a placement's held-out imbalance is
about (1 - q) times its calm score plus q times that mean. The forecast benchmark uses it to say how much of the
held-out imbalance is bursts no forecast of the mix foresees (figures: docs/benchmarks.md, 'What an unforeseen
burst costs').
"""

import numpy as np

from placement.placement_model import Placement
from placement.imbalance_metrics import max_over_mean
from placement.scoring import dynamic_gpu_loads


def burst_exposure(placement: Placement, load_LE: np.ndarray, factor: float) -> np.ndarray:
    """[L, E] max / mean GPU load of each layer under the best split when expert e's load is multiplied by `factor`.

    Args:
        placement: the placement to score (L layers, E experts).
        load_LE: [L, E] non-negative expected tokens per expert (for instance a window's mean), not all zero in a
            layer.
        factor: >= 1, the burst's multiplier on one expert's load (1: no burst, every entry the calm score).

    Returns:
        exposure_LE: [L, E] float64 >= 1; entry (l, e) is layer l's imbalance while expert e bursts. Its mean over
        E is the expected imbalance of a burst on a uniformly chosen expert.

    Raises:
        ValueError: `factor` below 1, or `load_LE` not [L, E] of the placement, negative or all zero in a layer.
    """
    load = np.asarray(load_LE, dtype=np.float64)
    num_layers, num_experts = placement.phy2log_LP.shape[0], placement.num_experts
    if not np.isfinite(factor) or factor < 1:
        raise ValueError(f"factor must be a finite number >= 1 (the burst's multiplier); got {factor}")
    if load.shape != (num_layers, num_experts):
        raise ValueError(f"load_LE must be [layers, experts] = [{num_layers}, {num_experts}] to match the placement; "
                         f"got shape {load.shape}")
    if not np.isfinite(load).all() or (load < 0).any() or (load.sum(axis=1) <= 0).any():
        raise ValueError("load_LE must be finite, non-negative and carry tokens in every layer")
    # Row e of the contingencies: every layer's load with expert e scaled. [E, L, E]
    rows_ELE = np.repeat(load[None], num_experts, axis=0)
    experts = np.arange(num_experts)
    rows_ELE[experts, :, experts] *= factor
    loads_ELG, _ = dynamic_gpu_loads(rows_ELE, placement)
    return max_over_mean(loads_ELG).T
