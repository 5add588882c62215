"""Carrying out planned weight moves on a real Gloo group: every round's chunks land in the rows of the staging
buffers the plan names, local fills included, over any number of rounds, each run whole or posted before a
collective and completed after it (as the rebalancer runs them around a decode step)."""

import torch

from collectives import run_local_group
from eplb.live.experts import ExpertWeights
from eplb.rebalance.move_plan import Fill, schedule_chunks
from eplb.rebalance.weight_moves import matrix_of, start_round

HIDDEN, INNER = 6, 10


def expert_weights(expert: int) -> ExpertWeights:
    """Weights whose every entry tells the expert, the matrix and the position apart."""
    def matrix(index, rows, cols):
        return expert * 1000 + index * 100 + torch.arange(rows * cols, dtype=torch.float32).view(1, rows, cols) / 100
    return ExpertWeights(matrix(0, HIDDEN, INNER), matrix(1, HIDDEN, INNER), matrix(2, INNER, HIDDEN))


def the_fills(world: int) -> list[Fill]:
    """Expert e is held by rank e % world; each rank receives several experts from every other rank and one copy
    from itself (layer 0, slot kinds; index = the expert)."""
    fills = []
    for dst in range(world):
        for expert in range(3 * world):
            if expert % world != dst or expert == dst:
                fills.append(Fill(0, expert, dst, "slot", expert, expert % world, "slot", expert))
    return fills


def move_everything(comm, budget: int, overlap: bool):
    fills = the_fills(comm.world_size)
    rounds = schedule_chunks(fills, HIDDEN, INNER, 4, budget)
    held = {e: expert_weights(e) for e in range(3 * comm.world_size) if e % comm.world_size == comm.rank}
    staging = {f.dst_index: ExpertWeights.empty(1, HIDDEN, INNER) for f in fills if f.dst_rank == comm.rank}
    source = lambda fill, m: matrix_of(held[fill.src_index], m, 0)  # noqa: E731
    destination = lambda fill, m: matrix_of(staging[fill.dst_index], m, 0)  # noqa: E731
    received, pending = 0, None
    for index, chunks in enumerate(rounds):
        if overlap:  # as the rebalancer runs them: complete the last round, post this one, then a decode step
            if pending is not None:
                received += pending.finish(10.0)
            pending = start_round(comm, chunks, fills, source, destination, tag_base=index * 10_000)
            assert comm.all_reduce_sum(torch.ones(1)).item() == comm.world_size
        else:
            received += start_round(comm, chunks, fills, source, destination, tag_base=index * 10_000).finish(10.0)
    if pending is not None:
        received += pending.finish(10.0)
    comm.barrier()
    landed = all(torch.equal(matrix_of(staging[e], m, 0), matrix_of(expert_weights(e), m, 0))
                 for e in staging for m in range(3))
    return landed, received, len(rounds)


def test_rounds_land_every_chunk_where_the_plan_says():
    world = 3
    expert_bytes = 3 * HIDDEN * INNER * 4
    for budget, overlap in ((expert_bytes // 3, False), (expert_bytes // 3, True), (4 * expert_bytes, True)):
        results = run_local_group(move_everything, world, budget, overlap, timeout_s=20, deadline_s=120)
        wire = [sum(1 for f in the_fills(world) if f.dst_rank == rank and f.src_rank != rank) * expert_bytes
                for rank in range(world)]
        assert [landed for landed, _, _ in results] == [True] * world
        assert [received for _, received, _ in results] == wire
        assert results[0][2] > (1 if budget < expert_bytes else 0)  # a small budget cuts the moves into many rounds
