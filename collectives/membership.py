"""Who is still alive in an EP group: heartbeats in the rendezvous store, and one agreed list of survivors.

A rank that dies outright (SIGKILL, a lost node) cannot say so; its peers notice only that a collective failed or
timed out, each at its own moment and with its own view. So every rank beats a counter in the store (which lives
outside the ranks, see `init_communicator(store_address=...)`) from a thread, and after a failure each survivor
runs `agree_on_survivors`: the first one to get there watches the counters for `heartbeat_timeout_s`, keeps the
ranks whose counter moved, and publishes that list with an atomic compare-and-set; every other survivor reads the
list published. No survivor can go on with a different view, and a rank left out of it (too slow to beat) learns
so and must leave.
"""

import json
import logging
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from collectives.errors import CollectiveError, CollectiveTimeoutError

logger = logging.getLogger(__name__)


def heartbeat_key(original_rank: int) -> str:
    return f"eplb/heartbeat/{original_rank}"


class Heartbeat:
    """A daemon thread that adds 1 to this rank's counter in the store every `interval_s`.

    It uses its own connection to the store (`address`, "host:port"), so that it never waits behind the main
    thread's store calls. Stops with `stop()` or with the process.
    """

    def __init__(self, address: str, original_rank: int, interval_s: float = 0.2) -> None:
        host, _, port = address.rpartition(":")
        self._store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=max(5.0, 10 * interval_s)))
        self._key, self._interval_s = heartbeat_key(original_rank), interval_s
        self._stopped = threading.Event()
        self._store.add(self._key, 1)
        self._thread = threading.Thread(target=self._run, name=f"eplb-heartbeat-{original_rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._store.add(self._key, 1)
            except Exception:  # the store went away: the whole job is ending
                logger.warning("heartbeat: the store stopped answering; heartbeats stop")
                return

    def stop(self) -> None:
        self._stopped.set()


def agree_on_survivors(
    store: dist.Store,
    generation: int,
    members: list[int],
    original_rank: int,
    heartbeat_timeout_s: float,
    wait_s: float,
) -> list[int]:
    """The members of group `generation` that are alive, the same list on every survivor (original ranks, sorted).

    Args:
        store: a client of the rendezvous store.
        generation: the generation of the group that failed (its key space in the store).
        members: that group's members (original ranks).
        original_rank: this rank.
        heartbeat_timeout_s: a member whose heartbeat does not move for this long counts as dead.
        wait_s: how long to wait for another survivor's decision before giving up.

    Raises:
        CollectiveError: this rank is not in the list agreed (the others took it for dead): it must leave.
        CollectiveTimeoutError: no decision within `wait_s`.
    """
    key = f"eplb/gen{generation}/survivors"
    deadline = time.monotonic() + wait_s
    if not store.check([key]):
        before = {member: store.add(heartbeat_key(member), 0) for member in members}
        watch_end = time.monotonic() + heartbeat_timeout_s
        while time.monotonic() < watch_end and not store.check([key]):
            time.sleep(min(0.05, heartbeat_timeout_s / 10))
        if not store.check([key]):
            alive = [member for member in members
                     if member == original_rank or store.add(heartbeat_key(member), 0) > before[member]]
            store.compare_set(key, "", json.dumps(alive))
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(f"rank {original_rank}: no survivor list for generation {generation} "
                                         f"within {wait_s:g} s")
        time.sleep(0.01)
    survivors = json.loads(store.get(key))
    if original_rank not in survivors:
        raise CollectiveError(f"rank {original_rank} was left out of the survivors {survivors} of generation "
                              f"{generation} (its heartbeat stalled): it must leave the group")
    logger.info("rank %d: survivors of generation %d: %s", original_rank, generation, survivors)
    return sorted(survivors)
