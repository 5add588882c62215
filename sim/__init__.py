"""Trace-driven simulator of the serving cluster around the balancer: vision cards, prefill nodes with KV cache
tiers, and decode EP units whose expert balance comes from the project's placement code (`eplb sim`)."""

from sim.config import SimConfig, SimConfigError, load_sim_config
from sim.engine.run import run_simulation

__all__ = ["SimConfig", "SimConfigError", "load_sim_config", "run_simulation"]
