"""One simulation from a config: requests, the decode units' imbalance from the placement code, the engine, the
report.

The inputs are read and the run's work estimated (`sim.work_budget`) before any of it is done, so a config that
names a wrong routing trace or asks for more than the budgets is refused at once."""

import time
from collections.abc import Callable

from sim.config import SimConfig
from sim.engine.decode_balance import decode_imbalance_T, read_routing_trace, routing_shape
from sim.engine.stages import SimResult, Simulation
from sim.engine.report import build_report
from sim.work_budget import check_engine_work, check_replay_work
from sim.workload import synthetic_requests, trace_requests


def run_simulation(config: SimConfig,
                   progress: Callable[[float, float], None] | None = None) -> tuple[SimResult, dict]:
    """Simulate `config`; returns the engine's result and the report (wall time includes the placement replay).

    Raises:
        SimConfigError: an input the config names does not fit it, or the run exceeds a budget of
            `sim.work_budget`; both before any simulation.
    """
    began = time.perf_counter()
    from_trace = trace_requests(config)
    counts_TLE = read_routing_trace(config)
    shape = routing_shape(config, counts_TLE)
    check_engine_work(config, from_trace, shape)
    check_replay_work(config, shape)
    requests = from_trace if from_trace is not None else synthetic_requests(
        config.workload.synthetic, config.duration_s, config.cache.block_tokens, config.seed)
    imbalance_T = decode_imbalance_T(config, counts_TLE)
    result = Simulation(config, requests, imbalance_T).run(progress)
    return result, build_report(result, time.perf_counter() - began)
