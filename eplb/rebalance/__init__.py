"""Changing the placement of a running EP group without stopping decode, and surviving ranks that die.

Where each part lives: `rebalancer` (`Rebalancer`, the per-step protocol), `protocol` (the per-step message, the
solve statuses, the phases), `attempt` (one attempt's state), `solving` and `background_solver` (rank 0's solve off
the decode thread, paced by `cpu_pacer`), `solve_answer` (its answer as one broadcast), `move_plan` (which weights
move where, in rounds), `transfer` and `weight_moves` (moving them during decode), `host_copies` (the experts kept in
host memory for peers' failures), `drift` (the refit-on-drift trigger), `recovery` and `survivor_placement`
(surviving a dead rank), `stats` and `config`.

The names are imported on first access (PEP 562), so that the solver's helper process (`background_solver`,
`move_plan`) starts without importing torch.
"""

from traces.lazy_exports import lazy_getattr

_NAMES = {  # name -> the module that defines it
    "RebalanceConfig": "eplb.rebalance.config",
    "Rebalancer": "eplb.rebalance.rebalancer",
    "RecoveryReport": "eplb.rebalance.recovery",
}

__all__ = sorted(_NAMES)


__getattr__ = lazy_getattr(__name__, _NAMES)
