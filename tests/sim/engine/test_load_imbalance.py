"""The imbalance-against-load curve: a least-squares `floor + noise / sqrt(load)` that never rises with the load,
measured on one routing trace thinned to every load (the same run gives the same curve), and the loads' served
imbalance falling as the tokens per card grow."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.engine import load_imbalance as curves
from sim.engine.load_imbalance import CURVE_LOADS, fit_load_imbalance, load_imbalance

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
