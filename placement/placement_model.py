"""The placement: which logical expert each slot holds, and each replica's share of its expert's tokens.

Legend: L layers, E logical experts, G GPUs, S slots per GPU, P = G * S slots, X = most replicas of one expert.

Example: 256 experts on 64 GPUs x 5 slots = 320 slots, so 64 slots hold redundant replicas; an expert with 3
replicas has 3 entries in `log2phy_LEX[l, e]` and `logcnt_LE[l, e] == 3`.
"""

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError

WEIGHT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Placement:
    """A placement of E logical experts into the P slots of a cluster, per layer.

    Attributes:
        phy2log_LP: [L, P] int64, the logical expert held by slot p; slot p lives on GPU p // S.
        weights_LP: [L, P] float64, the share of its expert's tokens slot p takes under static routing;
            per layer and expert the shares sum to 1.
        cluster: the cluster the placement is for.
        num_experts: E.
        policy: name of the policy that produced it.
        info: free-form facts about how it was made (solver status, objective, fit window ...).
    """

    phy2log_LP: np.ndarray
    weights_LP: np.ndarray
    cluster: ClusterSpec
    num_experts: int
    policy: str = ""
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def equal_split(
        cls, phy2log_LP: np.ndarray, cluster: ClusterSpec, num_experts: int, policy: str = "", info: dict | None = None
    ) -> "Placement":
        """A placement whose replicas share their expert's tokens equally (weight 1 / replica count)."""
        phy2log = np.asarray(phy2log_LP, dtype=np.int64)
        logcnt = _replica_counts(phy2log, num_experts)
        weights = 1.0 / np.take_along_axis(logcnt, phy2log, axis=1)
        return cls(phy2log, weights, cluster, num_experts, policy, dict(info or {}))

    @property
    def num_layers(self) -> int:
        return self.phy2log_LP.shape[0]

    @cached_property
    def logcnt_LE(self) -> np.ndarray:
        """[L, E] int64: replicas of each logical expert."""
        return _replica_counts(self.phy2log_LP, self.num_experts)

    @cached_property
    def log2phy_LEX(self) -> np.ndarray:
        """[L, E, X] int64: the slots holding each logical expert, in ascending slot order, padded with -1."""
        num_layers, num_slots = self.phy2log_LP.shape
        max_replicas = int(self.logcnt_LE.max())
        order_LP = np.argsort(self.phy2log_LP, axis=1, kind="stable")
        sorted_experts = np.take_along_axis(self.phy2log_LP, order_LP, axis=1)
        first_LE = np.cumsum(self.logcnt_LE, axis=1) - self.logcnt_LE
        rank_LP = np.arange(num_slots)[None, :] - np.take_along_axis(first_LE, sorted_experts, axis=1)
        log2phy = np.full((num_layers, self.num_experts, max_replicas), -1, dtype=np.int64)
        layer = np.repeat(np.arange(num_layers), num_slots)
        log2phy[layer, sorted_experts.ravel(), rank_LP.ravel()] = order_LP.ravel()
        return log2phy

    @cached_property
    def gpu_of_slot_P(self) -> np.ndarray:
        """[P] int64: the GPU each slot lives on."""
        return np.arange(self.cluster.num_slots) // self.cluster.slots_per_gpu

    def with_layers_of(self, source: "Placement", layers) -> "Placement":
        """This placement with `layers` (indices) taken, slots and weights, from `source` (same shape): a refit's
        layers adopted by a patch."""
        phy2log_LP, weights_LP = self.phy2log_LP.copy(), self.weights_LP.copy()
        phy2log_LP[layers], weights_LP[layers] = source.phy2log_LP[layers], source.weights_LP[layers]
        return Placement(phy2log_LP, weights_LP, self.cluster, self.num_experts, self.policy, dict(self.info))

    def is_equal_split(self) -> bool:
        """True when every replica takes 1 / (its expert's replica count) of the tokens."""
        expected = 1.0 / np.take_along_axis(self.logcnt_LE, self.phy2log_LP, axis=1)
        return bool(np.allclose(self.weights_LP, expected, atol=WEIGHT_TOLERANCE))

    def validate(self) -> None:
        """Raise `PlacementFormatError` unless shapes, expert ids and weights are consistent."""
        phy2log, weights = self.phy2log_LP, self.weights_LP
        num_slots = self.cluster.num_slots
        if phy2log.ndim != 2 or phy2log.shape[1] != num_slots:
            raise PlacementFormatError(
                f"phy2log must have shape [layers, {num_slots}] for {self.cluster.num_gpus} GPUs x "
                f"{self.cluster.slots_per_gpu} slots; found {tuple(phy2log.shape)}"
            )
        if weights.shape != phy2log.shape:
            raise PlacementFormatError(
                f"replica weights have shape {tuple(weights.shape)} but phy2log has {tuple(phy2log.shape)}"
            )
        if phy2log.min() < 0 or phy2log.max() >= self.num_experts:
            raise PlacementFormatError(
                f"phy2log holds expert ids in [{phy2log.min()}, {phy2log.max()}]; expected [0, {self.num_experts})"
            )
        missing = np.argwhere(self.logcnt_LE == 0)
        if len(missing):
            layer, expert = missing[0]
            raise PlacementFormatError(
                f"expert {expert} of layer {layer} has no replica ({len(missing)} (layer, expert) pairs lack one)"
            )
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise PlacementFormatError("replica weights must be finite and >= 0")
        sums = np.zeros((self.num_layers, self.num_experts))
        np.add.at(sums, (np.arange(self.num_layers)[:, None], phy2log), weights)
        worst = np.abs(sums - 1.0).max()
        if worst > WEIGHT_TOLERANCE:
            raise PlacementFormatError(
                f"replica weights of each expert must sum to 1 per layer; worst sum is off by {worst:.3g}"
            )


def _replica_counts(phy2log_LP: np.ndarray, num_experts: int) -> np.ndarray:
    num_layers = phy2log_LP.shape[0]
    flat = (np.arange(num_layers)[:, None] * num_experts + phy2log_LP).ravel()
    return np.bincount(flat, minlength=num_layers * num_experts).reshape(num_layers, num_experts)
