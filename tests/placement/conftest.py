"""Shared oracles for the placement tests."""

import pytest

from placement.routing.exact_split import exact_max_load


@pytest.fixture
def exact_lp_max_load():
    """The optimal per-step max GPU load by an exact LP (scipy HiGHS): (counts_E, phy2log_P, gpu_of_slot_P, G)."""
    return exact_max_load
