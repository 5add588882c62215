"""The imbalance-against-load curve: a least-squares `floor + noise / sqrt(load)` that never rises with the load,
measured per stage on request-level traffic (or on one token-level trace thinned to every load; the same run gives
the same curve), the loads' served imbalance falling as the tokens per card grow, and static routing."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement import ClusterSpec, rolling_replay
from sim.config import SimConfig, SimConfigError
from sim.engine import load_imbalance as curves
from sim.engine.decode_balance import served_imbalance_T, synthetic_counts, traffic_config
from sim.engine.load_imbalance import CURVE_LOADS, REQUEST_CURVE_LOADS, fit_load_imbalance, load_imbalance

QUICK_BALANCE = {"policy": "deepseek", "layers": 2, "steps": 40, "refit_every": 10, "window": 10}


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(measured=st.lists(st.floats(0.5, 5.0), min_size=3, max_size=3))
def test_the_fitted_curve_never_rises_with_the_load_and_never_goes_below_one(measured):
    curve = fit_load_imbalance(CURVE_LOADS, tuple(measured))
    values = [curve.at(load) for load in (0.5, 1, 2, 4, 10, 64, 100, 1024, 10**6)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert min(values) >= 1.0 and curve.noise >= 0


def test_the_fit_goes_through_points_that_follow_the_model():
    loads = CURVE_LOADS
    measured = tuple(1.05 + 0.6 / np.sqrt(load) for load in loads)
    curve = fit_load_imbalance(loads, measured)
    assert curve.floor == pytest.approx(1.05) and curve.noise == pytest.approx(0.6)
    assert curve.at(16) == pytest.approx(1.2)


def test_one_trace_per_shape_gives_the_same_curve_and_the_served_imbalance_falls_with_the_load(monkeypatch):
    config = SimConfig.model_validate({"balance": QUICK_BALANCE, "cluster": {"decode_cards": 32}})
    monkeypatch.setattr(curves, "_CURVES", {})
    first = load_imbalance(config, 32, 9)
    monkeypatch.setattr(curves, "_CURVES", {})
    assert load_imbalance(config, 32, 9) == first  # the same thinning of the same trace
    assert first.measured[0] > first.measured[1] > first.measured[2] >= 1.0  # 4, 64, 1024 tokens per card
    assert first.at(4) == pytest.approx(first.measured[0], rel=0.05)


def test_request_traffic_is_the_default_and_each_stage_is_measured_at_its_own_loads(monkeypatch):
    config = SimConfig.model_validate({"balance": QUICK_BALANCE, "cluster": {"decode_cards": 32}})
    assert config.balance.traffic == "requests"
    monkeypatch.setattr(curves, "_CURVES", {})
    prefill = load_imbalance(config, 32, 9, "prefill")
    decode = load_imbalance(config, 32, 9, "decode")
    assert prefill.loads == REQUEST_CURVE_LOADS["prefill"] and decode.loads == REQUEST_CURVE_LOADS["decode"]
    assert all(value >= 1.0 for value in prefill.measured + decode.measured)
    tokens = SimConfig.model_validate({"balance": {**QUICK_BALANCE, "traffic": "tokens"},
                                       "cluster": {"decode_cards": 32}})
    assert load_imbalance(tokens, 32, 9, "prefill").loads == CURVE_LOADS


def test_whole_prompts_leave_more_imbalance_than_the_same_tokens_drawn_independently(monkeypatch):
    # A prefill batch of a few whole prompts, each keeping its own experts, against independent tokens at the same
    # popularity: the request structure the simulator's prefill now carries.
    monkeypatch.setattr(curves, "_CURVES", {})
    settings = {"balance": {**QUICK_BALANCE, "skew": 0.8}, "capacity": {"prompt_tokens": 4096}}
    requests = SimConfig.model_validate(settings)
    tokens = SimConfig.model_validate({**settings, "balance": {**settings["balance"], "traffic": "tokens"}})
    assert load_imbalance(requests, 32, 9, "prefill").at(2048) > load_imbalance(tokens, 32, 9, "prefill").at(2048)


def test_static_routing_serves_with_a_fixed_equal_split():
    config = SimConfig.model_validate({"balance": {**QUICK_BALANCE, "routing": "static", "traffic": "tokens"}})
    counts_TLE = synthetic_counts(config, 16, 32)
    served = served_imbalance_T(config, 16, 17, counts_TLE)[0]
    replay = rolling_replay(counts_TLE, ClusterSpec(num_gpus=16, slots_per_gpu=17, gpus_per_node=8), "deepseek",
                            every=10, window=10, routing="static")
    np.testing.assert_allclose(served, replay.held_out.imbalance_TL.mean(axis=1))


def test_a_decode_traffic_too_large_to_hold_is_refused_naming_the_keys():
    config = SimConfig.model_validate({"balance": {**QUICK_BALANCE, "layers": 256}, "cluster": {"decode_cards": 1024}})
    with pytest.raises(SimConfigError, match="balance.layers"):
        traffic_config(config, "decode", 1024 * 256)
    assert traffic_config(config, "prefill", 1024 * 256).mode == "prefill"  # prefill holds a batch's prompts only


@pytest.mark.parametrize("policy", ["deepseek", "cpsat"])
def test_node_limits_keep_a_hot_group_on_its_node_and_the_replay_pays_for_it(policy):
    # 32 experts in 8 groups of 4, all but a trickle of the load on group 0; 16 cards of 3 slots in two nodes. Free,
    # the hot experts' replicas spread over both nodes; node-limited, group 0 stays on one node of 8 cards, so the
    # other node's cards carry the trickle and the busiest card about twice the mean.
    config = SimConfig.model_validate({"model": {"num_routed_experts": 32, "top_k": 4},
                                       "balance": {"policy": policy, "refit_every": 10, "window": 10,
                                                   "work_limit": 0.5}})
    counts_TLE = np.full((40, 1, 32), 2, dtype=np.int64)
    counts_TLE[:, :, :4] = 1000
    free, limited = (served_imbalance_T(config, 16, 3, counts_TLE, node_limited=flag)[0].mean() for flag in
                     (False, True))
    assert free < 1.3 and limited > 1.8
