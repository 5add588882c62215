"""Run a function on G local processes that form one Gloo group: for tests, demos and benchmarks on one machine.

Each process joins the group through a rendezvous store this (launcher) process serves on a free loopback port, so
that the store outlives any rank and survivors can regroup through it; each runs `fn(comm, *args)` and sends back
its result or its error. The whole run has a deadline: a process still running then is killed, and the run raises,
so a bug fails instead of hanging. The ranks end with this process however it ends: an exception here (a signal
turned into one, Ctrl-C) kills them at once, and each rank ends by itself when this process is gone, even killed
outright (`collectives.lifeline`); multiprocessing's resource tracker then ends too, once no rank holds its pipe.

The ranks are forked from multiprocessing's fork server, which imports torch once and then forks each rank from
that state: a group starts in a fraction of a second instead of each rank importing torch anew (figures:
docs/benchmarks.md, 'Test suite'). No rank inherits the launcher's threads or CUDA state (the server initialises
neither). The fork server is the ranks' parent: it ends as soon as the launcher does (it reads the end of the file
of a pipe only the launcher holds), and each rank ends with it.
"""

import multiprocessing as mp
import multiprocessing.forkserver
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.distributed as dist

from collectives.communicator import Communicator, init_communicator
from collectives.errors import CollectiveError, RankDiedError
from collectives.lifeline import end_with_parent, parent_of_child


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_local_group(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 20.0,
    deadline_s: float = 120.0,
    allow_failures: bool = False,
    device: str = "cpu",
) -> list[Any]:
    """Run `fn(comm, *args)` on `world_size` local processes of one group; return each rank's result, in rank order.

    Args:
        fn: a module-level function (it is pickled to the spawned processes).
        device: "cpu" (a Gloo group) or "cuda" (an NCCL group, rank r on GPU r modulo the GPUs there are; NCCL
            wants one GPU per rank).
        timeout_s: the communicator's timeout for each collective.
        deadline_s: the whole run's limit; processes still alive then are killed.
        allow_failures: if True, a rank that raised, died or was killed at the deadline yields its exception (a
            `RankDiedError` if it died, a `TimeoutError` if it was killed) as its result instead of making the
            run raise.
    """
    ctx, parent = _rank_context()
    # One pipe per rank for its result (a queue would add semaphores, which the resource tracker reports as leaked
    # when this process is killed); its end of file says that the rank is gone.
    readers, writers = zip(*(ctx.Pipe(duplex=False) for _ in range(world_size)))
    # The rendezvous store lives here, in the launcher, so that it outlives any rank (ranks regroup through it).
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    address = f"127.0.0.1:{store.port}"
    # Not daemonic: a rank may start helper processes of its own (the rebalancer's solver); every rank is killed
    # below if it outlives the deadline, and ends by itself if this process does.
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, world_size, address, timeout_s, writers[rank], args,
                                                  device, parent))
             for rank in range(world_size)]
    end = time.monotonic() + deadline_s
    try:
        outcome = _start_and_collect(procs, readers, writers, end)
    except BaseException:
        # Interrupted (a signal turned into an exception, Ctrl-C) or broken here: the ranks end now, not at the
        # deadline.
        for proc in procs:
            if proc.pid is not None:
                proc.kill()
        raise
    finally:
        _reap(procs, readers, writers, end)
    return _results_in_rank_order(outcome, world_size, deadline_s, allow_failures)


def start_local_group_server(preload: Sequence[str] = ()) -> None:
    """Starts the fork server that `run_local_group` forks ranks from, if it is not running, and returns at once: its
    imports (torch, and the modules `preload` names) then overlap the caller's own set-up instead of delaying the
    first group, and no rank pays them again. Later groups of this process reuse it; it ends with this process.

    A server running without one of the `preload` modules is stopped and started anew with them (call between
    groups, never while one runs): its later ranks start with them imported. A module that fails to import is
    skipped (the ranks import it themselves, or fail as they would have).
    """
    wanted = _preloaded | set(preload)
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None and not wanted <= _preloaded:
        server._stop()
    _preloaded.update(wanted)
    _rank_context()


# What the fork server imports before it forks any rank.
FORK_SERVER_PRELOAD = ["torch", "torch.distributed", "collectives.local_group"]
# What the running (or next) fork server imports: FORK_SERVER_PRELOAD and what start_local_group_server added.
_preloaded: set[str] = set(FORK_SERVER_PRELOAD)


def _rank_context() -> tuple[mp.context.BaseContext, tuple[int, bool]]:
    """The multiprocessing context the ranks start in, and what each rank's `end_with_parent` watches.

    The fork server (started once per launcher, reused by every later group), whose process id the ranks watch:
    they are its children, and it ends with this process. Where the fork server's id cannot be read, spawned ranks
    that watch this process instead.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORK_SERVER_PRELOAD + sorted(_preloaded - set(FORK_SERVER_PRELOAD)))
    server = multiprocessing.forkserver._forkserver
    server.ensure_running()
    server_pid = getattr(server, "_forkserver_pid", None)
    if server_pid is None:
        return mp.get_context("spawn"), parent_of_child()
    return ctx, (server_pid, True)  # the server forks every rank from its main (only) thread


def _start_and_collect(procs: list, readers: tuple[Connection, ...], writers: tuple[Connection, ...],
                       end: float) -> dict[int, tuple[bool, Any]]:
    """Starts the ranks and reads what each sends back until all have or the monotonic time `end` passes:
    rank -> (True, its result) or (False, its error); a rank gone without a word counts as died."""
    outcome: dict[int, tuple[bool, Any]] = {}
    for proc, writer in zip(procs, writers):
        proc.start()
        writer.close()  # the rank holds its own copy: once it is gone, its reader sees the end of the file
    while len(outcome) < len(procs) and time.monotonic() < end:
        waiting = {readers[rank]: rank for rank in range(len(procs)) if rank not in outcome}
        for reader in wait(list(waiting), timeout=min(0.2, max(0.0, end - time.monotonic()))):
            rank = waiting[reader]
            try:
                outcome[rank] = pickle.loads(reader.recv_bytes())
            except (EOFError, OSError):  # it ended before or while it wrote
                procs[rank].join(timeout=1.0)
                outcome[rank] = (False, RankDiedError(rank, procs[rank].exitcode))
    return outcome


def _reap(procs: list, readers: tuple[Connection, ...], writers: tuple[Connection, ...], end: float) -> None:
    """Waits for the started ranks until shortly after `end`, kills those still alive, and closes every pipe."""
    for proc in procs:
        if proc.pid is None:  # never started
            continue
        proc.join(timeout=max(0.0, min(5.0, end - time.monotonic())))
        if proc.is_alive():
            proc.kill()
            proc.join()
    for reader, writer in zip(readers, writers):
        reader.close()
        writer.close()


def _results_in_rank_order(outcome: dict[int, tuple[bool, Any]], world_size: int, deadline_s: float,
                           allow_failures: bool) -> list[Any]:
    """Each rank's result (or, with `allow_failures`, its error), in rank order; else raises for the ranks that
    missed the deadline, or for the first rank whose own error caused the failure."""
    missing = [rank for rank in range(world_size) if rank not in outcome]
    if missing and not allow_failures:
        raise TimeoutError(f"ranks {missing} of {world_size} did not finish within deadline_s={deadline_s:g}")
    for rank in missing:
        outcome[rank] = (False, TimeoutError(f"rank {rank} did not finish within deadline_s={deadline_s:g}; killed"))
    failed = {rank: value for rank, (ok, value) in outcome.items() if not ok}
    if failed and not allow_failures:
        rank, error = min(failed.items(), key=lambda item: (root_cause_order(item[1]), item[0]))
        raise RuntimeError(f"rank {rank} of {world_size} failed: {error}") from error
    return [outcome[rank][1] for rank in range(world_size)]


def root_cause_order(error: BaseException) -> int:
    """Sort key of a rank's error as the cause of a group's failure: a rank's own error first, then a rank that died
    (killed, crashed), last a collective that failed because a peer did."""
    if isinstance(error, RankDiedError):
        return 1
    return 2 if isinstance(error, CollectiveError) else 0


def _rank_main(fn, rank: int, world_size: int, address: str, timeout_s: float, results: Connection, args,
               device: str, parent: tuple[int, bool]) -> None:
    end_with_parent(*parent)
    _release_fork_server()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    try:
        if device == "cuda":
            device = f"cuda:{rank % max(1, torch.cuda.device_count())}"
        comm: Communicator = init_communicator(rank, world_size, device=device, store_address=address,
                                               timeout_s=timeout_s)
        # Plain pickle, by value: the connection's own pickler would pass tensors as shared-memory handles, which
        # die with this process.
        message = pickle.dumps((True, fn(comm, *args)))
    except BaseException as exc:  # report every failure, including a rank's own bug, to the parent
        message = pickle.dumps((False, _picklable(exc, traceback.format_exc())))
    try:
        results.send_bytes(message)
    finally:
        # Leave at once: a clean shutdown of the group would wait for peers that may be dead.
        os._exit(0)


def _release_fork_server() -> None:
    """Closes this rank's copy of the write end of the fork server's "alive" pipe (every process the server forks
    inherits one), so that the server sees the end of that pipe, and ends, as soon as the launcher ends: a rank
    holding it would keep the server, which the rank itself watches, alive. No rank asks the server for a fork."""
    server = multiprocessing.forkserver._forkserver
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        os.close(alive_fd)
        server._forkserver_alive_fd = None


def _picklable(exc: BaseException, trace: str) -> BaseException:
    """`exc` with its traceback as a note if it survives pickling, else a RuntimeError that says what it was."""
    exc.add_note(trace)
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{trace}")
