"""The exact whole-token split of a chain layout: the least busiest GPU, in a fixed number of vector operations.

Legend: E logical experts, G GPUs, M experts spanning two or more GPUs (movable), X the most GPUs one expert spans,
F the most one-GPU experts on a GPU, Q positions along the ring of GPUs (G of them).

Movable experts that span the same GPUs are interchangeable, so they are split as one (their span class, C of
them) and the class's split is then laid over its members in order. When every class's GPUs are consecutive on the
ring 0, 1, ..., G-1, 0 and no two classes share a pair of neighbouring GPUs (a link), as in the `cpsat` policy's
chain layouts and in every 2-GPU layout, the best whole-token split is computed in a fixed number of vector
operations, with no rounds (steps 1-3 on the classes, step 4 to the experts):
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
    """One layer's chain layout of span classes (indexed by c; below "expert" means a class), by position q along
    the cut ring: position q is GPU (q + rotation) % G, where the
    ring is cut between positions G-1 and 0. At most one expert lies across the cut: its tail runs from position
    a_w to G-1, its head from 0 to b_w (a_w = b_w = G when none does).

    Attributes:
        fixed_QF: [G, F] int64, the one-GPU experts at each position, padded with E (a sink with no tokens).
        start_Q: [G] int64, the movable expert (index into movable_M) that starts at each position, M if none; the
            expert across the cut starts at a_w.
        end_Q: [G] int64, the movable expert that ends at each position, M if none; the expert across the cut
            ends at b_w.
        from_tail_Q: [G] int64, 1 at positions >= a_w.
        from_head_end_Q: [G] int64, 1 at positions >= b_w.
        head_due_Q: [G] bool, b_w <= q < G-1: the positions by which the head is due and the tail not yet.
        across_M: [M] int64, 1 for the expert across the cut.
        start_M: [M] int64, the position each movable expert starts at (0 for the one across the cut: its head).
        pos_MX: [M, X] int64, the position of GPU gpus_MX[m, x], G on padding.
        piece_MX: [M, X] int64, 1 on the head of the expert across the cut, 2 on its tail, else 0.
        last_MX: [M, X] bool, the last GPU of each expert along the stream (of the tail, for the one across the
            cut): it takes what the others leave.
        members_CK: [C, K] int64, the movable experts (index into movable_M) of each class in ascending order,
            padded with M; the tables above index classes (their M is C).
        class_M: [M] int64, the class of each movable expert.
        before_MK: [M, K] int64, the members of the same class that come before each expert, padded with M.
    """

    fixed_QF: torch.Tensor
    start_Q: torch.Tensor
    end_Q: torch.Tensor
    from_tail_Q: torch.Tensor
    from_head_end_Q: torch.Tensor
    head_due_Q: torch.Tensor
    across_M: torch.Tensor
    start_M: torch.Tensor
    pos_MX: torch.Tensor
    piece_MX: torch.Tensor
    last_MX: torch.Tensor
    members_CK: torch.Tensor
    class_M: torch.Tensor
    before_MK: torch.Tensor


def chain_split(counts: torch.Tensor, movable_M: torch.Tensor, num_gpus: int, chain: ChainTables) -> torch.Tensor:
    """[M, X] int64, the whole-token split of a chain layout with the least busiest GPU (module docstring), from
    counts [E] int64 and the layer's movable experts movable_M [M]."""
    tokens_M = counts[movable_M]
    whole_CX = _class_split(counts, take(tokens_M, chain.members_CK).sum(1), num_gpus, chain)
    # Step 4: member m's range on its class's line starts after the members before it.
    begin_M1 = take(tokens_M, chain.before_MK).sum(1, keepdim=True)
    gpu_end_MX = prefix_sums(whole_CX, 1)[chain.class_M]
    gpu_begin_MX = gpu_end_MX - whole_CX[chain.class_M]
    end_MX = torch.minimum(gpu_end_MX, begin_M1 + tokens_M[:, None])
    return (end_MX - torch.maximum(gpu_begin_MX, begin_M1)).clamp_min(0)


def _class_split(counts: torch.Tensor, tokens_M: torch.Tensor, num_gpus: int, chain: ChainTables) -> torch.Tensor:
    """Steps 1-3 on the span classes: [C, X] int64 from counts [E] (one-GPU experts) and the classes' tokens
    tokens_M [C] (here M names the classes). Prefix sums are inclusive and run along the cut ring unless they say
    otherwise."""
    zero = counts.new_zeros(1)
    total_M = tokens_M.sum()
    across = (tokens_M * chain.across_M).sum()  # tokens of the expert across the cut
    # One scan: one-GPU tokens, movable tokens by the position their expert starts at and by where it ends.
    fixed, started, ended = prefix_sums(torch.stack(
        [take(counts, chain.fixed_QF).sum(1), take(tokens_M, chain.start_Q), take(tokens_M, chain.end_Q)]
    ), 1).unbind(0)
    # Step 1: on the ring unrolled twice, with prefixes exclusive (index q sums positions < q), arc [i, i + l) holds
    # fixed2[i + l] - fixed2[i] one-GPU tokens and the movable experts inside it: the copies ending before i + l
    # less those starting before i (copies in start order also end in order, so those are a prefix of these). The
    # expert across the cut has a copy starting before position 0 and ending at b_w.
    fixed2 = torch.cat([zero, fixed, fixed[-1] + fixed])
    ended2 = torch.cat([zero, ended, total_M + ended])
    started2 = across + torch.cat([zero, started, total_M + started])
    windows = num_gpus - 1
    arcs_QL = (fixed2[1:].unfold(0, windows, 1)[:num_gpus] - fixed2[:num_gpus, None]
               + (ended2[1:].unfold(0, windows, 1)[:num_gpus] - started2[:num_gpus, None]).clamp_min(0))
    length_L = torch.arange(1, num_gpus, device=counts.device)
    busiest = torch.div(arcs_QL.amax(0) + length_L - 1, length_L, rounding_mode="floor").amax()
    level = torch.maximum(busiest, torch.div(fixed[-1] + total_M + num_gpus - 1, num_gpus, rounding_mode="floor"))
    # Step 2: room, the movable tokens positions <= q can take under the level; supply and due, the stream's
    # tokens started and due by q without the head and tail. Positions <= q take (`taken`)
    # A(q) = room(q) + min(0, min over k <= q of supply(k) + head + (tail if k >= a_w) - room(k)).
    room = torch.arange(1, num_gpus + 1, device=counts.device) * level - fixed
    supply = started - across * chain.from_tail_Q
    due = ended - across * chain.from_head_end_Q
    slack = supply - room
    tail = chain.from_tail_Q.bool()
    before_tail, from_tail = prefix_minima(torch.stack(
        [torch.where(tail, _UNBOUNDED, slack), torch.where(tail, slack, _UNBOUNDED)]
    ), 1).unbind(0)
    # Every expert must be served by its last GPU: A(q) >= due(q) + (head if b_w <= q) + (tail if q == G-1). Where
    # the head is due and the tail not yet, that bounds the head from above; elsewhere, through before_tail, from
    # below. At the level of step 1 the least head meets the upper bounds too; it is clamped to [0, tokens across]
    # so that step 3 conserves tokens whatever happens.
    margin = room - due - torch.cat([torch.zeros_like(room[1:]), across[None]])
    least = torch.where(chain.head_due_Q, -_UNBOUNDED, -(before_tail + margin)).amax()
    head = least.clamp_min(0).minimum(across)
    taken = room + torch.minimum(torch.minimum(before_tail + head, from_tail + across), zero)
    # Step 3: GPU q takes the stream's range (taken[q-1], taken[q]]; each replica the overlap with its expert's.
    upto = take(taken, chain.pos_MX)
    after = torch.where(chain.pos_MX > 0, taken[(chain.pos_MX - 1).clamp_min(0)], 0)
    begin_M1 = (head + supply[chain.start_M] - tokens_M)[:, None]
    others_end = supply[-1]
    begin = torch.where(chain.piece_MX == 1, 0, torch.where(chain.piece_MX == 2, head + others_end, begin_M1))
    end = torch.where(chain.piece_MX == 1, head, torch.where(chain.piece_MX == 2, others_end + across,
                                                              begin_M1 + tokens_M[:, None]))
    share_MX = (torch.minimum(upto, end) - torch.maximum(after, begin)).clamp_min(0)
    rest_M1 = tokens_M[:, None] - torch.where(chain.last_MX, 0, share_MX).sum(1, keepdim=True)
    return torch.where(chain.last_MX, rest_M1, share_MX)


def chain_tables(graph: ReplicaGraph, num_experts: int, device) -> ChainTables | None:
    """The chain tables of a layer, or None unless every span class is an arc of the ring and no link (GPU q,
    GPU q + 1) lies inside two classes' arcs. A class spanning all G GPUs is an arc only when it is the only class
    (it then starts at GPU 0)."""
    num_gpus = graph.num_gpus
    gpus_CX, class_M = np.unique(graph.gpus_MX, axis=0, return_inverse=True)  # rows are sorted: padding G last
    class_M = class_M.reshape(-1)
    valid_MX = gpus_CX < num_gpus
    span_M = valid_MX.sum(axis=1)
    whole_ring = span_M >= num_gpus
    if num_gpus < 2 or (whole_ring.any() and len(span_M) > 1):
        return None
    # A class's GPUs, sorted, form an arc iff exactly one cyclic step between neighbours exceeds 1; the arc
    # starts after that step (a class on the whole ring has none and starts at GPU 0).
    column = np.arange(gpus_CX.shape[1])
    next_MX = np.where(column[None, :-1] + 1 < span_M[:, None], gpus_CX[:, 1:], gpus_CX[:, :1] + num_gpus)
    next_MX = np.concatenate([next_MX, gpus_CX[:, :1] + num_gpus], axis=1)
    gap_MX = (next_MX - gpus_CX > 1) & valid_MX
    if ((gap_MX.sum(axis=1) != 1) & ~whole_ring).any():
        return None
    rows = np.arange(len(span_M))
    start_M = np.where(whole_ring, 0, next_MX[rows, gap_MX.argmax(axis=1)] % num_gpus)
    inside_MX = column[None, :] < span_M[:, None] - 1  # link start + x lies inside the arc for x < span - 1
    cover_Q = np.bincount(((start_M[:, None] + column[None, :]) % num_gpus)[inside_MX], minlength=num_gpus)
    if cover_Q.max(initial=0) > 1:
        return None
    # Cut at a link no arc covers (the chain is then a path), else between GPUs G-1 and 0.
    uncovered = np.flatnonzero(cover_Q == 0)
    rotation = (uncovered[0] + 1) % num_gpus if len(uncovered) else 0
    position_G = (np.arange(num_gpus) - rotation) % num_gpus
    first_M = (start_M - rotation) % num_gpus
    across_M = first_M + span_M - 1 >= num_gpus
    last_M = (first_M + span_M - 1) % num_gpus
    tail_from = int(first_M[across_M][0]) if across_M.any() else num_gpus
    head_end = int(last_M[across_M][0]) if across_M.any() else num_gpus
    start_Q = np.full(num_gpus, len(span_M))
    start_Q[first_M] = rows
    end_Q = np.full(num_gpus, len(span_M))
    end_Q[last_M] = rows
    pos_MX = np.where(valid_MX, position_G[np.minimum(gpus_CX, num_gpus - 1)], num_gpus)
    piece_MX = np.where(across_M[:, None] & (pos_MX <= head_end), 1, 0)
    piece_MX[across_M[:, None] & (pos_MX >= tail_from) & valid_MX] = 2
    fixed_gpu = graph.fixed_gpu_E(none=-1)
    fixed = np.flatnonzero(fixed_gpu >= 0)
    position = np.arange(num_gpus)
    movable = np.arange(len(class_M))
    members_CK = grouped(class_M, movable, len(span_M), pad=len(class_M))
    rank_M = (members_CK[class_M] < movable[:, None]).sum(axis=1)  # members of its class before it
    before_MK = np.where(np.arange(members_CK.shape[1])[None, :] < rank_M[:, None], members_CK[class_M], len(class_M))
    as_int = lambda a: torch.as_tensor(a, dtype=torch.int64, device=device)  # noqa: E731
    return ChainTables(
        fixed_QF=as_int(grouped(position_G[fixed_gpu[fixed]], fixed, num_gpus, pad=num_experts)),
        start_Q=as_int(start_Q),
        end_Q=as_int(end_Q),
        from_tail_Q=as_int(position >= tail_from),
        from_head_end_Q=as_int(position >= head_end),
        head_due_Q=torch.as_tensor((position >= head_end) & (position < num_gpus - 1), device=device),
        across_M=as_int(across_M),
        start_M=as_int(np.where(across_M, 0, first_M)),
        pos_MX=as_int(pos_MX),
        piece_MX=as_int(piece_MX),
        last_MX=torch.as_tensor(pos_MX == np.where(across_M, num_gpus - 1, last_M)[:, None], device=device),
        members_CK=as_int(members_CK),
        class_M=as_int(class_M),
        before_MK=as_int(before_MK),
    )
