"""Scoring a placement on a routing trace: per (step, layer) imbalance under static or dynamic routing.

Legend: T steps, L layers, E logical experts, G GPUs, P slots.

- static routing: expert e's tokens split over its replicas in the placement's fixed `weights`;
- dynamic routing: each step's tokens split over replicas to minimise that step's busiest GPU
  (`placement.routing.dynamic_split`: provably within `DYNAMIC_TOLERANCE` of the optimum, gap reported);
- live routing: each step split by the live router a decode worker runs (`placement.routing.live_router`, whole
  tokens: exact on chain layouts, else a fixed number of water-filling rounds), so the score is what serving would
  see.
Imbalance is max over GPUs / mean over GPUs of tokens processed; a step with no tokens scores 1.0.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from placement.bounds import imbalance_lower_bound
from placement.errors import PlacementFormatError
from placement.imbalance_metrics import max_over_mean, named_metrics
from placement.placement_model import Placement
from placement.routing.dynamic_split import ReplicaGraph, optimal_split_loads
from traces.routing_trace import validate_counts

Routing = Literal["static", "dynamic", "live"]
ROUTINGS: tuple[str, ...] = ("static", "dynamic", "live")
DYNAMIC_TOLERANCE = 1e-3


@dataclass(frozen=True)
class StepScores:
    """Per (step, layer) results of scoring.

    Attributes:
        imbalance_TL: [T, L] max / mean GPU load.
        lower_bound_TL: [T, L] >= 1, a bound no placement beats on that step and layer under any routing
            (`placement.bounds.imbalance_lower_bound`: the mean and the replica-count bound; in whole tokens for
            live routing).
        routing: "static", "dynamic" or "live".
        dynamic_gap_TL: [T, L] certified relative gap to the optimal split (zeros for static routing).
        loads_TLG: [T, L, G] float32 tokens each card processed (what the named metrics read).
        gpus_per_node: cards per node of the placement's cluster (the `node_step` metric).
    """

    imbalance_TL: np.ndarray
    lower_bound_TL: np.ndarray
    routing: str
    dynamic_gap_TL: np.ndarray
    loads_TLG: np.ndarray
    gpus_per_node: int

    def summary(self) -> dict:
        """Mean, p99 and worst imbalance over (step, layer), with the lower bound beside them, the named metrics
        (`placement.imbalance_metrics`) and the noise floor at these steps' load."""
        result = summarize(self.imbalance_TL, self.lower_bound_TL, self.routing, self.dynamic_gap_TL)
        metrics = named_metrics(self.loads_TLG, self.gpus_per_node)
        return {**result, "noise_floor": metrics["card_step"]["noise_floor"], "metrics": metrics}

    def take_steps(self, count: int) -> "StepScores":
        """The first `count` steps."""
        return StepScores(self.imbalance_TL[:count], self.lower_bound_TL[:count], self.routing,
                          self.dynamic_gap_TL[:count], self.loads_TLG[:count], self.gpus_per_node)

    @staticmethod
    def concatenate(parts: list["StepScores"]) -> "StepScores":
        """Stack the steps of several results (same routing, layers and cluster)."""
        return StepScores(
            np.concatenate([p.imbalance_TL for p in parts]),
            np.concatenate([p.lower_bound_TL for p in parts]),
            parts[0].routing,
            np.concatenate([p.dynamic_gap_TL for p in parts]),
            np.concatenate([p.loads_TLG for p in parts]),
            parts[0].gpus_per_node,
        )


def summarize(imbalance_TL: np.ndarray, lower_bound_TL: np.ndarray, routing: str, gap_TL: np.ndarray) -> dict:
    """The summary dict of the JSON output (keys are a contract: imbalance_mean/p99/max, lower_bound)."""
    return {
        "routing": routing,
        "steps": int(imbalance_TL.shape[0]),
        "layers": int(imbalance_TL.shape[1]),
        "imbalance_mean": float(imbalance_TL.mean()),
        "imbalance_p99": float(np.quantile(imbalance_TL, 0.99)),
        "imbalance_max": float(imbalance_TL.max()),
        "lower_bound": float(lower_bound_TL.mean()),
        "lower_bound_p99": float(np.quantile(lower_bound_TL, 0.99)),
        "dynamic_gap_max": float(gap_TL.max()),
        "worst_layer": int(imbalance_TL.mean(axis=0).argmax()),
    }


def check_compatible(placement: Placement, counts_TLE: np.ndarray) -> None:
    """Raise `PlacementFormatError` unless the placement is for the trace's layers and experts."""
    _, num_layers, num_experts = counts_TLE.shape
    if (placement.num_layers, placement.num_experts) != (num_layers, num_experts):
        raise PlacementFormatError(
            f"the placement is for {placement.num_layers} layers x {placement.num_experts} experts but the trace "
            f"has {num_layers} layers x {num_experts} experts; place again on a trace of this model"
        )


def slot_weights_LEG(placement: Placement) -> np.ndarray:
    """[L, E, G] float: share of expert e's tokens that GPU g takes under static routing."""
    num_layers = placement.num_layers
    share = np.zeros((num_layers, placement.num_experts, placement.cluster.num_gpus))
    layer = np.repeat(np.arange(num_layers), placement.cluster.num_slots)
    gpu = np.tile(placement.gpu_of_slot_P, num_layers)
    np.add.at(share, (layer, placement.phy2log_LP.ravel(), gpu), placement.weights_LP.ravel())
    return share


def static_gpu_loads(counts_TLE: np.ndarray, placement: Placement) -> np.ndarray:
    """[T, L, G] float: tokens each GPU processes under static routing."""
    share_LEG = slot_weights_LEG(placement)
    return np.einsum("tle,leg->tlg", counts_TLE.astype(np.float64), share_LEG, optimize=True)


def dynamic_gpu_loads(counts_TLE: np.ndarray, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """[T, L, G] GPU loads under the optimal per-step split, and [T, L] the certified gap of each."""
    steps, num_layers, num_experts = counts_TLE.shape
    num_gpus = placement.cluster.num_gpus
    loads = np.empty((steps, num_layers, num_gpus))
    gaps = np.empty((steps, num_layers))
    for layer in range(num_layers):
        graph = ReplicaGraph.build(placement.phy2log_LP[layer], placement.gpu_of_slot_P, num_experts, num_gpus,
                                   placement.weights_LP[layer])
        loads[:, layer], gaps[:, layer] = optimal_split_loads(counts_TLE[:, layer], graph, DYNAMIC_TOLERANCE)
    return loads, gaps


def live_gpu_loads(counts_TLE: np.ndarray, placement: Placement) -> np.ndarray:
    """[T, L, G] GPU loads when the live router splits every step (one call per step and layer, as serving does)."""
    import torch  # the live router is torch code; imported here so static and dynamic scoring do not need it

    from placement.routing.live_router import LayerRoutingTable, route_step

    steps, num_layers, num_experts = counts_TLE.shape
    cluster = placement.cluster
    loads = np.empty((steps, num_layers, cluster.num_gpus))
    counts = torch.as_tensor(counts_TLE)
    for layer in range(num_layers):
        table = LayerRoutingTable.build(placement.phy2log_LP[layer], cluster.slots_per_gpu, num_experts,
                                        weights_P=placement.weights_LP[layer])
        for step in range(steps):
            tokens_P = route_step(counts[step, layer], table)
            loads[step, layer] = tokens_P.view(cluster.num_gpus, -1).sum(1).numpy()
    return loads


def score_placement(
    placement: Placement,
    counts_TLE: np.ndarray,
    routing: Routing = "static",
    chunk_steps: int = 256,
    on_chunk: Callable[[int, int], None] | None = None,
) -> StepScores:
    """Score `placement` on every step and layer of `counts_TLE` [T, L, E].

    `on_chunk(done, total)` is called after each chunk of `chunk_steps` steps (for progress bars).
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}; got {routing!r}")
    counts_TLE = validate_counts(counts_TLE, "counts_TLE", whole=False)
    check_compatible(placement, counts_TLE)
    chunks = list(_chunks(counts_TLE, chunk_steps))
    parts = []
    for done, chunk in enumerate(chunks, 1):
        parts.append(_score_chunk(placement, chunk, routing))
        if on_chunk is not None:
            on_chunk(done, len(chunks))
    return StepScores.concatenate(parts)


def _score_chunk(placement: Placement, counts_TLE: np.ndarray, routing: str) -> StepScores:
    steps, num_layers, num_experts = counts_TLE.shape
    gaps = np.zeros((steps, num_layers))
    if routing == "static":
        loads = static_gpu_loads(counts_TLE, placement)
    elif routing == "live":
        loads = live_gpu_loads(counts_TLE, placement)
    else:
        loads, gaps = dynamic_gpu_loads(counts_TLE, placement)
    cluster = placement.cluster
    bound = imbalance_lower_bound(counts_TLE.reshape(-1, num_experts), cluster.num_slots, cluster.num_gpus,
                                  whole_tokens=routing == "live").reshape(steps, num_layers)
    return StepScores(max_over_mean(loads), bound, routing, gaps, loads.astype(np.float32), cluster.gpus_per_node)


def _chunks(counts_TLE: np.ndarray, chunk_steps: int) -> Iterator[np.ndarray]:
    for start in range(0, counts_TLE.shape[0], chunk_steps):
        yield counts_TLE[start : start + chunk_steps]
