"""Survivors agree on one list through the store: ranks whose heartbeat stops are left out, every caller gets the
same list even when several decide at once, and a rank left out is told to leave."""

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from collectives import CollectiveError
from collectives.membership import Heartbeat, agree_on_survivors


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield server


def client(server):
    return dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=10))


def test_a_rank_whose_heartbeat_stopped_is_left_out_and_every_survivor_agrees(store):
    address = f"127.0.0.1:{store.port}"
    beats = {rank: Heartbeat(address, rank, interval_s=0.05) for rank in range(4)}
    beats[2].stop()
    time.sleep(0.2)
    results = {}

    def survivor(rank):
        results[rank] = agree_on_survivors(client(store), 0, [0, 1, 2, 3], rank, heartbeat_timeout_s=0.5,
                                           wait_s=5)

    threads = [threading.Thread(target=survivor, args=(rank,)) for rank in (0, 1, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {0: [0, 1, 3], 1: [0, 1, 3], 3: [0, 1, 3]}
    with pytest.raises(CollectiveError, match="left out"):
        agree_on_survivors(client(store), 0, [0, 1, 2, 3], 2, heartbeat_timeout_s=0.5, wait_s=5)
    # A later generation has its own key space.
    assert agree_on_survivors(client(store), 1, [0, 1, 3], 1, heartbeat_timeout_s=0.3, wait_s=5) == [0, 1, 3]
    for beat in beats.values():
        beat.stop()
