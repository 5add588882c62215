"""Days of a whole serving fleet on token rates: units costed from the shared cost model, the autoscaler that moves
nodes between prefill and decode, card failures, money, and the figures.

Imports nothing at package level, so that `sim.config` can read `sim.fleet.config` without importing the run.
"""
