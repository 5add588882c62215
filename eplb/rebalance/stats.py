"""What the rebalancer did on one rank: attempts, switches, failures, bytes moved, recoveries."""

from dataclasses import dataclass, field


@dataclass
class RebalanceStats:
    """What the rebalancer did on this rank (the loop's report keeps `vars()` of it). `attempts` counts refits,
    loads and burst patches started; `rebalances`, `switch_steps` and `lag_steps` only refits and loads."""

    rebalances: int = 0
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    bytes_received: int = 0  # weights received for rebalances and recoveries
    backup_bytes_at_start: int = 0  # weights received to build the host copies at start
    switch_steps: list[int] = field(default_factory=list)
    lag_steps: list[int] = field(default_factory=list)  # from the end of the fit window to the switch
    lag_seconds: list[float] = field(default_factory=list)
    kept: int = 0  # attempts whose fit gained less than min_gain: the placement serving kept serving
    expert_moves: list[int] = field(default_factory=list)  # per switch: slots filled from another slot or rank
    oblivious_moves: list[int] = field(default_factory=list)  # per switch: slots a slot-by-slot remap would fill
    recoveries: list[dict] = field(default_factory=list)
    patches: int = 0  # burst patches switched to (not counted in `rebalances`)
    patch_steps: list[int] = field(default_factory=list)
    patch_lag_steps: list[int] = field(default_factory=list)  # from its start (after the steps it saw) to its switch
    patch_slots: list[int] = field(default_factory=list)  # per patch: slots filled from another slot or rank (rank 0)
    patch_broadcast_steps: list[int] = field(default_factory=list)  # per patch: the step its answer was broadcast at
    patch_moving_steps: list[int] = field(default_factory=list)  # per patch: `Attempt.moving_steps`
    patch_early_layers: list[int] = field(default_factory=list)  # per patch: layers switched before its last switch
    early_layer_switches: int = 0  # layers patches switched as their weights landed, those of failed patches too

    def record_switch(self, step: int, fit_step: int, seconds: float, moves: tuple[int, int] | None) -> None:
        """Count a switch at `step` of an attempt started at `fit_step`, `seconds` after its start; `moves`:
        (experts moved, experts a slot-by-slot remap would move), known on rank 0 only (None elsewhere)."""
        self.rebalances += 1
        self.switch_steps.append(step)
        self.lag_steps.append(step - fit_step)
        self.lag_seconds.append(seconds)
        if moves:
            self.expert_moves.append(moves[0])
            self.oblivious_moves.append(moves[1])

    def record_patch(self, step: int, fit_step: int, moves: tuple[int, int] | None, broadcast_step: int,
                     moving_steps: int, early_layers: int) -> None:
        """Count a burst patch switched to at `step`, started at `fit_step`, its answer broadcast at
        `broadcast_step`, its rounds and tables done `moving_steps` steps after, `early_layers` of its layers
        switched before `step` as their weights landed; `moves` as in `record_switch`."""
        self.patches += 1
        self.patch_steps.append(step)
        self.patch_lag_steps.append(step - fit_step)
        self.patch_broadcast_steps.append(broadcast_step)
        self.patch_moving_steps.append(moving_steps)
        self.patch_early_layers.append(early_layers)
        if moves:
            self.patch_slots.append(moves[0])
