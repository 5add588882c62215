"""The up-front work estimate: close to what a small run does, every example config within the budgets, and a run
over the machine's memory refused before any request is made."""

from pathlib import Path

import pytest

import sim.engine.run
from sim import SimConfig, SimConfigError, load_sim_config, run_simulation
from sim.engine.decode_balance import read_routing_trace, routing_shape
from sim.work_budget import check_engine_work, check_fleet_work, check_replay_work, engine_work
from sim.workload import trace_requests

CONFIGS = Path(__file__).resolve().parents[2] / "sim" / "configs"
SMALL = {
    "duration_s": 30.0,
    "workload": {"synthetic": {"sessions_per_s": 10.0}},
    "cluster": {"prefill_nodes": 2, "decode_cards": 16, "vision_cards": 1},
    "balance": {"policy": "none"},
}


def test_the_estimate_is_close_to_the_requests_and_decode_steps_of_a_small_run():
    config = SimConfig.model_validate(SMALL)
    work = engine_work(config, None, routing_shape(config, None))
    result, report = run_simulation(config)
    assert 0.5 * report["requests"] <= work.requests <= 2 * report["requests"]
    assert result.decode_steps <= work.decode_steps <= 4 * result.decode_steps  # an upper estimate
    assert work.events > work.requests * (4 + config.cluster.prefill_nodes)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_example_config_fits_the_budgets(name):
    config = load_sim_config(CONFIGS / name)
    if config.fleet is not None:
        check_fleet_work(config)
        check_fleet_work(config.model_copy(update={"fleet": config.fleet.model_copy(update={"days": 7.0})}))
        return
    if config.workload.trace is not None and not Path(config.workload.trace).is_file():
        pytest.skip(f"{config.workload.trace} is absent")
    shape = routing_shape(config, read_routing_trace(config))
    check_engine_work(config, trace_requests(config), shape)
    check_replay_work(config, shape)


def test_a_run_needing_more_memory_than_the_machine_has_is_refused_before_any_request(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("requests were generated before the memory check")

    monkeypatch.setattr(sim.engine.run, "synthetic_requests", no_work)
    monkeypatch.setattr("sim.work_budget.machine_memory_bytes", lambda: 2**20)
    with pytest.raises(SimConfigError, match=r"this run would need about .* GiB .*; a run may take 0\.0 GiB, half "
                                             r"this machine's\): lower workload\.synthetic\.sessions_per_s or "
                                             r"duration_s"):
        run_simulation(SimConfig.model_validate(SMALL))
