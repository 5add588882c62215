"""Card failures in the fleet run, and how a stage rides them out.

Failures arrive as a Poisson process per serving card. A failed card's unit either goes on without it (reroute,
as the live `Rebalancer` recovers: its experts' share moves to surviving replicas, lost experts come back from host
memory, its sequences are re-queued and re-prefilled) and a spare card takes its place after `spare_swap_s`
(without a free spare the unit runs one card short until the repair); or the whole unit restarts (restart), down
for `restart_s` (until the repair when no spare is free), every sequence on it re-queued. A spare stays in use until
the failed card is repaired. Nothing is dropped: re-queued work goes back to prefill.
"""

import heapq
from dataclasses import dataclass, field

import numpy as np

from sim.fleet.config import FaultConfig


@dataclass
class FaultEvent:
    """One card failure: when, at which stage, how it was handled, whether a spare covered it, and the sequences
    it sent back to prefill."""

    time_s: float
    stage: str
    handling: str
    spare_used: bool
    sequences_requeued: float


@dataclass
class Faults:
    """Outages in progress and spare cards in use, per stage.

    Both are heaps ordered by when they end, with a count per stage beside them, so that a look-up costs the
    entries that ended since the last one, not every outage in progress. An outage takes `_units_per_outage` of
    its stage's units away until it ends."""

    config: FaultConfig
    cards_per_unit: dict[str, int]
    cards_per_node: int
    rng: np.random.Generator
    outages: list[tuple[float, str]] = field(default_factory=list)  # heap of (until, stage)
    spares_busy: list[tuple[float, str]] = field(default_factory=list)  # heap of (repaired at, stage)
    events: list[FaultEvent] = field(default_factory=list)
    _outages_at: dict[str, int] = field(default_factory=dict)  # outages in progress per stage
    _spares_busy_at: dict[str, int] = field(default_factory=dict)  # spare cards in use per stage

    def spares_free(self, stage: str, now_s: float) -> int:
        _expire(self.spares_busy, self._spares_busy_at, now_s)
        return self.config.spare_nodes.get(stage, 0) * self.cards_per_node - self._spares_busy_at.get(stage, 0)

    def units_lost(self, stage: str, now_s: float) -> float:
        """Capacity lost at `stage` now, in units."""
        _expire(self.outages, self._outages_at, now_s)
        return self._outages_at.get(stage, 0) * self._units_per_outage(stage)

    def _units_per_outage(self, stage: str) -> float:
        """Units one failure takes away: its card (reroute) or its whole unit (restart)."""
        return 1.0 / self.cards_per_unit[stage] if self.config.handling == "reroute" else 1.0

    def step(self, now_s: float, step_s: float, serving_cards: dict[str, int],
             sequences_per_card: dict[str, float]) -> tuple[dict[str, int], dict[str, float]]:
        """Failures during one step: (failures, sequences re-queued), per stage."""
        config = self.config
        failures = dict.fromkeys(serving_cards, 0)
        requeued = dict.fromkeys(serving_cards, 0.0)
        rate = config.card_failures_per_hour * config.failure_multiplier * step_s / 3600.0
        for stage, cards in serving_cards.items():
            for _ in range(int(self.rng.poisson(rate * cards)) if cards else 0):
                spare = self.spares_free(stage, now_s) > 0
                repaired = now_s + config.repair_hours * 3600.0
                if spare:
                    _start(self.spares_busy, self._spares_busy_at, repaired, stage)
                if config.handling == "reroute":
                    until = now_s + config.spare_swap_s if spare else repaired
                    sequences = sequences_per_card[stage]
                else:
                    until = now_s + config.restart_s if spare else repaired
                    sequences = sequences_per_card[stage] * self.cards_per_unit[stage]
                _start(self.outages, self._outages_at, until, stage)
                failures[stage] += 1
                requeued[stage] += sequences
                self.events.append(FaultEvent(now_s, stage, config.handling, spare, sequences))
        return failures, requeued


def _start(heap: list[tuple[float, str]], count: dict[str, int], until_s: float, stage: str) -> None:
    """Add an entry of `stage` lasting until `until_s`."""
    heapq.heappush(heap, (until_s, stage))
    count[stage] = count.get(stage, 0) + 1


def _expire(heap: list[tuple[float, str]], count: dict[str, int], now_s: float) -> None:
    """Drop the entries that ended by `now_s` (an entry lasts while its end is later than now)."""
    while heap and heap[0][0] <= now_s:
        _, stage = heapq.heappop(heap)
        count[stage] -= 1
