"""The chain layout the `cpsat` policy starts from: valid, connected, and per-step aware for one-replica experts."""

import numpy as np
import pytest

from placement.errors import PlacementInfeasibleError
from placement.policies.chain_layout import ORDERS, chain_layout
from placement.policies.deepseek import replicate_greedy


def _gpu_sets(phy2log_P: np.ndarray, slots: int) -> list[set[int]]:
    gpu_of_slot = np.arange(len(phy2log_P)) // slots
    return [set(gpu_of_slot[phy2log_P == e].tolist()) for e in range(phy2log_P.max() + 1)]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("num_gpus,slots", [(8, 3), (6, 5)])
def test_layout_holds_every_replica_once_per_gpu_and_links_all_gpus(order, num_gpus, slots):
    rng = np.random.default_rng(3)
    num_experts = 16
    steps_TE = rng.poisson(rng.lognormal(2.0, 0.5, num_experts), size=(5, num_experts)).astype(float)
    load_E = steps_TE.mean(axis=0)
    _, _, replicas_LE = replicate_greedy(load_E[None], num_gpus * slots)
    phy2log = chain_layout(load_E, replicas_LE[0], num_gpus, slots, order, seed=1, steps_TE=steps_TE)
    assert len(phy2log) == num_gpus * slots
    assert (np.bincount(phy2log, minlength=num_experts) == replicas_LE[0]).all()
    sets = _gpu_sets(phy2log, slots)
    assert all(len(gpus) == replicas_LE[0][e] for e, gpus in enumerate(sets)), "two replicas share a GPU"
    # GPUs linked by a shared expert form one component when the replicated experts can span the ring.
    if (replicas_LE[0] - 1).sum() >= num_gpus:
        reached, frontier = {0}, [0]
        while frontier:
            gpu = frontier.pop()
            for gpus in sets:
                if gpu in gpus and not gpus <= reached:
                    frontier += sorted(gpus - reached)
                    reached |= gpus
        assert reached == set(range(num_gpus))


def test_one_replica_experts_avoid_gpus_busy_on_their_steps():
    # Experts 0 and 2 are busy on step 0, 1 and 3 on step 1. By the mean alone 2 joins 0 (both GPUs carry 5
    # tokens a step on average) and the step peaks are 16 and 16; by the steps, 2 joins 1: peaks 10 and 10.
    steps_TE = np.array([[10.0, 0.0, 6.0, 0.0], [0.0, 10.0, 0.0, 6.0]])
    ones = np.ones(4, dtype=np.int64)

    def peak_sum(phy2log: np.ndarray) -> float:
        loads_TG = np.stack([steps_TE[:, phy2log[g * 2 : g * 2 + 2]].sum(axis=1) for g in range(2)], axis=1)
        return float(loads_TG.max(axis=1).sum())

    by_mean = chain_layout(steps_TE.mean(axis=0), ones, 2, 2)
    by_steps = chain_layout(steps_TE.mean(axis=0), ones, 2, 2, steps_TE=steps_TE)
    assert peak_sum(by_mean) == 32.0
    assert peak_sum(by_steps) == 20.0


def test_too_many_replicas_for_the_gpus_is_a_clear_error():
    with pytest.raises(PlacementInfeasibleError, match="only 2 GPUs"):
        chain_layout(np.ones(3), np.array([3, 1, 2]), 2, 3)
