"""When the live rebalancer's patches start: the same decisions on every rank, from what every rank sees.

A patch is due `every` steps after the last one started, while no refit is under way. While a patch's weights move,
the next patch's job starts from its target, timed so that rank 0 reports it done the step before that patch's
switch if it takes as long as the last job took to its broadcast: it then becomes the attempt at the switch and its
answer is broadcast in that very step, so a patch of R rounds follows the last every R + 1 steps on the freshest load
that lets it be ready then. Every rank knows the rounds and the answers' steps, so every rank reaches the same
decisions without a collective.
"""


class PatchClock:
    """The patches' timing on one rank (identical on every rank).

    Args:
        every: the least steps from one patch's start to the next.
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.steps_since_start = 0  # steps with no refit under way since the last patch started
        self.queue_at: int | None = None  # the step the next patch's job is to start while the last one moves
        self.queued_step: int | None = None  # the step that queued job started at
        self.job_steps: int | None = None  # steps the last patch job took to its answer, as every rank saw

    @property
    def due(self) -> bool:
        """A patch is due (`every` steps since the last one started)."""
        return self.steps_since_start >= self.every

    def tick(self) -> None:
        """A step with no refit under way."""
        self.steps_since_start += 1

    def started(self) -> None:
        """A patch's job started now (as an attempt)."""
        self.steps_since_start = 0

    def broadcast(self, step: int, started_step: int, moving_steps: int, queued: bool, switched_now: bool) -> bool:
        """A patch's answer was broadcast at `step` (its job started at `started_step`, its weights move for
        `moving_steps` steps, `queued`: its job started while the patch before it moved, `switched_now`: that patch
        switched at this step). Learns the job's steps and schedules the next job; True when it starts now.

        A queued job whose answer was taken at the switch may have waited for it, so it only lowers the estimate; one
        taken after the switch was late and sets it."""
        seen = step - started_step
        waited = queued and switched_now
        self.job_steps = min(self.job_steps, seen) if waited and self.job_steps is not None else seen
        self.queue_at = step + max(0, moving_steps + 1 - self.job_steps)
        return self.queue_at == step

    def queue_due(self, step: int) -> bool:
        """The next patch's job is due to start now, while the last one moves."""
        return self.queue_at is not None and self.queue_at <= step

    def queued(self, step: int) -> None:
        """The next patch's job started at `step`, while the last one moves."""
        self.queue_at, self.queued_step = None, step

    def take_queued(self, step: int) -> int | None:
        """At a patch's switch (`step`): the step the queued job started at, which becomes the attempt (None: none
        was queued)."""
        queued, self.queue_at, self.queued_step = self.queued_step, None, None
        if queued is not None:
            self.steps_since_start = step - queued
        return queued

    def drop(self) -> None:
        """The patch moving failed: the job queued from its target is dropped."""
        self.queue_at = self.queued_step = None

    @property
    def job_queued(self) -> bool:
        """A queued job is solving (rank 0's message is about it while the patch before it moves)."""
        return self.queued_step is not None
