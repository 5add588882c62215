"""The state of one rebalance attempt on one rank, from its start to its switch or its end.

Legend: L layers.

An attempt (a refit, a loaded placement, or a burst patch) starts solving (`fit_step`, `fit_time`), then, once rank
0's answer is broadcast, carries the target placement, this rank's part of the weight moves and their staging
buffers, and the routing tables and host copies of the layers it changes, prepared a few layers a step, so that the
switch only installs them (a layer the target leaves as it is keeps its tables and host copies). A refit's hundreds
of rounds leave time to prepare one layer a step; a patch's few rounds would leave its switch waiting on one layer a
step, so an attempt prepares as many layers a step as finish with its last round, at most `MAX_LAYERS_PER_STEP`
(each takes a few milliseconds of the worker's thread before a decode step).
"""

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from collectives import CollectiveError
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.live.replica_assignment import ReplicaTables
from eplb.rebalance.host_copies import HostCopies
from eplb.rebalance.move_plan import Chunk, Fill
from eplb.rebalance.stats import RebalanceStats
from eplb.rebalance.transfer import Staging, WeightMover
from eplb.rebalance.weight_moves import PendingRound
from placement import Placement
from placement.patch_planner import Followed

logger = logging.getLogger(__name__)

MAX_LAYERS_PER_STEP = 6  # the most layers' tables and host-copy lists one step prepares


@dataclass
class Attempt:
    """One attempt's state on this rank (the rebalancer holds None between attempts).

    Attributes:
        fit_step: the step the attempt started at (the end of its fit window).
        patch: a patch (drift swaps and burst moves, `placement.burst_patch`), which a due refit may replace while
            it solves.
        queued: a patch whose job started while the patch before it moved (`PatchClock`): its answer may have
            waited for that patch's switch.
        followed: what the next patches start from once this attempt switches (rank 0 only; None otherwise): a
            refit's placement as relabelled, or a patch's start with its drift swaps, with their rings' GPU orders.
        fit_time: `time.perf_counter()` at the start, for the lag to the switch.
        broadcast_step: the step rank 0's answer was broadcast at (None while solving).
        fitted_imbalance: the target's fitted level on the window (None: a loaded placement), for the drift check.
        moves: (experts moved, experts a slot-by-slot remap would move); known on rank 0 only.
        target: the placement to switch to (None while solving).
        fills: this rank's fills (it sends or receives them), by their index in the plan.
        rounds: every round of the plan with this rank's chunks only (the same count of rounds on every rank).
        next_round: the index of the next round to post.
        staging: the buffers this rank's received fills land in until the switch.
        changed_L: the layers whose slots or static weights the target changes (their tables are rebuilt), in the
            order their weights land (`last_round_L`), which is the order they are prepared in.
        last_round_L: changed layer -> the last round with a chunk of its fills (-1: none); a patch's layer may
            switch once every rank completed that round (`layers_landed`).
        switched_L: a patch's layers switched before the attempt's last switch.
        layers_per_step: the changed layers prepared per step (the same on every rank: rounds are).
        tables_L: layer -> the target's routing tables on this rank's device, built a few layers a step.
        host_copies_L: layer -> the experts this rank keeps host copies of under the target.
        transfers_ok: False once a transfer of this attempt failed on this rank (sent to every rank).
        in_flight: the round posted before the last decode step, completed at the next step.
        reported_all: every round moved and the tables are built; this rank's last message said so.
    """

    fit_step: int
    patch: bool = False
    queued: bool = False
    followed: Followed | None = None
    fit_time: float = field(default_factory=time.perf_counter)
    broadcast_step: int | None = None
    fitted_imbalance: float | None = None
    moves: tuple[int, int] | None = None
    target: Placement | None = None
    changed_L: list[int] = field(default_factory=list)
    last_round_L: dict[int, int] = field(default_factory=dict)
    switched_L: set[int] = field(default_factory=set)
    layers_per_step: int = 1
    fills: dict[int, Fill] = field(default_factory=dict)
    rounds: list[list[Chunk]] = field(default_factory=list)
    next_round: int = 0
    staging: Staging = field(default_factory=dict)
    tables_L: dict[int, ReplicaTables] = field(default_factory=dict)
    host_copies_L: dict[int, list[int]] = field(default_factory=dict)
    transfers_ok: bool = True
    in_flight: PendingRound | None = None
    reported_all: bool = False

    def start_moving(self, current: Placement, target: Placement, fitted_imbalance: float | None,
                     fills: dict[int, Fill], rounds: list[list[Chunk]], staging: Staging,
                     moves: tuple[int, int] | None, last_round_L: dict[int, int]) -> None:
        """Take this rank's part of rank 0's answer (`target` to replace `current`; `last_round_L`: each layer's
        last round in the whole plan, `last_rounds`): the attempt is moving from here."""
        self.fills, self.rounds, self.staging, self.moves = fills, rounds, staging, moves
        self.fitted_imbalance, self.target = fitted_imbalance, target
        changed = changed_layers(current, target)
        self.last_round_L = {layer: last_round_L.get(layer, -1) for layer in changed}
        self.changed_L = sorted(changed, key=self.last_round_L.__getitem__)  # stable: in layer order within a round
        self.layers_per_step = layers_per_step(len(self.changed_L), len(rounds))

    def layers_landed(self, rounds_done: int) -> list[int]:
        """The changed layers not switched yet whose tables are built and whose fills all lie in the first
        `rounds_done` rounds."""
        return [layer for layer in self.changed_L if layer not in self.switched_L and layer in self.tables_L
                and self.last_round_L[layer] < rounds_done]

    def install(self, indices: list[int], layers: list[MoEDecodeLayer], mover: WeightMover,
                host_copies: HostCopies) -> None:
        """Install the target on `layers[i]` for each i in `indices` (between two steps, every rank at the same
        step): the staged experts into their slots, the prepared tables and host copies; a layer the target leaves
        as it is keeps its tables and host copies."""
        for index in indices:
            layer = layers[index]
            mover.copy_staged_slots(index, layer.slot_experts, self.staging)
            if index in self.tables_L:
                layer.install(self.target, self.tables_L[index])
                host_copies.keep(index, self.host_copies_L[index], self.staging)
            else:
                layer.install(self.target, layer.tables)

    @property
    def moving_steps(self) -> int:
        """Steps from the broadcast to the one that completes every round and table (`moving_steps`)."""
        return moving_steps(len(self.changed_L), len(self.rounds))

    @property
    def rounds_left(self) -> bool:
        """True while a round of this attempt is still to post."""
        return self.next_round < len(self.rounds)

    def _next_layer_to_prepare(self) -> int | None:
        """The first changed layer whose routing tables are not built yet (None: all are)."""
        return next((layer for layer in self.changed_L if layer not in self.tables_L), None)

    def prepare_layers(self, device: torch.device, host_copies: HostCopies) -> None:
        """Build `layers_per_step` more changed layers' routing tables and host-copy lists for the target (so that
        the switch only installs them)."""
        for _ in range(self.layers_per_step):
            layer = self._next_layer_to_prepare()
            if layer is None:
                return
            self.tables_L[layer] = ReplicaTables.build(self.target, layer, device)
            self.host_copies_L[layer] = host_copies.wanted(self.target, layer)

    def advance(self, mover: WeightMover, timeout_s: float, tag_base: int, stats: RebalanceStats) -> None:
        """Complete the round in flight (a failure clears `transfers_ok`), post the next one (message tags from
        `tag_base`), and set `reported_all` when every round moved and every layer is prepared."""
        if self.in_flight is not None:
            in_flight, self.in_flight = self.in_flight, None
            try:
                stats.bytes_received += in_flight.finish(timeout_s)
            except CollectiveError as exc:
                self.transfers_ok = False
                logger.warning("weight transfer failed on this rank: %s", exc)
        if self.rounds_left:
            self.in_flight = mover.post(self.rounds[self.next_round], self.fills, self.staging, tag_base)
            self.next_round += 1
        self.reported_all = (self.in_flight is None and not self.rounds_left
                             and self._next_layer_to_prepare() is None)


def last_rounds(fills_U8: np.ndarray, chunks_C6: np.ndarray) -> dict[int, int]:
    """Layer -> the last round holding a chunk of one of its fills, over a whole encoded plan (`move_plan`'s
    [U, 8] fills and [C, 6] chunks): the same on every rank."""
    if not len(chunks_C6):
        return {}
    layers_C, rounds_C = fills_U8[chunks_C6[:, 1], 0], chunks_C6[:, 0]
    last = np.full(int(layers_C.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(last, layers_C, rounds_C)
    return {int(layer): int(last[layer]) for layer in np.flatnonzero(last >= 0)}


def changed_layers(current: Placement, target: Placement) -> list[int]:
    """The layers whose slot map or static weights differ between `current` and `target` (what a switch must build
    new routing tables for)."""
    return [layer for layer in range(target.num_layers)
            if not (np.array_equal(target.phy2log_LP[layer], current.phy2log_LP[layer])
                    and np.array_equal(target.weights_LP[layer], current.weights_LP[layer]))]


def moving_steps(changed: int, rounds: int) -> int:
    """Steps from the answer's broadcast to the one that completes the last of `rounds` rounds and builds the last
    of `changed` layers' tables (the broadcast's step posts the first round and prepares the first layers; the
    switch comes the step after): the rounds, or the tables where they take longer."""
    return max(rounds, -(-changed // layers_per_step(changed, rounds)) - 1)


def layer_switch_steps(last_round: int, position: int, per_step: int) -> int:
    """Steps from the answer's broadcast to the switch of a patch's layer whose last chunk is in round `last_round`
    (-1: none) and which is prepared `position`-th (0: first), `per_step` layers a step: every rank completes that
    round `last_round + 1` steps after the broadcast and says so with that step, and the layer's tables are built
    with step `position // per_step`; it switches the step after both (`Attempt.layers_landed`)."""
    return max(last_round + 2, position // per_step + 1)


def layers_per_step(changed: int, rounds: int) -> int:
    """Layers to prepare per step so that `changed` layers are ready with the last of `rounds` rounds, within 1 and
    `MAX_LAYERS_PER_STEP`."""
    return min(MAX_LAYERS_PER_STEP, max(1, -(-changed // max(1, rounds))))
