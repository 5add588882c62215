"""The rebalancer's per-step message: what each rank tells the others with every decode step, and the phases.

Legend: G ranks (one GPU each).

Each step every rank sends one small int64 message along with its expert counts in the first layer's all-gather
(`MoEDecodeLayer.piggyback`, which the layer runs anyway), and at the next step every rank reads the same [G, F]
messages ([G, len(Field)]) and takes the same decision: agreeing costs no collective. Only rank 0's
`SOLVE_STATUS`, `NUM_FILLS` and `NUM_CHUNKS` are read (rank 0 solves); the other fields are read on every rank.
"""

from enum import IntEnum, StrEnum


class Phase(StrEnum):
    """Where a rank is in a rebalance (`Rebalancer.phase`)."""

    IDLE = "idle"  # serving; an attempt starts at the interval or on drift
    SOLVING = "solving"  # waiting on the background solve
    MOVING = "moving"  # weights in flight, then the switch


class SolveStatus(IntEnum):
    """Rank 0's view of the background solve, sent in its message."""

    RUNNING = 0  # running, or no solve on this step
    DONE = 1  # an answer to broadcast: a new placement and its weight moves
    FAILED = 2  # the policy raised, the helper ended, or the solve ran past `solve_timeout_s`
    KEPT = 3  # done, and the fit gains less than `min_gain`: nothing worth moving


class Field(IntEnum):
    """The columns of the per-step message, in order."""

    ATTEMPT = 0  # the sender's count of attempts so far (a message about another attempt is stale)
    SOLVE_STATUS = 1  # a `SolveStatus` (rank 0's counts)
    TRANSFERS_OK = 2  # 1 while every weight transfer of this attempt succeeded on the sender
    ACCEPTS_SWITCH = 3  # 1 when the sender accepts a switch at the next step
    DRIFTED = 4  # 1 when the sender's drift check fired: start an attempt at once
    NUM_FILLS = 5  # U, the fills in rank 0's answer (what the others allocate for its broadcast)
    NUM_CHUNKS = 6  # C, the chunks in rank 0's answer


def message(attempt: int, status: SolveStatus, answer_sizes: tuple[int, int], *, transfers_ok: bool,
            accepts_switch: bool, drifted: bool) -> list[int]:
    """One rank's message, `len(Field)` ints ordered by `Field`; `answer_sizes`: (fills, chunks) of rank 0's answer."""
    values = {Field.ATTEMPT: attempt, Field.SOLVE_STATUS: status, Field.TRANSFERS_OK: transfers_ok,
              Field.ACCEPTS_SWITCH: accepts_switch, Field.DRIFTED: drifted, Field.NUM_FILLS: answer_sizes[0],
              Field.NUM_CHUNKS: answer_sizes[1]}
    return [int(values[field]) for field in Field]
