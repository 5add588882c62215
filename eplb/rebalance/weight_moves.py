"""Moving expert weights inside a running EP group, by the rounds `move_plan` schedules.

`start_round` posts one round on this rank (local copies at once, then one exchange of its sends and receives),
which then moves while a decode step runs, and `PendingRound.finish` completes it (a round run whole is
`start_round(...).finish()`). Every rank moves by the same fills and rounds, so the k-th send of one rank to a peer
meets that peer's k-th receive from it.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from collectives import Communicator, PendingExchange
from eplb.rebalance.move_plan import Chunk, Fill


@dataclass
class PendingRound:
    """A round in flight: its transfers, and the received buffers still to copy where they belong."""

    exchange: PendingExchange | None
    after: list[tuple[torch.Tensor, torch.Tensor]]
    received: int

    def finish(self, timeout_s: float | None = None) -> int:
        """Wait for the transfers, copy what arrived through the device into host copies; the bytes received."""
        if self.exchange is not None:
            self.exchange.wait(timeout_s)
        for target, buffer in self.after:
            if buffer is not target:
                target.copy_(buffer)
        return self.received


def start_round(
    comm: Communicator,
    chunks: list[Chunk],
    fills: list[Fill] | dict[int, Fill],
    source: Callable[[Fill, int], torch.Tensor],
    destination: Callable[[Fill, int], torch.Tensor],
    *,
    tag_base: int = 0,
) -> PendingRound:
    """Start one round on this rank: local copies at once, then one posted exchange of its sends and receives,
    which the caller may overlap with a decode step before `finish`. `source(fill, m)` and `destination(fill, m)`
    give matrix m of the fill's weights where this rank holds / receives them (on any device: host copies travel
    through the communicator's device). Sources are serving slots or host copies (nothing writes them meanwhile),
    destinations staging buffers (nothing reads them before the switch)."""
    me = comm.rank
    sends, recvs, after = [], [], []
    received = 0
    for chunk in chunks:
        fill = fills[chunk.fill]
        rows = slice(chunk.row_start, chunk.row_end)
        if fill.src_rank == me and fill.dst_rank == me:
            destination(fill, chunk.matrix)[rows].copy_(source(fill, chunk.matrix)[rows])
        elif fill.src_rank == me:
            sends.append((fill.dst_rank, source(fill, chunk.matrix)[rows].to(comm.device)))
        elif fill.dst_rank == me:
            target = destination(fill, chunk.matrix)[rows]
            buffer = target if target.device == comm.device else torch.empty_like(target, device=comm.device)
            recvs.append((fill.src_rank, buffer))
            after.append((target, buffer))
            received += chunk.nbytes
    exchange = comm.start_exchange(sends, recvs, tag_base=tag_base) if sends or recvs else None
    return PendingRound(exchange, after, received)


def matrix_of(weights, matrix: int, index: int) -> torch.Tensor:
    """Matrix `matrix` of entry `index` of an `ExpertWeights` stack."""
    stack = (weights.gate_ADF, weights.up_ADF, weights.down_AFD)[matrix]
    return stack[index]
