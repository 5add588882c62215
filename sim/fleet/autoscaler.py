"""The autoscaler: moves nodes between prefill and decode as the traffic moves, and grows or shrinks the
fleet within its quota.

Every `interval_s` it sizes each stage for the load it is given (whole units: a prefill instance, a decode EP unit,
at `target_utilisation`), then, in this order: moves surplus nodes of one stage to the other (they serve after
`move_s`), asks for new nodes for what is still missing (after `grow_s`, never past `quota_nodes`), and releases
what is still surplus, only once the surplus has lasted `shrink_after_s` and never while quota use, the nodes the
load needs now (the stages' targets and the spares) over `quota_nodes`, is above `shrink_quota_threshold`: near
the quota a released node may not come back when the load does. (Read as the nodes held instead, the rule would
ratchet: one burst past the threshold and the fleet could never shrink again.) The fleet's first sizing, which may
ask for any number of nodes, is cut to the quota by `within_quota`.
"""

import math
from dataclasses import dataclass, field

from sim.fleet.config import AutoscalerConfig

STAGES = ("prefill", "decode")


@dataclass
class Decision:
    """What one decision did (nodes), and the quota use it saw."""

    time_s: float
    target: dict[str, int]
    moved: dict[str, int]  # nodes sent to each stage from the other
    grown: dict[str, int]
    released: dict[str, int]
    quota_use: float


@dataclass
class Autoscaler:
    """The fleet's nodes per stage: serving now, and on their way (moving or newly added) with their ready times."""

    config: AutoscalerConfig
    unit_nodes: dict[str, int]
    serving: dict[str, int]
    reserved: int = 0  # nodes held outside the stages (spares): they count against the quota
    pending: list[tuple[float, str, int]] = field(default_factory=list)  # (ready at, stage, nodes)
    surplus_since: float | None = None
    decisions: list[Decision] = field(default_factory=list)

    @property
    def held(self) -> int:
        """Nodes the fleet holds: serving, moving, arriving and reserved."""
        return sum(self.serving.values()) + sum(nodes for _, _, nodes in self.pending) + self.reserved

    def incoming(self, stage: str) -> int:
        """Nodes on their way to `stage` (moving or newly added)."""
        return sum(nodes for _, to, nodes in self.pending if to == stage)

    def advance(self, now_s: float) -> None:
        """Nodes whose move or arrival is done start serving."""
        ready = [item for item in self.pending if item[0] <= now_s]
        self.pending = [item for item in self.pending if item[0] > now_s]
        for _, stage, nodes in ready:
            self.serving[stage] += nodes

    def target_nodes(self, stage: str, needed_nodes: float) -> int:
        """Whole units of `stage` covering `needed_nodes` at the target utilisation, at least the stage's minimum."""
        unit = self.unit_nodes[stage]
        least = self.config.min_prefill_nodes if stage == "prefill" else self.config.min_decode_nodes
        units = math.ceil(max(needed_nodes / self.config.target_utilisation, least) / unit - 1e-9)
        return units * unit

    def decide(self, now_s: float, needed_nodes: dict[str, float]) -> Decision:
        """One decision from the nodes each stage needs at full utilisation (load over one node's capacity)."""
        config = self.config
        self.advance(now_s)
        target = {stage: self.target_nodes(stage, needed_nodes[stage]) for stage in STAGES}
        have = {stage: self.serving[stage] + self.incoming(stage) for stage in STAGES}
        gap = {stage: target[stage] - have[stage] for stage in STAGES}  # > 0: missing, < 0: surplus
        moved = dict.fromkeys(STAGES, 0)
        for receiver, giver in (("prefill", "decode"), ("decode", "prefill")):
            nodes = min(max(gap[receiver], 0), max(-gap[giver], 0), self.serving[giver])
            if nodes:
                self.serving[giver] -= nodes
                self.pending.append((now_s + config.move_s, receiver, nodes))
                gap[receiver] -= nodes
                gap[giver] += nodes
                moved[receiver] = nodes
        grown = dict.fromkeys(STAGES, 0)
        for stage in STAGES:
            room = config.quota_nodes - self.held
            nodes = min(max(gap[stage], 0), room - room % self.unit_nodes[stage])  # whole units within the quota
            if nodes > 0:
                self.pending.append((now_s + config.grow_s, stage, nodes))
                grown[stage] = nodes
        quota_use = (sum(target.values()) + self.reserved) / config.quota_nodes
        released = dict.fromkeys(STAGES, 0)
        surplus = {stage: min(max(-gap[stage], 0), self.serving[stage]) for stage in STAGES}
        if any(surplus.values()):
            self.surplus_since = now_s if self.surplus_since is None else self.surplus_since
            if now_s - self.surplus_since >= config.shrink_after_s and quota_use <= config.shrink_quota_threshold:
                for stage in STAGES:
                    self.serving[stage] -= surplus[stage]
                    released[stage] = surplus[stage]
                self.surplus_since = None
        else:
            self.surplus_since = None
        decision = Decision(now_s, target, moved, grown, released, quota_use)
        self.decisions.append(decision)
        return decision


def within_quota(nodes: dict[str, int], unit_nodes: dict[str, int], room: int) -> dict[str, int]:
    """`nodes` per stage, cut unit by unit from the larger stage (the first on a tie) until they fit in `room` nodes
    or the larger stage is down to one unit.

    Cutting always the larger stage takes the stages' successive sizes in decreasing order, so every cut from a
    size above a level comes before any cut from a size at or below it. The cuts above the lowest level (no lower
    than any unit, so that no stage reaches its last unit on the way) that still leaves the stages over the room
    are therefore made at once, the level found by bisection; the few cuts left are made one by one. However far
    the load's nodes exceed the room, this takes a few dozen turns."""
    nodes = dict(nodes)
    if sum(nodes.values()) > room:
        low, high = max(unit_nodes.values()), max(nodes.values())
        if sum(_cut_above(nodes, unit_nodes, low).values()) > room:
            high = low
        while high - low > 1:  # cutting above `low` fits the room, cutting above `high` does not
            middle = (low + high) // 2
            fits = sum(_cut_above(nodes, unit_nodes, middle).values()) <= room
            low, high = (middle, high) if fits else (low, middle)
        nodes = _cut_above(nodes, unit_nodes, high)
    while sum(nodes.values()) > room:
        stage = max(nodes, key=nodes.get)
        if nodes[stage] <= unit_nodes[stage]:
            break
        nodes[stage] -= unit_nodes[stage]
    return nodes


def _cut_above(nodes: dict[str, int], unit_nodes: dict[str, int], level: int) -> dict[str, int]:
    """`nodes` with whole units cut from each stage while it is above `level`."""
    return {stage: n - max(0, -(-(n - level) // unit_nodes[stage])) * unit_nodes[stage] for stage, n in nodes.items()}
