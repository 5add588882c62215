"""The communicator on real processes over Gloo: results equal the single-process arithmetic, and a peer that
raises, dies or hangs makes every surviving rank fail within the timeout instead of hanging."""

import os
import time

import pytest
import torch

from collectives import CollectiveError, backend_for, run_local_group
from collectives.errors import RankDiedError
from collectives.errors import BackendUnavailableError


def gather_and_reduce(comm):
    counts = torch.arange(4, dtype=torch.int64) * (comm.rank + 1)
    return comm.all_gather(counts), comm.all_reduce_sum(counts), comm.agree(comm.rank != 1), comm.agree(True)


@pytest.mark.parametrize("world_size", [2, 3], ids=["2-ranks", "3-ranks"])
def test_all_gather_all_reduce_and_agree_match_the_arithmetic(world_size):
    results = run_local_group(gather_and_reduce, world_size)
    expected = torch.stack([torch.arange(4) * (r + 1) for r in range(world_size)])
    for gathered, summed, some_false, all_true in results:
        assert torch.equal(gathered, expected)
        assert torch.equal(summed, expected.sum(0))
        assert some_false is False and all_true is True


def leave_at_once(comm):
    return comm.rank


def test_ranks_that_end_right_after_joining_never_break_a_peer_s_join():
    # Gloo's mesh connect can return on one rank before a peer has finished their pair, and a rank that ended then
    # closed the pair under it ("Connection closed by peer"): about one such group in five failed before every
    # rank's join waited for the others' (`wait_until_all_joined`).
    for _ in range(12):
        assert run_local_group(leave_at_once, 4, timeout_s=10) == [0, 1, 2, 3]


def variable_all_to_all(comm):
    # Rank r sends (r + j) % 3 rows to rank j; row values encode (sender, receiver, index) so any mix-up shows.
    world = comm.world_size
    send_counts = [(comm.rank + j) % 3 for j in range(world)]
    rows = torch.cat([torch.tensor([[comm.rank * 100 + j * 10 + i, -1.0] for i in range(n)]).reshape(n, 2)
                      for j, n in enumerate(send_counts)])
    recv_counts = comm.all_gather(torch.tensor(send_counts))[:, comm.rank].tolist()
    return comm.all_to_all(rows, send_counts, recv_counts)


def test_all_to_all_with_uneven_and_empty_splits_delivers_every_row_in_rank_order():
    world = 3
    for rank, received in enumerate(run_local_group(variable_all_to_all, world)):
        expected = [[src * 100 + rank * 10 + i, -1.0] for src in range(world) for i in range((src + rank) % 3)]
        assert received.tolist() == expected


def chunked_exchange(comm, numel, max_chunk_bytes):
    # A ring: each rank sends two tensors to the next and receives two from the previous, in small chunks.
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    first = torch.arange(numel, dtype=torch.float32) + 1000 * comm.rank
    second = torch.arange(7, dtype=torch.int64) - comm.rank
    into_first, into_second = torch.empty(numel, dtype=torch.float32), torch.empty(7, dtype=torch.int64)
    comm.exchange([(right, first), (right, second)], [(left, into_first), (left, into_second)], max_chunk_bytes)
    return into_first, into_second


def test_exchange_moves_tensors_in_bounded_chunks_between_peers():
    world, numel = 3, 1001
    for rank, (first, second) in enumerate(run_local_group(chunked_exchange, world, numel, 64)):
        left = (rank - 1) % world
        assert torch.equal(first, torch.arange(numel, dtype=torch.float32) + 1000 * left)
        assert torch.equal(second, torch.arange(7) - left)


def exchange_overlapping_collectives(comm, numel):
    # Post a ring exchange, run collectives (as a decode step would) while it is in flight, then wait for it.
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    sent = torch.arange(numel, dtype=torch.float32) + 1000 * comm.rank
    into = torch.empty(numel, dtype=torch.float32)
    pending = comm.start_exchange([(right, sent)], [(left, into)], tag_base=7)
    gathered = comm.all_gather(torch.tensor([comm.rank]))
    total = comm.all_reduce_sum(torch.ones(3))
    pending.wait()
    return into, gathered, total


def test_an_exchange_in_flight_while_collectives_run_completes_and_leaves_them_correct():
    world, numel = 3, 50_000
    for rank, (into, gathered, total) in enumerate(run_local_group(exchange_overlapping_collectives, world, numel)):
        assert torch.equal(into, torch.arange(numel, dtype=torch.float32) + 1000 * ((rank - 1) % world))
        assert gathered.view(-1).tolist() == [0, 1, 2] and total.tolist() == [3.0, 3.0, 3.0]


def rank_one_misbehaves(comm, how, timeout):
    comm.all_gather(torch.zeros(2))
    if comm.rank == 1:
        if how == "raises":
            raise ValueError("a bug on rank 1")
        if how == "dies":
            os._exit(9)
        time.sleep(3 * timeout)  # hangs past the others' timeout
    began = time.monotonic()
    try:
        comm.all_gather(torch.zeros(2))
    except CollectiveError as exc:
        return type(exc).__name__, time.monotonic() - began, str(exc)
    return "no error", time.monotonic() - began, ""


@pytest.mark.parametrize("how", ["raises", "dies", "hangs"])
def test_a_peer_that_raises_dies_or_hangs_makes_every_other_rank_fail_within_the_timeout(how):
    timeout = 3.0
    results = run_local_group(rank_one_misbehaves, 3, how, timeout, timeout_s=timeout, deadline_s=60,
                              allow_failures=True)
    for rank in (0, 2):
        kind, seconds, message = results[rank]
        assert kind in ("CollectiveError", "CollectiveTimeoutError"), results[rank]
        assert seconds < timeout + 2.0 and f"rank {rank} of 3: all_gather" in message
    if how == "hangs":
        assert results[0][0] == "CollectiveTimeoutError"
    if how == "dies":  # the launcher names the rank that died and how
        assert isinstance(results[1], RankDiedError) and (results[1].rank, results[1].exitcode) == (1, 9)


def test_backend_follows_the_device_and_npu_names_the_missing_package():
    assert backend_for("cpu") == "gloo"
    with pytest.raises(BackendUnavailableError, match="torch_npu"):
        backend_for("npu:0")
    with pytest.raises(BackendUnavailableError, match="expected one of"):
        backend_for("meta")
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="needs CUDA"):
            backend_for("cuda:0")
