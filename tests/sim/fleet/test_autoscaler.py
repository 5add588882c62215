"""The fleet's autoscaler: it never shrinks the fleet near its quota, moves nodes between the stages before adding
any, and cuts a first sizing to the quota as the unit-by-unit cut would."""

import numpy as np
import pytest

from sim.fleet.autoscaler import Autoscaler, within_quota
from sim.fleet.config import AutoscalerConfig


@pytest.mark.parametrize("seed", range(6))
def test_autoscaler_never_shrinks_the_fleet_while_quota_use_is_above_the_threshold(seed):
    rng = np.random.default_rng(seed)
    quota = int(rng.integers(40, 120))
    config = AutoscalerConfig(quota_nodes=quota, shrink_quota_threshold=float(rng.uniform(0.5, 0.9)),
                              shrink_after_s=float(rng.choice([0.0, 600.0])), move_s=float(rng.uniform(0, 900)),
                              grow_s=float(rng.uniform(0, 900)), min_prefill_nodes=2, min_decode_nodes=4)
    scaler = Autoscaler(config, {"prefill": 2, "decode": 4}, {"prefill": 4, "decode": 8})
    shrinks = refusals = 0
    for step in range(600):
        # Random daily-like waves with bursts, first well under the quota, then reaching past the threshold.
        reach = 0.2 if step < 300 else 0.45  # both stages: up to 2 x reach x quota, bursts aside
        wave = 1 + np.sin(step / 15.0 + np.array([0.0, 1.0])) * rng.uniform(0.5, 1.0, size=2)
        burst = rng.uniform(1.0, 1.6) if rng.random() < 0.05 else 1.0
        needed = dict(zip(("prefill", "decode"), (wave * burst * reach * quota / 2).tolist()))
        held_before = scaler.held
        surplus_before = scaler.surplus_since
        decision = scaler.decide(step * config.interval_s, needed)
        assert scaler.held <= quota
        # Quota use: the nodes the load needs now (the stages' targets) over the quota.
        assert decision.quota_use == pytest.approx(sum(decision.target.values()) / quota)
        if scaler.held < held_before:
            shrinks += 1
            assert decision.quota_use <= config.shrink_quota_threshold
        elif surplus_before is not None and decision.quota_use > config.shrink_quota_threshold:
            refusals += 1
    assert shrinks > 0 and refusals > 0  # both sides of the rule were exercised


def test_autoscaler_moves_nodes_between_stages_before_adding_any():
    config = AutoscalerConfig(quota_nodes=100, min_prefill_nodes=4, min_decode_nodes=4, move_s=120.0)
    scaler = Autoscaler(config, {"prefill": 4, "decode": 4}, {"prefill": 40, "decode": 20})
    decision = scaler.decide(0.0, {"prefill": 20.0, "decode": 40.0})
    assert decision.moved == {"prefill": 0, "decode": 20} and decision.grown == {"prefill": 0, "decode": 0}
    assert scaler.serving == {"prefill": 20, "decode": 20}  # the moved nodes serve after move_s
    scaler.advance(120.0)
    assert scaler.serving == {"prefill": 20, "decode": 40}


def _cut_one_unit_at_a_time(nodes: dict[str, int], unit_nodes: dict[str, int], room: int) -> dict[str, int]:
    """Reference for `within_quota`: one unit at a time from the larger stage (the first on a tie)."""
    nodes = dict(nodes)
    while sum(nodes.values()) > room:
        stage = max(nodes, key=nodes.get)
        if nodes[stage] <= unit_nodes[stage]:
            break
        nodes[stage] -= unit_nodes[stage]
    return nodes


def test_the_cut_to_the_quota_is_the_unit_by_unit_cut_done_at_once():
    rng = np.random.default_rng(0)
    for _ in range(5000):
        units = {"prefill": int(rng.integers(1, 6)), "decode": int(rng.integers(1, 20))}
        nodes = {stage: units[stage] * int(rng.integers(1, 40)) for stage in units}
        if rng.random() < 0.3:
            nodes["decode"] = nodes["prefill"]  # ties go to the first stage
        room = int(rng.integers(0, 600))
        assert within_quota(nodes, units, room) == _cut_one_unit_at_a_time(nodes, units, room)
    # billions of nodes beyond the quota take a few dozen turns, not one per unit (the same as ten thousand)
    units = {"prefill": 4, "decode": 18}
    assert within_quota({"prefill": 4 * 10**9, "decode": 18 * 10**9}, units, 320) == \
        _cut_one_unit_at_a_time({"prefill": 4 * 10**4, "decode": 18 * 10**4}, units, 320) == \
        {"prefill": 160, "decode": 144}
