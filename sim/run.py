"""One simulation from a config: requests, the decode units' imbalance from the placement code, the engine, the
report."""

import time
from collections.abc import Callable

from sim.config import SimConfig
from sim.decode_balance import decode_imbalance_T
from sim.engine import SimResult, Simulation
from sim.report import build_report
from sim.workload import requests_for

TOKENS_PER_CARD_PER_STEP = 64  # the synthetic routing trace's step: a decode card's typical batch


def run_simulation(config: SimConfig,
                   progress: Callable[[float, float], None] | None = None) -> tuple[SimResult, dict]:
    """Simulate `config`; returns the engine's result and the report (wall time includes the placement replay)."""
    began = time.perf_counter()
    requests = requests_for(config)
    imbalance_T = decode_imbalance_T(config, TOKENS_PER_CARD_PER_STEP * config.cluster.decode_cards)
    result = Simulation(config, requests, imbalance_T).run(progress)
    return result, build_report(result, time.perf_counter() - began)
