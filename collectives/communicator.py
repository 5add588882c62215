"""A small communicator over torch.distributed: the few operations the balancer needs, each with a timeout.

Legend: G ranks in the group (one GPU each), N rows (tokens) sent by this rank, R rows received, `...` the trailing
dims of a row.

Operations:
- `all_gather(x)`: every rank's small tensor, stacked [G, *x.shape] (per-rank expert counts each step);
- `all_reduce_sum(x)`: the sum over ranks (the load recorder's window);
- `all_to_all(rows_N, send_counts_G, recv_counts_G)`: variable-size exchange of rows (MoE dispatch and combine);
- `exchange(sends, recvs, max_chunk_bytes)`: point-to-point transfers in chunks of at most `max_chunk_bytes`
  (expert weights when a placement changes); `start_exchange(sends, recvs)` posts them and returns at once, for a
  caller that overlaps them with other work and waits later (`PendingExchange.wait`);
- `agree(ok)`: True on every rank iff it is True on every rank, so that all ranks take the same branch;
- `broadcast(tensor, src)`, `min_over_ranks(value)`: small decisions one rank makes or all ranks share;
- `regroup(members)`: leave the group and form a new one with the surviving members (after a rank died or was
  drained), through the rendezvous store, which lives outside the ranks (`store_address`).

Invariants: every rank of the group must call the same operations in the same order with matching shapes (the
send counts of one rank are the receive counts of its peers), or the group hangs until the timeout. A peer that
dies (its connection closes) or hangs makes the operation raise `CollectiveError` / `CollectiveTimeoutError` on every
surviving rank within `timeout_s`, never a hang: each operation is issued asynchronously and waited on with the
timeout. On Gloo (CPU) the wait itself enforces it. On NCCL the host-side wait cannot bound a GPU kernel; the
process group's timeout (the same `timeout_s`, given at `init_communicator`) arms NCCL's watchdog, which aborts the
communicator and raises on the host; HCCL takes the same code path through `torch_npu`.
"""

import datetime
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from collectives.backend import backend_for
from collectives.errors import CollectiveError, CollectiveTimeoutError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


@dataclass
class Communicator:
    """One rank's handle on an expert-parallel group.

    Attributes:
        rank: this process's rank in `group` (0 <= rank < world_size).
        world_size: G, ranks in the group.
        device: where this rank's tensors live (cuda, npu or cpu); collectives take and return tensors there.
        timeout_s: seconds any single operation may take before it raises `CollectiveTimeoutError`.
        group: the torch process group (None: the default, world group).
        store: the rendezvous store (a client of a store that outlives any rank), needed by `regroup`.
        members: [world_size] the original rank of each rank of the group now (identity until a regroup).
        generation: how many times the group was re-formed.
    """

    rank: int
    world_size: int
    device: torch.device
    timeout_s: float = DEFAULT_TIMEOUT_S
    group: dist.ProcessGroup | None = field(default=None, repr=False)
    store: dist.Store | None = field(default=None, repr=False)
    members: list[int] = field(default_factory=list)
    generation: int = 0

    def __post_init__(self) -> None:
        self.members = self.members or list(range(self.world_size))

    @property
    def original_rank(self) -> int:
        """This process's rank in the group as first formed."""
        return self.members[self.rank]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[G, *tensor.shape]: `tensor` of every rank, in rank order (same shape and dtype on every rank)."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._complete(lambda: dist.all_gather(parts, tensor.contiguous(), group=self.group, async_op=True),
                       "all_gather")
        return torch.stack(parts)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `tensor` over ranks (a new tensor; the input is left as it was)."""
        total = tensor.clone()
        self._complete(lambda: dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
                       "all_reduce")
        return total

    def agree(self, ok: bool) -> bool:
        """True on every rank iff `ok` is True on every rank: a collective decision no rank can take alone."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        self._complete(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group, async_op=True), "agree")
        return bool(flag.item())

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """`tensor` of rank `src`, on every rank (in place: pass a tensor of the same shape and dtype everywhere)."""
        tensor = tensor.contiguous()
        self._complete(lambda: dist.broadcast(tensor, self._global(src), group=self.group, async_op=True), "broadcast")
        return tensor

    def min_over_ranks(self, value: int) -> int:
        """The least `value` over ranks, on every rank."""
        flag = torch.tensor([value], dtype=torch.int64, device=self.device)
        self._complete(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group, async_op=True),
                       "min_over_ranks")
        return int(flag.item())

    def all_to_all(self, rows_N: torch.Tensor, send_counts_G: list[int], recv_counts_G: list[int]) -> torch.Tensor:
        """Send rows_N [N, ...] from row sum(send_counts_G[:j]) on to rank j; return the rows received, in rank order
        [R, ...].

        `send_counts_G` [G] must sum to N; `recv_counts_G` [G] is what each rank sends here (its send_counts[rank]).
        """
        if len(send_counts_G) != self.world_size or len(recv_counts_G) != self.world_size:
            raise ValueError(
                f"send_counts_G and recv_counts_G need one entry per rank ({self.world_size}); got "
                f"{len(send_counts_G)} and {len(recv_counts_G)}"
            )
        if sum(send_counts_G) != rows_N.shape[0]:
            raise ValueError(f"send_counts_G sums to {sum(send_counts_G)} but rows_N has {rows_N.shape[0]} rows")
        received = rows_N.new_empty((sum(recv_counts_G), *rows_N.shape[1:]))
        self._complete(lambda: dist.all_to_all_single(
            received, rows_N.contiguous(), output_split_sizes=list(recv_counts_G),
            input_split_sizes=list(send_counts_G), group=self.group, async_op=True), "all_to_all")
        return received

    def exchange(
        self,
        sends: list[tuple[int, torch.Tensor]],
        recvs: list[tuple[int, torch.Tensor]],
        max_chunk_bytes: int = 64 << 20,
        *,
        tag_base: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        """Point-to-point transfers in chunks of at most `max_chunk_bytes`: send each (peer, tensor) of `sends`,
        receive into each (peer, tensor) of `recvs` (contiguous, filled in place).

        A rank's k-th send to a peer pairs with that peer's k-th receive from this rank: same shape and dtype.
        Chunk i of every transfer moves in round i, and a round ends before the next starts, so at most one chunk
        per transfer is in flight. `tag_base` offsets the message tags (a new value per attempt keeps a transfer
        that was abandoned from matching a later one); `timeout_s` overrides the communicator's for each round.
        """
        transfers = self._transfers(sends, recvs)
        tag_of = _pair_tags(transfers)
        rounds = max((_num_chunks(flat, max_chunk_bytes) for _, _, flat in transfers), default=0)
        for chunk in range(rounds):
            parts = []
            for index, (op, peer, flat) in enumerate(transfers):
                step = max(1, max_chunk_bytes // flat.element_size())
                parts.append((op, peer, flat[chunk * step : (chunk + 1) * step], tag_base + tag_of[index]))
            self._post(parts, f"exchange (chunk {chunk + 1} of {rounds})").wait(timeout_s)

    def start_exchange(
        self,
        sends: list[tuple[int, torch.Tensor]],
        recvs: list[tuple[int, torch.Tensor]],
        *,
        tag_base: int = 0,
    ) -> "PendingExchange":
        """Post point-to-point transfers, each whole, and return at once; `wait()` on the result before reading a
        received tensor or writing a sent one. Pairing and tags as in `exchange`. Every rank posts the same
        exchanges at the same point among its collectives (as for any operation), so posting one before other
        collectives and waiting after them is safe on Gloo and NCCL alike."""
        transfers = self._transfers(sends, recvs)
        tag_of = _pair_tags(transfers)
        return self._post([(op, peer, flat, tag_base + tag_of[index])
                           for index, (op, peer, flat) in enumerate(transfers)], "exchange")

    def _transfers(self, sends: list[tuple[int, torch.Tensor]],
                   recvs: list[tuple[int, torch.Tensor]]) -> list[tuple]:
        for _, tensor in recvs:
            if not tensor.is_contiguous():
                raise ValueError("each tensor of recvs must be contiguous: it is filled in place")
        transfers = [(dist.isend, peer, tensor.contiguous().view(-1)) for peer, tensor in sends]
        return transfers + [(dist.irecv, peer, tensor.view(-1)) for peer, tensor in recvs]

    def _post(self, parts: list[tuple], what: str) -> "PendingExchange":
        ops = [dist.P2POp(op, part, self._global(peer), group=self.group, tag=tag)
               for op, peer, part, tag in parts if part.numel()]
        return PendingExchange(self, self._start(lambda: dist.batch_isend_irecv(ops), what) if ops else [], what,
                               parts)

    def barrier(self) -> None:
        """Every rank reaches this point (an all-reduce, so the timeout applies as for any collective)."""
        self.agree(True)

    def regroup(self, members: list[int], timeout_s: float | None = None) -> None:
        """Leave the current group and form a new one of `members` (original ranks, this one among them), in that
        order: rank i of the new group is members[i]. Every member must call it with the same list; the new group
        waits up to `timeout_s` (default: twice the communicator's) for all of them, since survivors notice a
        failure up to one timeout apart.
        """
        if self.store is None:
            raise CollectiveError("regroup needs the rendezvous store: join with init_communicator(store_address=...)")
        if self.group is not None:
            raise CollectiveError("regroup re-forms the default process group; this communicator serves a subgroup")
        if self.original_rank not in members or len(set(members)) != len(members):
            raise ValueError(f"members must list distinct original ranks including this one "
                             f"({self.original_rank}); got {members}")
        backend = backend_for(self.device)
        if dist.is_initialized():
            dist.destroy_process_group()
        original_rank = self.original_rank
        generation = self.generation + 1
        rank = members.index(original_rank)
        wait = timeout_s if timeout_s is not None else 2 * self.timeout_s
        # From here the communicator names the group it tries to form, so that if forming it fails (another member
        # died meanwhile) the next agreement on survivors starts from these members in a fresh key space.
        self.members, self.generation, self.rank, self.world_size = list(members), generation, rank, len(members)
        try:
            prefixed = dist.PrefixStore(f"eplb/gen{generation}", self.store)
            dist.init_process_group(backend, store=prefixed, rank=rank, world_size=len(members),
                                    timeout=datetime.timedelta(seconds=wait))
            wait_until_all_joined(prefixed, rank, len(members), wait)
        except Exception as exc:
            raise CollectiveTimeoutError(
                f"rank {original_rank} could not form the group of {members} (generation {generation}) within "
                f"{wait:g} s: {' '.join(str(exc).split())[:160]}"
            ) from exc
        logger.info("rank %d re-formed the group as rank %d of %s (generation %d)", members[rank], rank, members,
                    generation)

    def leave(self) -> None:
        """Leave the group without waiting for peers (a drained rank, or at the end)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def _complete(self, post, what: str) -> None:
        """`post()` (a torch.distributed call with async_op=True), waited for within the timeout; every failure
        raised as `CollectiveError`."""
        self._wait(self._start(post, what), what)

    def _start(self, post, what: str):
        """`post()` (a torch.distributed call with async_op=True): its work; a backend error while posting (a
        connection an earlier timeout closed, a peer gone) raised as `CollectiveError`."""
        try:
            return post()
        except Exception as exc:  # the backends raise RuntimeError or DistBackendError subclasses
            raise self._collective_error(exc, what, self.timeout_s) from exc

    def _wait(self, work: dist.Work, what: str, timeout_s: float | None = None) -> None:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as exc:  # the backends raise RuntimeError or DistBackendError subclasses
            raise self._collective_error(exc, what, timeout_s) from exc

    def _collective_error(self, exc: Exception, what: str, timeout_s: float) -> CollectiveError:
        text = " ".join(str(exc).split())
        where = f"rank {self.rank} of {self.world_size}: {what}"
        if "timed out" in text.lower() or "timeout" in text.lower():
            return CollectiveTimeoutError(f"{where} did not complete within timeout_s={timeout_s:g}: a peer hangs, "
                                          f"died or never called it ({text[:120]})")
        return CollectiveError(f"{where} failed: a peer died or left the group ({text[:160]})")


@dataclass
class PendingExchange:
    """Point-to-point transfers in flight (`Communicator.start_exchange`); holds the tensors until they are done."""

    comm: Communicator
    works: list
    what: str
    parts: list = field(repr=False)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until every transfer is done (`CollectiveTimeoutError` past `timeout_s`, default the
        communicator's; `CollectiveError` when a peer died)."""
        works, self.works = self.works, []
        for work in works:
            self.comm._wait(work, self.what, timeout_s)
        self.parts = []


def wait_until_all_joined(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> None:
    """Returns once every rank of the group forming through `store` has returned from its `init_process_group`.

    Gloo's mesh connect can return on one rank while a peer is still completing its side of their pair; a rank
    that then ends at once (a short job, a drained rank) closes that pair under the peer, whose join fails with
    "Connection closed by peer". Each rank marks itself joined in the group's store and waits for the others'
    marks, so no rank goes on (or ends) before the group is whole; a peer that never joins leaves the
    store's timeout error after `timeout_s`.
    """
    store.set(f"joined/{rank}", b"1")
    store.wait([f"joined/{peer}" for peer in range(world_size)], datetime.timedelta(seconds=timeout_s))


def init_communicator(
    rank: int,
    world_size: int,
    *,
    device: torch.device | str = "cpu",
    init_method: str | None = None,
    store_address: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Communicator:
    """Join (or create) the default process group with the backend of `device` and return this rank's communicator.

    `init_method` is torch's rendezvous address (for example "tcp://127.0.0.1:29500"; None reads MASTER_ADDR and
    MASTER_PORT from the environment); there rank 0 hosts the store, so a group that must survive a dead rank joins
    instead through `store_address` ("host:port" of a TCPStore served by a process that outlives the ranks, such as
    the launcher or torchrun's agent), which `regroup` needs. The group's own timeout is `timeout_s` too, which
    arms NCCL's watchdog; with a store address, NCCL's error handling is set to abort the communicator without
    ending the process (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, unless set), so that survivors can regroup. With a store
    address it returns only once every rank has joined (`wait_until_all_joined`).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}); got {rank}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0; got {timeout_s}")
    backend = backend_for(device)
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if store_address is not None and init_method is not None:
        raise ValueError("give init_method or store_address, not both")
    store = None if store_address is None else _join_store(store_address, rank, device, timeout_s)
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(
                f"torch.distributed is already initialised as rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"not rank {rank} of {world_size}"
            )
    else:
        prefixed = None if store is None else dist.PrefixStore("eplb/gen0", store)
        try:
            where = {"init_method": init_method} if prefixed is None else {"store": prefixed}
            dist.init_process_group(backend, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s), **where)
            if prefixed is not None:
                wait_until_all_joined(prefixed, rank, world_size, timeout_s)
        except Exception as exc:  # rendezvous failures surface as RuntimeError, DistNetworkError, DistStoreError
            raise CollectiveTimeoutError(
                f"rank {rank} of {world_size} could not join the {backend} group at "
                f"{store_address or init_method or 'env://'} "
                f"within timeout_s={timeout_s:g}: {' '.join(str(exc).split())[:160]}"
            ) from exc
    logger.info("rank %d of %d joined the %s group on %s", rank, world_size, backend, device)
    return Communicator(rank, world_size, device, timeout_s, store=store)


def _join_store(store_address: str, rank: int, device: torch.device, timeout_s: float) -> dist.TCPStore:
    """A client of the TCPStore at `store_address` ("host:port"); on CUDA, NCCL set to abort a broken communicator
    without ending the process (unless set), so that survivors can regroup."""
    host, _, port = store_address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"store_address must be 'host:port'; got {store_address!r}")
    if device.type == "cuda":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    try:
        return dist.TCPStore(host, int(port), None, False, timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:
        raise CollectiveTimeoutError(f"rank {rank} could not reach the store at {store_address} within "
                                     f"timeout_s={timeout_s:g}: {' '.join(str(exc).split())[:160]}") from exc


def _num_chunks(flat: torch.Tensor, max_chunk_bytes: int) -> int:
    step = max(1, max_chunk_bytes // flat.element_size())
    return -(-flat.numel() // step)


def _pair_tags(transfers: list) -> list[int]:
    """Tag of each transfer: its position among this rank's transfers of the same direction with the same peer."""
    seen: dict[tuple, int] = {}
    tags = []
    for op, peer, _ in transfers:
        key = (op is dist.isend, peer)
        tags.append(seen.get(key, 0))
        seen[key] = tags[-1] + 1
    return tags
