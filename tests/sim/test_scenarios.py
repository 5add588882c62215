"""Traffic scenarios: the cases a figure is run over and how a case reads a config."""

import pytest

from sim.calibration import fitted
from sim.config import SimConfig
from sim.scenarios import BURSTS, TrafficCase, apply_case, cases, skew_of, spread


def test_cases_cross_scenarios_bursts_and_seeds_in_order():
    found = cases(("single-dataset", "production-mix"), ("on", "off"), 2)
    assert len(found) == 8 and found[0] == TrafficCase("single-dataset", "on", 0)
    assert found[-1] == TrafficCase("production-mix", "off", 1)


@pytest.mark.parametrize("bad", [(("busy-day",), ("on",), 1), (("production-mix",), ("sometimes",), 1),
                                 (("production-mix",), ("on",), 0)], ids=["scenario", "bursts", "seeds"])
def test_cases_refuse_an_unknown_name_or_no_seed(bad):
    with pytest.raises(ValueError):
        cases(*bad)


def test_a_case_sets_the_skew_the_bursts_and_offsets_the_seed():
    config = SimConfig(seed=5)
    single = apply_case(config, TrafficCase("single-dataset", "on", 0))
    assert single.balance.skew == fitted("traffic.skew") == skew_of("single-dataset")
    assert single.balance.burst_rate == BURSTS["on"] == config.balance.burst_rate and single.seed == 5
    mixed = apply_case(config, TrafficCase("production-mix", "off", 2))
    assert mixed.balance.skew == skew_of("production-mix") < single.balance.skew
    assert mixed.balance.burst_rate == 0.0 and mixed.seed == 7
    assert config.balance.skew is None, "the config itself is left as it was"


def test_a_spread_holds_the_central_value_and_the_extremes():
    assert spread(1.2, [1.1, 1.5]) == {"central": 1.2, "min": 1.1, "max": 1.5}
    assert spread(1.2, []) == {"central": 1.2, "min": 1.2, "max": 1.2}
