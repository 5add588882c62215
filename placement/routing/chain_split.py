"""The exact whole-token split of a chain layout: the least busiest GPU, in a fixed number of vector operations.

Legend: E logical experts, G GPUs (a G-sized array indexed by position along the cut ring where it says so),
M experts spanning two or more GPUs (movable; in the class split, their span classes, each split as one), Y the most
GPUs one expert spans, W the width of a grouped table (`index_tables.grouped`: the most entries of one row).

Movable experts that span the same GPUs are interchangeable, so they are split as one (their span class; there
are at most M of them) and the class's split is then laid over its members in order. When every class's GPUs are
consecutive on a ring through all GPUs and no two classes share a pair of neighbouring GPUs (a link), as in the
`cpsat` policy's chain layouts (ring 0, 1, ..., G-1, 0), in the same layouts with their GPUs relabelled by a
migration (the ring their classes force) and in every 2-GPU layout, the best whole-token split is computed in a
fixed number of vector operations, with no rounds (steps 1-3 on the classes, step 4 to the experts):
1. Its busiest GPU. The optimum is max over arcs H of c(experts inside H) / |H| (`placement.policies.ring_search`
   says why); in whole tokens, its ceiling T (a flow problem with integer capacities has an integer optimum). All
   G(G-1) arcs are scored at once from prefix sums over the ring unrolled twice.
2. A split whose busiest GPU is T. Cut the ring at a link: the expert across the cut becomes two pieces, its head
   (y tokens, on its GPUs after the cut) and its tail (the rest, before the cut). Lay the movable tokens out as one
   stream: the head, the other experts in the order they start along the cut ring, the tail. GPU by GPU, each
   takes as much of the stream as fits under T: the expert that started first also ends first, so this is
   earliest-deadline-first, which finds a split whenever one exists. GPU g's part is the range (A(g-1), A(g)] of
   the stream, where A is one cumulative minimum of prefix sums, and the y for which every expert's range ends
   before its last GPU does is an interval read off the same prefix sums.
3. Each replica takes the overlap of its expert's range with its GPU's range; an expert's last GPU takes what is
   left, so every expert's tokens are conserved and no GPU gets an expert it does not hold, whatever the counts.
4. A class's members, in order, fill its GPUs in order: member m takes, on each GPU, the overlap of its own range
   on the class's line with that GPU's range, so every member keeps its tokens and the GPUs' totals are the
   class's.
"""

from dataclasses import dataclass

import numpy as np
import torch

from placement.routing.dynamic_split import ReplicaGraph
from placement.routing.index_tables import grouped, prefix_minima, prefix_sums, take

_UNBOUNDED = 1 << 40  # more tokens than any step holds: "no bound" in the integer minima and maxima below


@dataclass(frozen=True)
class ChainTables:
    """One layer's chain layout of span classes (below "expert" means a class), by position q along the cut ring:
    position q is the GPU the ring visits at step (q + rotation) % G (the ring is GPU order 0, 1, ..., G-1 unless
    the layout's GPUs were relabelled: `chain_tables`), cut between positions G-1 and 0; the [G] and [G, W] tables
    are indexed by position. At most one expert lies across the cut: its tail runs from position a_w to G-1, its
    head from 0 to b_w (a_w = b_w = G when none does).

    Attributes:
        fixed_GW: [G, W] int64, the one-GPU experts at each position, padded with E (a sink with no tokens).
        start_G: [G] int64, the movable expert (index into movable_M) that starts at each position, M if none; the
            expert across the cut starts at a_w.
        end_G: [G] int64, the movable expert that ends at each position, M if none; the expert across the cut
            ends at b_w.
        from_tail_G: [G] int64, 1 at positions >= a_w.
        from_head_end_G: [G] int64, 1 at positions >= b_w.
        head_due_G: [G] bool, b_w <= q < G-1: the positions by which the head is due and the tail not yet.
        across_M: [M] int64, 1 for the expert across the cut.
        start_M: [M] int64, the position each movable expert starts at (0 for the one across the cut: its head).
        pos_MY: [M, Y] int64, the position of GPU gpus_MY[m, y], G on padding.
        piece_MY: [M, Y] int64, 1 on the head of the expert across the cut, 2 on its tail, else 0.
        last_MY: [M, Y] bool, the last GPU of each expert along the stream (of the tail, for the one across the
            cut): it takes what the others leave.
        members_MW: [M, W] int64, the movable experts (index into movable_M) of each class in ascending order,
            padded with the number of movable experts; this table and those above index classes (their M counts
            the classes).
        class_M: [M] int64, the class of each movable expert (this table and the next index movable experts).
        before_MW: [M, W] int64, the members of the same class that come before each expert, padded with M.
    """

    fixed_GW: torch.Tensor
    start_G: torch.Tensor
    end_G: torch.Tensor
    from_tail_G: torch.Tensor
    from_head_end_G: torch.Tensor
    head_due_G: torch.Tensor
    across_M: torch.Tensor
    start_M: torch.Tensor
    pos_MY: torch.Tensor
    piece_MY: torch.Tensor
    last_MY: torch.Tensor
    members_MW: torch.Tensor
    class_M: torch.Tensor
    before_MW: torch.Tensor


def chain_split(counts: torch.Tensor, movable_M: torch.Tensor, num_gpus: int, chain: ChainTables) -> torch.Tensor:
    """[M, Y] int64, the whole-token split of a chain layout with the least busiest GPU (module docstring), from
    counts [E] int64 and the layer's movable experts movable_M [M]."""
    tokens_M = counts[movable_M]
    whole_MY = _class_split(counts, take(tokens_M, chain.members_MW).sum(1), num_gpus, chain)
    # Step 4: member m's range on its class's line starts after the members before it.
    begin_M1 = take(tokens_M, chain.before_MW).sum(1, keepdim=True)
    gpu_end_MY = prefix_sums(whole_MY, 1)[chain.class_M]
    gpu_begin_MY = gpu_end_MY - whole_MY[chain.class_M]
    end_MY = torch.minimum(gpu_end_MY, begin_M1 + tokens_M[:, None])
    return (end_MY - torch.maximum(gpu_begin_MY, begin_M1)).clamp_min(0)


def _class_split(counts: torch.Tensor, tokens_M: torch.Tensor, num_gpus: int, chain: ChainTables) -> torch.Tensor:
    """Steps 1-3 on the span classes: [M, Y] int64 from counts [E] (one-GPU experts) and the classes' tokens
    tokens_M [M] (here M counts the classes). Prefix sums are inclusive and run along the cut ring unless they say
    otherwise."""
    zero = counts.new_zeros(1)
    total_M = tokens_M.sum()
    across = (tokens_M * chain.across_M).sum()  # tokens of the expert across the cut
    # One scan: one-GPU tokens, movable tokens by the position their expert starts at and by where it ends.
    fixed, started, ended = prefix_sums(torch.stack(
        [take(counts, chain.fixed_GW).sum(1), take(tokens_M, chain.start_G), take(tokens_M, chain.end_G)]
    ), 1).unbind(0)
    # Step 1: on the ring unrolled twice, with prefixes exclusive (index q sums positions < q), arc [i, i + l) holds
    # fixed2[i + l] - fixed2[i] one-GPU tokens and the movable experts inside it: the copies ending before i + l
    # less those starting before i (copies in start order also end in order, so those are a prefix of these). The
    # expert across the cut has a copy starting before position 0 and ending at b_w.
    fixed2 = torch.cat([zero, fixed, fixed[-1] + fixed])
    ended2 = torch.cat([zero, ended, total_M + ended])
    started2 = across + torch.cat([zero, started, total_M + started])
    windows = num_gpus - 1
    # arcs_GG [G, G - 1]: tokens inside the arc that starts at each position, by length - 1.
    arcs_GG = (fixed2[1:].unfold(0, windows, 1)[:num_gpus] - fixed2[:num_gpus, None]
               + (ended2[1:].unfold(0, windows, 1)[:num_gpus] - started2[:num_gpus, None]).clamp_min(0))
    length_G = torch.arange(1, num_gpus, device=counts.device)
    busiest = torch.div(arcs_GG.amax(0) + length_G - 1, length_G, rounding_mode="floor").amax()
    level = torch.maximum(busiest, torch.div(fixed[-1] + total_M + num_gpus - 1, num_gpus, rounding_mode="floor"))
    # Step 2: room, the movable tokens positions <= q can take under the level; supply and due, the stream's
    # tokens started and due by q without the head and tail. Positions <= q take (`taken`)
    # A(q) = room(q) + min(0, min over k <= q of supply(k) + head + (tail if k >= a_w) - room(k)).
    room = torch.arange(1, num_gpus + 1, device=counts.device) * level - fixed
    supply = started - across * chain.from_tail_G
    due = ended - across * chain.from_head_end_G
    slack = supply - room
    tail = chain.from_tail_G.bool()
    before_tail, from_tail = prefix_minima(torch.stack(
        [torch.where(tail, _UNBOUNDED, slack), torch.where(tail, slack, _UNBOUNDED)]
    ), 1).unbind(0)
    # Every expert must be served by its last GPU: A(q) >= due(q) + (head if b_w <= q) + (tail if q == G-1). Where
    # the head is due and the tail not yet, that bounds the head from above; elsewhere, through before_tail, from
    # below. At the level of step 1 the least head meets the upper bounds too; it is clamped to [0, tokens across]
    # so that step 3 conserves tokens whatever happens.
    margin = room - due - torch.cat([torch.zeros_like(room[1:]), across[None]])
    least = torch.where(chain.head_due_G, -_UNBOUNDED, -(before_tail + margin)).amax()
    head = least.clamp_min(0).minimum(across)
    taken = room + torch.minimum(torch.minimum(before_tail + head, from_tail + across), zero)
    # Step 3: GPU q takes the stream's range (taken[q-1], taken[q]]; each replica the overlap with its expert's.
    upto = take(taken, chain.pos_MY)
    after = torch.where(chain.pos_MY > 0, taken[(chain.pos_MY - 1).clamp_min(0)], 0)
    begin_M1 = (head + supply[chain.start_M] - tokens_M)[:, None]
    others_end = supply[-1]
    begin = torch.where(chain.piece_MY == 1, 0, torch.where(chain.piece_MY == 2, head + others_end, begin_M1))
    end = torch.where(chain.piece_MY == 1, head, torch.where(chain.piece_MY == 2, others_end + across,
                                                              begin_M1 + tokens_M[:, None]))
    share_MY = (torch.minimum(upto, end) - torch.maximum(after, begin)).clamp_min(0)
    rest_M1 = tokens_M[:, None] - torch.where(chain.last_MY, 0, share_MY).sum(1, keepdim=True)
    return torch.where(chain.last_MY, rest_M1, share_MY)


def chain_tables(graph: ReplicaGraph, num_experts: int, device) -> ChainTables | None:
    """The chain tables of a layer, or None unless there is a ring through all G GPUs along which every span class
    is an arc and no link (two GPUs next to each other on it) lies inside two classes' arcs. A class spanning all
    G GPUs is an arc only when it is the only class (it then starts at the ring's first GPU).

    The ring tried first is GPU order 0, 1, ..., G-1 (as the `cpsat` policy lays its chains out); failing that, the
    one order the classes force (`_forced_ring_order`), which finds the chain in a layout whose GPUs were
    relabelled, as a migration's realised placement is (`placement.migration` trades GPUs inside a node).
    """
    num_gpus = graph.num_gpus
    classes = _span_classes(graph.gpus_MY, num_gpus)
    found = _chain_on_ring(graph, np.arange(num_gpus), classes)
    if found is None:
        order_G = _forced_ring_order(graph, classes[0])
        if order_G is not None:
            rank_G = np.empty(num_gpus, dtype=np.int64)
            rank_G[order_G] = np.arange(num_gpus)
            found = _chain_on_ring(graph, rank_G, classes)
    if found is None:
        return None
    rank_G, arcs, rotation = found
    return _cut_ring_tables(graph, num_experts, device, arcs, rank_G, rotation)


def _span_classes(gpus_MY: np.ndarray, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """(classes_CY, class_M): the distinct rows of `gpus_MY` [M, Y] (each movable expert's GPUs ascending, padded
    with G) in ascending order, and each expert's row among them, as `np.unique(gpus_MY, axis=0,
    return_inverse=True)` gives; each row read as one base-(G + 1) number where that fits in int64 (a 1-D unique,
    several times quicker than one over rows)."""
    width = gpus_MY.shape[1]
    if width == 0 or (num_gpus + 1) ** width >= 2 ** 62:
        classes_CY, class_M = np.unique(gpus_MY, axis=0, return_inverse=True)
        return classes_CY, class_M.reshape(-1)
    key_M = (gpus_MY.astype(np.int64) * (num_gpus + 1) ** np.arange(width - 1, -1, -1, dtype=np.int64)).sum(axis=1)
    _, first_C, class_M = np.unique(key_M, return_index=True, return_inverse=True)
    return gpus_MY[first_C], class_M.reshape(-1)


def _chain_on_ring(graph: ReplicaGraph, rank_G: np.ndarray, classes: tuple[np.ndarray, np.ndarray]
                   ) -> tuple[np.ndarray, tuple, int] | None:
    """(rank_G, the class arcs, the rotation to cut at) when the layer is a chain on the ring that visits GPU g
    at position rank_G[g], else None; `classes` as `_span_classes` gives them."""
    arcs = _class_arcs(graph, rank_G, classes)
    if arcs is None:
        return None
    gpus_MY, class_M, span_M, start_M = arcs
    num_gpus = graph.num_gpus
    column = np.arange(gpus_MY.shape[1])
    inside_MY = column[None, :] < span_M[:, None] - 1  # link start + y lies inside the arc for y < span - 1
    cover_G = np.bincount(((start_M[:, None] + column[None, :]) % num_gpus)[inside_MY], minlength=num_gpus)
    if cover_G.max(initial=0) > 1:
        return None
    # Cut at a link no arc covers (the chain is then a path), else between the ring's last GPU and its first.
    uncovered = np.flatnonzero(cover_G == 0)
    rotation = (uncovered[0] + 1) % num_gpus if len(uncovered) else 0
    return rank_G, arcs, int(rotation)


def _forced_ring_order(graph: ReplicaGraph, classes_CY: np.ndarray) -> np.ndarray | None:
    """[G] int64, the GPUs in the ring order a chain layout's classes force, or None where they force none (the
    caller checks the order it gets, so a layout that is no chain is never taken for one).

    On a chain, a GPU inside a class's arc belongs to no other class, and two classes meet only at a GPU that ends
    both arcs; so every GPU lies in at most two classes, every class shares at most two of its GPUs, and the classes
    linked by shared GPUs form paths (or one cycle round the whole ring). Each path is walked from a class sharing
    at most one GPU: a class's GPUs are laid from the one it shares with the class before, through those it shares
    with none (in any order: they hold no other movable expert), to the one it shares with the class after. The
    paths follow one another, then the GPUs no movable expert spans.
    """
    num_gpus = graph.num_gpus
    classes = [[gpu for gpu in row if gpu < num_gpus] for row in classes_CY.tolist()]
    holders = [[] for _ in range(num_gpus)]
    for c, gpus in enumerate(classes):
        for gpu in gpus:
            holders[gpu].append(c)
    if any(len(held) > 2 for held in holders):
        return None
    shared = [[gpu for gpu in gpus if len(holders[gpu]) == 2] for gpus in classes]
    if any(len(gpus) > 2 for gpus in shared):
        return None
    order, laid = [], [False] * len(classes)
    path_ends = [c for c in range(len(classes)) if len(shared[c]) < 2]
    cycle_starts = [c for c in range(len(classes)) if len(shared[c]) == 2]
    for first in path_ends + cycle_starts:
        if laid[first]:
            continue
        # A path starts with nothing before it; a cycle enters its first class at one of its shared GPUs.
        entry = None if len(shared[first]) < 2 else shared[first][0]
        if entry is not None:
            order.append(entry)
        c = first
        while c is not None and not laid[c]:
            laid[c] = True
            exits = [gpu for gpu in shared[c] if gpu != entry]
            order.extend(gpu for gpu in classes[c] if gpu not in shared[c])
            order.extend(exits[:1])
            if not exits:
                break
            entry = exits[0]
            c = next((other for other in holders[entry] if other != c), None)
    order.extend(gpu for gpu in range(num_gpus) if not holders[gpu])
    order = list(dict.fromkeys(order))  # a cycle's last class exits at the GPU its first class entered at
    if len(order) != num_gpus:
        return None
    return np.asarray(order, dtype=np.int64)


def _class_arcs(
    graph: ReplicaGraph, rank_G: np.ndarray, classes: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The span classes (`classes`, as `_span_classes` gives them) of a layer's movable experts if each is an arc
    of the ring that visits GPU g at position rank_G[g], else None.

    Returns:
        gpus_MY: [M, Y] int64, each class's GPUs in ascending order, padded with G (M counts the classes).
        class_M: [M] int64, the class of each movable expert (M counts the movable experts).
        span_M: [M] int64, the GPUs each class spans.
        start_M: [M] int64, the ring position each class's arc starts at.
    """
    num_gpus = graph.num_gpus
    gpus_MY, class_M = classes  # rows are sorted: padding G last
    valid_MY = gpus_MY < num_gpus
    span_M = valid_MY.sum(axis=1)
    whole_ring = span_M >= num_gpus
    if num_gpus < 2 or (whole_ring.any() and len(span_M) > 1):
        return None
    # A class's positions, sorted, form an arc iff exactly one cyclic step between neighbours exceeds 1; the arc
    # starts after that step (a class on the whole ring has none and starts at position 0).
    ranked_MY = np.sort(np.where(valid_MY, rank_G[np.minimum(gpus_MY, num_gpus - 1)], num_gpus), axis=1)
    column = np.arange(gpus_MY.shape[1])
    next_MY = np.where(column[None, :-1] + 1 < span_M[:, None], ranked_MY[:, 1:], ranked_MY[:, :1] + num_gpus)
    next_MY = np.concatenate([next_MY, ranked_MY[:, :1] + num_gpus], axis=1)
    gap_MY = (next_MY - ranked_MY > 1) & valid_MY
    if ((gap_MY.sum(axis=1) != 1) & ~whole_ring).any():
        return None
    start_M = np.where(whole_ring, 0, next_MY[np.arange(len(span_M)), gap_MY.argmax(axis=1)] % num_gpus)
    return gpus_MY, class_M, span_M, start_M


def _cut_ring_tables(
    graph: ReplicaGraph, num_experts: int, device, arcs: tuple, rank_G: np.ndarray, rotation: int
) -> ChainTables:
    """The tables of the class arcs `arcs` (as `_class_arcs` returns them) on the ring that visits GPU g at
    position rank_G[g], cut before position `rotation`."""
    gpus_MY, class_M, span_M, start_M = arcs
    num_gpus = graph.num_gpus
    valid_MY = gpus_MY < num_gpus
    rows = np.arange(len(span_M))
    position_G = (rank_G - rotation) % num_gpus
    first_M = (start_M - rotation) % num_gpus
    across_M = first_M + span_M - 1 >= num_gpus
    last_M = (first_M + span_M - 1) % num_gpus
    tail_from = int(first_M[across_M][0]) if across_M.any() else num_gpus
    head_end = int(last_M[across_M][0]) if across_M.any() else num_gpus
    start_G = np.full(num_gpus, len(span_M))
    start_G[first_M] = rows
    end_G = np.full(num_gpus, len(span_M))
    end_G[last_M] = rows
    pos_MY = np.where(valid_MY, position_G[np.minimum(gpus_MY, num_gpus - 1)], num_gpus)
    piece_MY = np.where(across_M[:, None] & (pos_MY <= head_end), 1, 0)
    piece_MY[across_M[:, None] & (pos_MY >= tail_from) & valid_MY] = 2
    fixed_gpu = graph.fixed_gpu_E(none=-1)
    fixed = np.flatnonzero(fixed_gpu >= 0)
    position = np.arange(num_gpus)
    movable = np.arange(len(class_M))
    members_MW = grouped(class_M, movable, len(span_M), pad=len(class_M))
    rank_M = (members_MW[class_M] < movable[:, None]).sum(axis=1)  # members of its class before it
    before_MW = np.where(np.arange(members_MW.shape[1])[None, :] < rank_M[:, None], members_MW[class_M], len(class_M))
    as_int = lambda a: torch.as_tensor(a, dtype=torch.int64, device=device)  # noqa: E731
    return ChainTables(
        fixed_GW=as_int(grouped(position_G[fixed_gpu[fixed]], fixed, num_gpus, pad=num_experts)),
        start_G=as_int(start_G),
        end_G=as_int(end_G),
        from_tail_G=as_int(position >= tail_from),
        from_head_end_G=as_int(position >= head_end),
        head_due_G=torch.as_tensor((position >= head_end) & (position < num_gpus - 1), device=device),
        across_M=as_int(across_M),
        start_M=as_int(np.where(across_M, 0, first_M)),
        pos_MY=as_int(pos_MY),
        piece_MY=as_int(piece_MY),
        last_MY=torch.as_tensor(pos_MY == np.where(across_M, num_gpus - 1, last_M)[:, None], device=device),
        members_MW=as_int(members_MW),
        class_M=as_int(class_M),
        before_MW=as_int(before_MW),
    )
