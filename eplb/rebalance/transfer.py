"""This rank's side of moving expert weights during decode: where each fill's weights come from and land, the
rounds it posts between two decode steps, and the copy of staged experts into the slots at a switch.

Legend: S slots on this rank, D hidden size, F expert inner size.

`move_plan` plans the fills and rounds (the same on every rank) and `weight_moves` posts one round. A fill reads a
serving slot (on the device) or a host copy, and writes a staging buffer (a slot's on the device, a host copy's in
host memory): nothing serving changes before the switch, so a step runs wholly on the old or the new placement.
"""

from collections.abc import Callable

import torch

from collectives import Communicator
from eplb.live.experts import ExpertWeights
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.rebalance.move_plan import Chunk, Fill, TransferShape, schedule_chunks
from eplb.rebalance.stats import RebalanceStats
from eplb.rebalance.weight_moves import PendingRound, matrix_of, start_round

Staging = dict[tuple[str, int, int], ExpertWeights]  # (kind, layer, index) -> one expert's weights
ROUND_TAGS = 10_000  # message tags one round may use


def tag_base(attempt: int, round_index: int) -> int:
    """Message tags of one round of one attempt, apart from every other round's (tags are 32-bit)."""
    return (attempt % 200) * 10_000_000 + (round_index % 1000) * ROUND_TAGS


def stacks(weights: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three matrices of an expert stack: gate [A, D, F], up [A, D, F], down [A, F, D]."""
    return weights.gate_ADF, weights.up_ADF, weights.down_AFD


class WeightMover:
    """Posts and completes this rank's weight transfers, and fills the slots from staging at a switch.

    Args:
        comm: the group's communicator (ranks of fills are its ranks).
        layers: this rank's MoE layers; a fill from a slot reads `layers[fill.layer].slot_experts`.
        host_copy: (layer, expert) -> this rank's host copy of that expert, for fills from a host copy.
    """

    def __init__(self, comm: Communicator, layers: list[MoEDecodeLayer],
                 host_copy: Callable[[int, int], ExpertWeights]) -> None:
        self.comm, self.layers, self.host_copy = comm, layers, host_copy

    @property
    def element_size(self) -> int:
        """Bytes per element of the expert weights."""
        return self.layers[0].slot_experts.gate_ADF.element_size()

    def transfer_shape(self, max_bytes_per_round: int, failures_tolerated: int) -> TransferShape:
        """What planning a move of these layers' weights needs (`move_plan.TransferShape`)."""
        config = self.layers[0].config
        return TransferShape(config.hidden_size, config.intermediate_size, self.element_size, max_bytes_per_round,
                             failures_tolerated)

    def empty(self, layer: int, count: int, device: torch.device | str) -> ExpertWeights:
        """Uninitialised weights of `count` experts shaped as `layer`'s, on `device`."""
        weights = self.layers[layer].slot_experts
        _, hidden, inner = weights.gate_ADF.shape
        return ExpertWeights.empty(count, hidden, inner, weights.gate_ADF.dtype, device)

    def staging_for(self, fills: list[Fill]) -> Staging:
        """Empty buffers for the fills this rank receives: slots on the device, host copies in host memory."""
        return {(fill.dst_kind, fill.layer, fill.dst_index):
                self.empty(fill.layer, 1, self.comm.device if fill.dst_kind == "slot" else "cpu")
                for fill in fills if fill.dst_rank == self.comm.rank}

    def post(self, chunks: list[Chunk], fills: list[Fill] | dict[int, Fill], staging: Staging,
             tag_base: int) -> PendingRound:
        """Post one round (`weight_moves.start_round`): it moves while the next decode step runs."""
        def staged(fill: Fill, matrix: int) -> torch.Tensor:
            return matrix_of(staging[(fill.dst_kind, fill.layer, fill.dst_index)], matrix, 0)

        return start_round(self.comm, chunks, fills, self._source, staged, tag_base=tag_base)

    def run_all(self, fills: list[Fill], staging: Staging, budget: int, tag_base: int, stats: RebalanceStats) -> None:
        """Move `fills` whole, round after round of at most `budget` bytes a rank (collective, at start and in a
        recovery, when no decode step runs), adding each round's bytes received to `stats.bytes_received`."""
        config = self.layers[0].config
        rounds = schedule_chunks(fills, config.hidden_size, config.intermediate_size, self.element_size, budget)
        for index, chunks in enumerate(rounds):
            stats.bytes_received += self.post(chunks, fills, staging, tag_base + index * ROUND_TAGS).finish()

    def grown(self, layer: int, weights: ExpertWeights, slots: int) -> ExpertWeights:
        """`weights` [S, ...] copied into a new stack of `slots` >= S slots on the device (the rest uninitialised)."""
        grown = self.empty(layer, slots, self.comm.device)
        for old_stack, new_stack in zip(stacks(weights), stacks(grown)):
            new_stack[: old_stack.shape[0]].copy_(old_stack)
        return grown

    @staticmethod
    def copy_staged_slots(layer: int, weights: ExpertWeights, staging: Staging) -> None:
        """Copy the staged experts of `layer` into their slots of `weights` (between two steps)."""
        for (kind, staged_layer, slot), staged in staging.items():
            if kind == "slot" and staged_layer == layer:
                for matrix, stack in enumerate(stacks(weights)):
                    stack[slot].copy_(matrix_of(staged, matrix, 0))

    def _source(self, fill: Fill, matrix: int) -> torch.Tensor:
        """Matrix `matrix` of the fill's weights where this rank holds them: a serving slot or a host copy."""
        if fill.src_kind == "slot":
            return matrix_of(self.layers[fill.layer].slot_experts, matrix, fill.src_index)
        return matrix_of(self.host_copy(fill.layer, fill.src_index), matrix, 0)
