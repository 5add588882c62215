"""Card failures in the fleet run, and how a stage rides them out.

Failures arrive as a Poisson process per serving card. A failed card's unit either goes on without it (reroute,
issue 6's mechanism: its experts' share moves to surviving replicas, lost experts come back from host memory, its
sequences are re-queued and re-prefilled) and a spare card takes its place after `spare_swap_s` (without a free
spare the unit runs one card short until the repair); or the whole unit restarts (restart), down for `restart_s`
(until the repair when no spare is free), every sequence on it re-queued. A spare stays in use until the failed
card is repaired. Nothing is dropped: re-queued work goes back to prefill.
"""

from dataclasses import dataclass, field

import numpy as np

from sim.fleet_config import FaultConfig


@dataclass
class FaultEvent:
    time_s: float
    stage: str
    handling: str
    spare_used: bool
    sequences_requeued: float


@dataclass
class Faults:
    """Outages in progress (unit-equivalents of capacity lost, until when) and spare cards in use."""

    config: FaultConfig
    cards_per_unit: dict[str, int]
    cards_per_node: int
    rng: np.random.Generator
    outages: list[tuple[float, str, float]] = field(default_factory=list)  # (until, stage, units lost)
    spares_busy: list[tuple[float, str]] = field(default_factory=list)  # (repaired at, stage)
    events: list[FaultEvent] = field(default_factory=list)

    def spares_free(self, stage: str, now_s: float) -> int:
        self.spares_busy = [item for item in self.spares_busy if item[0] > now_s]
        busy = sum(1 for _, where in self.spares_busy if where == stage)
        return self.config.spare_nodes.get(stage, 0) * self.cards_per_node - busy

    def units_lost(self, stage: str, now_s: float) -> float:
        """Capacity lost at `stage` now, in units."""
        self.outages = [item for item in self.outages if item[0] > now_s]
        return sum(lost for _, where, lost in self.outages if where == stage)

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
                    self.spares_busy.append((repaired, stage))
                if config.handling == "reroute":
                    until = now_s + config.spare_swap_s if spare else repaired
                    lost, sequences = 1.0 / self.cards_per_unit[stage], sequences_per_card[stage]
                else:
                    until = now_s + config.restart_s if spare else repaired
                    lost, sequences = 1.0, sequences_per_card[stage] * self.cards_per_unit[stage]
                self.outages.append((until, stage, lost))
                failures[stage] += 1
                requeued[stage] += sequences
                self.events.append(FaultEvent(now_s, stage, config.handling, spare, sequences))
        return failures, requeued
