"""When the live rebalancer's next refit is due: the same decision on every rank, from what every rank sees."""


class RefitClock:
    """Steps since the last refit attempt, and whether one was asked for (a request, or drift any rank saw).

    Args:
        interval: steps from one refit attempt to the next.
    """

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.steps_since_attempt = 0  # steps with no refit under way since the last refit attempt
        self.requested = False

    @property
    def due(self) -> bool:
        """A refit is due: asked for, or `interval` steps since the last attempt."""
        return self.requested or self.steps_since_attempt >= self.interval

    def tick(self) -> None:
        """A step with no refit under way."""
        self.steps_since_attempt += 1

    def request(self) -> None:
        """Start a refit at the first step that may start one."""
        self.requested = True

    def started(self) -> None:
        """A refit attempt started."""
        self.requested, self.steps_since_attempt = False, 0

    def ended(self) -> None:
        """A refit attempt ended without a switch (kept or failed): the next one comes an interval later."""
        self.steps_since_attempt = 0
