"""Routing: the per-step split of each expert's tokens over its replicas, one home for everyone who splits.

- `dynamic_split` (numpy): the best split of each step, by damped water-filling with momentum, with a certified
  lower bound; the `ReplicaGraph` of a layer. Used by the `cpsat` policy's fits (`ROUTER_ROUNDS` rounds, as the
  live router runs) and by scoring under dynamic routing.
- `live_router` (torch): the split a decode worker runs every step on the device the counts live on, in whole
  tokens per slot (`LayerRoutingTable`, `route_step`): exact on chain layouts (`chain_split`), else the same
  water-filling rounds as `dynamic_split` (`fractional_split`). The live decode layer (`eplb.live`) runs it, and
  scoring under live routing replays it (the simulator too, never a copy of it). Import it by its module path,
  `placement.routing.live_router`: it needs torch, which this package leaves unimported so numpy users of routing
  do not pay for it. `chain_split` and `index_tables` are its torch helpers.
- `trial_split` (numpy): the same rounds on many trial slot maps of one layer at once (one slot apart: the burst
  patch's moves), each trial's busiest GPU over the mean, no certificate.
- `static_weights` (numpy): static replica weights fitted to an expected load, from the best split of that load
  (the `cpsat` policy's weights).
- `exact_split` (scipy): the exact optimum of one step by a linear program, the oracle tests and benchmarks check
  the routers against.
"""

from placement.routing.dynamic_split import (
    CERTIFY_MOMENTUM,
    MOMENTUM,
    ROUTER_ROUNDS,
    ReplicaGraph,
    certified_lower_bound,
    optimal_split,
    optimal_split_loads,
)
from placement.routing.exact_split import exact_max_load
from placement.routing.static_weights import fitted_weights

__all__ = [
    "CERTIFY_MOMENTUM",
    "MOMENTUM",
    "ROUTER_ROUNDS",
    "ReplicaGraph",
    "certified_lower_bound",
    "exact_max_load",
    "fitted_weights",
    "optimal_split",
    "optimal_split_loads",
]
