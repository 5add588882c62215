"""What rank 0 fits: the recorded window moved to the steps its placement will serve (from the last measured lag
for one interval), or the window as it is with forecast="none"."""

from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.rebalancer import Rebalancer
from eplb.rebalance.stats import RebalanceStats
from placement.forecast import forecast_window, hedged_horizons


def rising_window(steps: int = 30) -> np.ndarray:
    """[T, 2, 8] counts whose expert 0 takes a growing share."""
    rng = np.random.default_rng(0)
    rows = []
    for share in np.linspace(0.05, 0.4, steps):
        p = np.concatenate([[share], np.full(7, (1 - share) / 7)])
        rows.append([rng.multinomial(3000, p), rng.multinomial(3000, p[::-1])])
    return np.asarray(rows, dtype=np.int64)


@pytest.mark.parametrize("lags, lag", [([], 0), ([12, 37], 37)], ids=["before-any-switch", "last-lag"])
def test_the_window_moves_to_the_served_steps_from_the_last_lag(lags, lag):
    config = RebalanceConfig(window=30, interval=50)
    rebalancer = SimpleNamespace(config=config, stats=RebalanceStats(lag_steps=list(lags)))
    window = rising_window()
    fitted = Rebalancer._fit_window(rebalancer, window)
    np.testing.assert_array_equal(fitted, forecast_window(window, hedged_horizons(lag, 50)))
    assert fitted[-10:, 0, 0].sum() > window[-10:, 0, 0].sum()  # the rising expert is given more than it had


def test_no_forecast_fits_the_window_as_it_is():
    rebalancer = SimpleNamespace(config=RebalanceConfig(forecast="none"), stats=RebalanceStats(lag_steps=[5]))
    window = rising_window()
    assert Rebalancer._fit_window(rebalancer, window) is window


def test_an_unknown_forecast_is_refused():
    with pytest.raises(ValidationError, match="forecast"):
        RebalanceConfig(forecast="arima")
