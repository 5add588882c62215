"""The fleet's money: valley hours may wrap past midnight, and the billing of tokens follows them."""

import pytest

from sim.fleet.config import Prices
from sim.fleet.economics import price_factor, revenue_usd


def test_valley_hours_may_wrap_past_midnight():
    prices = Prices(valley_hours=(22.0, 6.0), valley_price_factor=0.25)
    assert [price_factor(hour, prices) for hour in (21.9, 22.0, 3.0, 5.99, 6.0, 12.0)] == [1, 0.25, 0.25, 0.25, 1, 1]
    assert revenue_usd(1e6, 1e6, 1e6, 23.0, prices) == pytest.approx((0.14 + 0.55 + 2.19) * 0.25)
