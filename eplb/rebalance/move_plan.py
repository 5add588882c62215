"""Planning the weight moves of a placement change: what each rank must receive, from whom, in bounded rounds.

Legend: G ranks (one GPU each), S slots per rank, D hidden size, F expert inner size, U fills and C chunks of an
encoded plan.

A rank holds, per layer, the weights of its slots (on its device) and host copies of some experts it serves nowhere
(`backup_wanted`): enough that every expert has a copy, in a slot or in host memory, on `failures_tolerated` + 1
ranks, so that any `failures_tolerated` ranks may die at once and every expert still has a copy on a survivor.
The host copies are spread evenly over the ranks. A change of placement is a
list of `Fill`s, each one expert's weights of one layer copied into one slot or one host copy, from a rank that
holds them now: the destination rank itself when it can (no bytes on the wire), else the holder with the fewest
sends so far. `schedule_chunks` cuts the fills into row ranges and packs them into rounds so that no rank sends or
receives more than a byte budget per round (one round between two decode steps). A rebalance's fills and rounds
are planned once, off the decode path, by `plan_rebalance`, and travel to every rank as int64 arrays
(`encode_fills`, `encode_rounds`; each rank decodes its own part, `decode_for_rank`). NumPy only: the rebalancer's
helper process plans without importing torch. `weight_moves` carries the rounds out.
"""


from dataclasses import dataclass

import numpy as np

from placement import Placement

MATRICES = ("gate", "up", "down")  # gate [D, F], up [D, F], down [F, D]


@dataclass(frozen=True)
class Fill:
    """Copy expert `expert` of layer `layer` from (src_rank, src_kind, src_index) to (dst_rank, dst_kind,
    dst_index); a kind is "slot" (index: the slot on that rank) or "backup" (index: the expert)."""

    layer: int
    expert: int
    dst_rank: int
    dst_kind: str
    dst_index: int
    src_rank: int
    src_kind: str
    src_index: int

    @property
    def is_local(self) -> bool:
        return self.src_rank == self.dst_rank


@dataclass(frozen=True)
class Chunk:
    """Rows [row_start, row_end) of one weight matrix (`MATRICES[matrix]`) of fill `fill`."""

    fill: int
    matrix: int
    row_start: int
    row_end: int
    nbytes: int


@dataclass(frozen=True)
class TransferShape:
    """What the plan of a move needs to know: the weights' D, F and bytes per element, the byte budget a rank may
    send or receive per round (per decode step), and how many ranks may die at once (the host copies the new
    placement needs, `backup_wanted`)."""

    hidden_size: int
    intermediate_size: int
    element_size: int
    max_bytes_per_round: int
    failures_tolerated: int


KINDS = ("slot", "backup")  # a kind's code in the encoded fills


def backup_wanted(experts_GS: np.ndarray, failures_tolerated: int) -> list[tuple[int, int]]:
    """(rank, expert) pairs, sorted: the host copies that give every expert of `experts_GS` [G, S] (-1 = empty) a
    copy, in a slot or in host memory, on min(failures_tolerated + 1, G) ranks, so that any `failures_tolerated`
    ranks may die at once and a survivor still holds every expert.

    Experts short of copies are served in order (the most missing first, then by id); each copy goes to a rank
    that holds the expert nowhere yet: the nearest after the expert's first rank on the ring among the ranks below
    the cap (the mean copies per rank rounded up, plus one), else the nearest over it. So no rank holds more than a
    copy above the mean's ceiling in a layer, with one failure tolerated a lone expert's copy lies on its rank's
    successor, and a placement a few slots away (a burst patch) wants nearly the same copies: an expert's copies
    depend on its own ranks and on which ranks are full, not on every expert served before it (balancing by the
    fewest copies so far re-planned dozens of copies per layer for one moved slot; docs/rebalancing.md). Pure and
    deterministic: every rank computes the same pairs. Empty for one rank (nothing survives its loss)."""
    num_gpus, slots = experts_GS.shape
    copies = min(failures_tolerated + 1, num_gpus)
    if copies < 2 or not (experts_GS >= 0).any():
        return []
    num_experts = int(experts_GS.max()) + 1
    flat, gpus = experts_GS.reshape(-1), np.repeat(np.arange(num_gpus), slots)
    holds_EG = np.zeros((num_experts, num_gpus), dtype=bool)
    holds_EG[flat[flat >= 0], gpus[flat >= 0]] = True
    holders_E = holds_EG.sum(1)
    need_E = np.where(holders_E > 0, np.maximum(copies - holders_E, 0), 0)
    cap = -(-int(need_E.sum()) // num_gpus) + 1
    first_E = holds_EG.argmax(1)
    nearest = _nearest_copies(holds_EG, need_E, first_E, copies, cap)
    return nearest if nearest is not None else _walked_copies(holds_EG, need_E, first_E, cap)


def _walked_copies(holds_EG: np.ndarray, need_E: np.ndarray, first_E: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """`backup_wanted`'s pairs, expert by expert in its order, each walking the ring from its first rank."""
    num_experts, num_gpus = holds_EG.shape
    order = np.lexsort((np.arange(num_experts), -need_E))[: int((need_E > 0).sum())]
    holds = holds_EG[order].tolist()
    host_G = [0] * num_gpus
    wanted = []
    for expert, need, first, held in zip(order.tolist(), need_E[order].tolist(), first_E[order].tolist(), holds):
        # The ranks that may take a copy (none holding it), nearest after the expert's first rank first: below
        # the cap, then over it. Most experts need one copy and find it a rank or two along.
        chosen, over = [], []
        for step in range(1, num_gpus):
            gpu = (first + step) % num_gpus
            if held[gpu]:
                continue
            if host_G[gpu] < cap:
                chosen.append(gpu)
                if len(chosen) == need:
                    break
            elif len(over) < need:
                over.append(gpu)
        chosen += over[: need - len(chosen)]
        for gpu in chosen:
            host_G[gpu] += 1
        wanted += [(gpu, expert) for gpu in chosen]
    return sorted(wanted)


def _nearest_copies(holds_EG: np.ndarray, need_E: np.ndarray, first_E: np.ndarray, copies: int, cap: int
                    ) -> list[tuple[int, int]] | None:
    """`backup_wanted`'s pairs when the cap never turns a copy away, else None: each expert's copies on the first
    need_E[e] ranks after first_E[e] on the ring that do not hold it, for every expert at once. If no rank ends
    with more than `cap` copies, none had `cap` when one was given to it, so the walk in order (which skips a rank
    only once it has `cap`) gives the same ranks. Among the copies - 1 ranks after an expert's first there are at
    least its need that do not hold it (it holds copies - need ranks, its first among them)."""
    num_gpus = holds_EG.shape[1]
    experts = np.flatnonzero(need_E > 0)
    width = min(copies - 1, num_gpus - 1)
    gpus_NW = (first_E[experts][:, None] + np.arange(1, width + 1)[None]) % num_gpus
    free_NW = ~holds_EG[experts[:, None], gpus_NW]
    taken_NW = free_NW & (np.cumsum(free_NW, axis=1) <= need_E[experts][:, None])
    gpus = gpus_NW[taken_NW]
    if len(gpus) and np.bincount(gpus, minlength=num_gpus).max() > cap:
        return None
    pairs_N2 = np.stack([gpus, np.broadcast_to(experts[:, None], gpus_NW.shape)[taken_NW]], axis=1)
    return [tuple(pair) for pair in pairs_N2[np.lexsort((pairs_N2[:, 1], pairs_N2[:, 0]))].tolist()]


def plan_fills(
    layer: int,
    wanted: list[tuple[int, str, int, int]],
    holders: dict[int, dict[int, tuple[str, int]]],
    sends_so_far: dict[int, int] | None = None,
) -> list[Fill]:
    """One layer's fills.

    Args:
        wanted: (dst_rank, dst_kind, dst_index, expert) for each slot or host copy to fill.
        holders: rank -> expert -> (kind, index) of a copy that rank holds now (prefer a slot).
        sends_so_far: rank -> copies it sends in the plan so far (updated), to spread the sends over layers.

    Raises:
        LookupError: an expert wanted that no rank holds (its every copy was lost).
    """
    sends = {} if sends_so_far is None else sends_so_far
    fills = []
    for dst_rank, dst_kind, dst_index, expert in wanted:
        if expert in holders.get(dst_rank, {}):
            src_rank = dst_rank
        else:
            candidates = [rank for rank, held in sorted(holders.items()) if expert in held]
            if not candidates:
                raise LookupError(f"expert {expert} of layer {layer} has no copy left on any rank")
            src_rank = min(candidates, key=lambda rank: (sends.get(rank, 0), rank))
            sends[src_rank] = sends.get(src_rank, 0) + 1
        src_kind, src_index = holders[src_rank][expert]
        fills.append(Fill(layer, expert, dst_rank, dst_kind, dst_index, src_rank, src_kind, src_index))
    return fills


def schedule_chunks(
    fills: list[Fill], hidden_size: int, intermediate_size: int, element_size: int, max_bytes_per_round: int
) -> list[list[Chunk]]:
    """Rounds of chunks: each rank sends at most, and receives at most, `max_bytes_per_round` per round over the
    wire. Local fills (no wire) all go in the first round. Each weight matrix goes, in order, to the earliest round
    where its two ranks both have room for one of its rows (first fit), as many of its rows as that room takes,
    the rest to the next such round, and so on: a round is filled to the last row that fits, so the rounds number
    the most bytes one rank sends or receives over the budget, rounded up, or little more (whole matrices leave
    the room short of one more matrix empty in every round). The result depends only on the fills' order, so every
    rank builds the same rounds.

    Raises:
        ValueError: the budget is below one row of a weight matrix.
    """
    row_bytes = {0: intermediate_size * element_size, 1: intermediate_size * element_size,
                 2: hidden_size * element_size}
    rows = {0: hidden_size, 1: hidden_size, 2: intermediate_size}
    if max_bytes_per_round < max(row_bytes.values()):
        raise ValueError(f"max_bytes_per_step={max_bytes_per_round} is below one row of an expert's weights "
                         f"({max(row_bytes.values())} bytes); raise it")
    local = [Chunk(index, matrix, 0, rows[matrix], 0) for index, fill in enumerate(fills) if fill.is_local
             for matrix in range(3)]
    filler = _RoundFiller(max_bytes_per_round, min(row_bytes.values()), local)
    for index, fill in enumerate(fills):
        if not fill.is_local:
            for matrix in range(3):
                filler.place(index, fill, matrix, rows[matrix], row_bytes[matrix])
    return [chunks for chunks in filler.rounds if chunks] or [[]]


class _RoundFiller:
    """Rounds filled first fit (`schedule_chunks`): the chunks of each round, and the bytes each rank sends and
    receives in it."""

    def __init__(self, budget: int, smallest_row: int, local: list[Chunk]) -> None:
        self.budget, self.smallest_row = budget, smallest_row
        self.rounds: list[list[Chunk]] = [local]
        self.sent: list[dict[int, int]] = [{}]
        self.received: list[dict[int, int]] = [{}]
        # Rounds before first_open[(side, rank)] have no room for even the smallest row at that end: the first-fit
        # scan starts after them (the same rounds as scanning from 0, without the quadratic cost at the full shape).
        self.first_open: dict[tuple[int, int], int] = {}

    def _open_from(self, side: int, rank: int, used: list[dict[int, int]]) -> int:
        r = self.first_open.get((side, rank), 0)
        while r < len(self.rounds) and used[r].get(rank, 0) + self.smallest_row > self.budget:
            r += 1
        self.first_open[(side, rank)] = r
        return r

    def _room(self, r: int, fill: Fill) -> int:
        return self.budget - max(self.sent[r].get(fill.src_rank, 0), self.received[r].get(fill.dst_rank, 0))

    def place(self, index: int, fill: Fill, matrix: int, num_rows: int, row: int) -> None:
        """Weight matrix `matrix` of fill `index` (`num_rows` rows of `row` bytes), in chunks, each in the earliest
        round where both its ranks still have room for a row, as many rows as that room takes."""
        start = 0
        while start < num_rows:
            begin = max(self._open_from(0, fill.src_rank, self.sent), self._open_from(1, fill.dst_rank, self.received))
            slot = next((r for r in range(begin, len(self.rounds)) if self._room(r, fill) >= row), None)
            if slot is None:
                self.rounds.append([])
                self.sent.append({})
                self.received.append({})
                slot = len(self.rounds) - 1
            end = min(num_rows, start + self._room(slot, fill) // row)
            nbytes = (end - start) * row
            self.rounds[slot].append(Chunk(index, matrix, start, end, nbytes))
            self.sent[slot][fill.src_rank] = self.sent[slot].get(fill.src_rank, 0) + nbytes
            self.received[slot][fill.dst_rank] = self.received[slot].get(fill.dst_rank, 0) + nbytes
            start = end


def holders_of(experts_GS: np.ndarray, failures_tolerated: int | None,
               backups: list[tuple[int, int]] | None = None) -> dict[int, dict[int, tuple[str, int]]]:
    """GPU -> expert -> where that GPU's rank holds it under the placement `experts_GS` [G, S] (-1 = empty):
    ("slot", its first slot), else ("backup", expert) for the host copies `backup_wanted` gives it for
    `failures_tolerated` (None: slots only, before the host copies are built); `backups`: those host copies, when
    the caller has them already."""
    holders: dict[int, dict[int, tuple[str, int]]] = {}
    for gpu, row in enumerate(experts_GS.tolist()):
        held = holders.setdefault(gpu, {})
        for slot, expert in enumerate(row):
            if expert >= 0:
                held.setdefault(int(expert), ("slot", slot))
    if backups is None:
        backups = backup_wanted(experts_GS, failures_tolerated) if failures_tolerated is not None else []
    for gpu, expert in backups:
        holders[gpu].setdefault(expert, ("backup", expert))
    return holders


def plan_rebalance(current: Placement, target: Placement, shape: TransferShape,
                   first_layers: list[int] | None = None) -> tuple[list[Fill], list[list[Chunk]]]:
    """The fills and rounds that take a group from `current` to `target` (same GPUs and slots): every slot whose
    expert changes, and the host copies the new placement needs that the old one's did not include; then the rounds.
    The layers in `first_layers` are planned first, so that their fills take the earliest rounds (a patch's layers
    switch as their weights land: the ones with burst moves first), then the others in order.
    Pure (the same on any process), and slow in Python at the full shape (figures: docs/rebalancing.md, 'The
    background solve'): the rebalancer runs it beside the solve, never on the decode path."""
    grid = (current.cluster.num_gpus, current.cluster.slots_per_gpu)
    fills: list[Fill] = []
    sends: dict[int, int] = {}
    first = [] if first_layers is None else [int(layer) for layer in first_layers]
    for layer in first + [layer for layer in range(current.num_layers) if layer not in set(first)]:
        old_GS, new_GS = current.phy2log_LP[layer].reshape(grid), target.phy2log_LP[layer].reshape(grid)
        if np.array_equal(old_GS, new_GS):
            continue  # the same slots want the same host copies: nothing to fill (a patch leaves most layers so)
        tolerated = shape.failures_tolerated
        old_backups = backup_wanted(old_GS, tolerated)
        wanted = [(int(gpu), "slot", int(slot), int(new_GS[gpu, slot])) for gpu, slot in np.argwhere(new_GS != old_GS)]
        old_backup = set(old_backups)
        wanted += [(gpu, "backup", expert, expert) for gpu, expert in backup_wanted(new_GS, tolerated)
                   if (gpu, expert) not in old_backup]
        fills += plan_fills(layer, wanted, holders_of(old_GS, tolerated, old_backups), sends)
    rounds = schedule_chunks(fills, shape.hidden_size, shape.intermediate_size, shape.element_size,
                             shape.max_bytes_per_round)
    return fills, rounds


def encode_fills(fills: list[Fill]) -> np.ndarray:
    """[U, 8] int64: (layer, expert, dst_rank, dst kind, dst_index, src_rank, src kind, src_index) per fill, kinds
    as their index in `KINDS`."""
    rows = [(f.layer, f.expert, f.dst_rank, KINDS.index(f.dst_kind), f.dst_index, f.src_rank,
             KINDS.index(f.src_kind), f.src_index) for f in fills]
    return np.array(rows, dtype=np.int64).reshape(-1, 8)


def decode_fills(fills_U8: np.ndarray) -> list[Fill]:
    """The inverse of `encode_fills`."""
    return [Fill(layer, expert, dst_rank, KINDS[dst_kind], dst_index, src_rank, KINDS[src_kind], src_index)
            for layer, expert, dst_rank, dst_kind, dst_index, src_rank, src_kind, src_index in fills_U8.tolist()]


def encode_rounds(rounds: list[list[Chunk]]) -> np.ndarray:
    """[C, 6] int64: (round, fill, matrix, row_start, row_end, nbytes) per chunk, rounds in order (an empty round
    of none is kept as the count of rounds being at least one)."""
    rows = [(index, chunk.fill, chunk.matrix, chunk.row_start, chunk.row_end, chunk.nbytes)
            for index, chunks in enumerate(rounds) for chunk in chunks]
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


def decode_rounds(chunks_C6: np.ndarray, num_rounds: int | None = None) -> list[list[Chunk]]:
    """The inverse of `encode_rounds` (no chunks: one empty round, as `schedule_chunks` gives); `num_rounds`
    keeps trailing rounds with no chunk of these."""
    count = max(num_rounds or 0, int(chunks_C6[:, 0].max()) + 1 if len(chunks_C6) else 1)
    rounds: list[list[Chunk]] = [[] for _ in range(count)]
    for index, fill, matrix, start, end, nbytes in chunks_C6.tolist():
        rounds[index].append(Chunk(fill, matrix, start, end, nbytes))
    return rounds


def decode_for_rank(fills_U8: np.ndarray, chunks_C6: np.ndarray, rank: int) -> tuple[dict[int, Fill],
                                                                                     list[list[Chunk]]]:
    """One rank's part of an encoded plan: its fills (by their index in the plan: it sends or receives them) and
    every round with only its chunks (the same number of rounds on every rank). Filtering before decoding keeps
    this fast at the full shape, where decoding the whole plan is not (figures: docs/rebalancing.md, 'The background
    solve')."""
    mine = np.flatnonzero((fills_U8[:, 2] == rank) | (fills_U8[:, 5] == rank))
    fills = dict(zip(mine.tolist(), decode_fills(fills_U8[mine])))
    num_rounds = int(chunks_C6[:, 0].max()) + 1 if len(chunks_C6) else 1
    return fills, decode_rounds(chunks_C6[np.isin(chunks_C6[:, 1], mine)], num_rounds)
