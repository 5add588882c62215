"""The refit-on-drift trigger of a running group: has the traffic drifted from what the serving placement fits?

Legend: L layers, P slots of the group, T steps served since the last switch.

Each step the rebalancer notes the step's planned imbalance (max / mean tokens over the GPUs, mean over layers) and
every `drift_check_every` steps asks whether a recent step was more imbalanced than `refit_on_drift` x the
placement's level: its fitted imbalance on the window it was fitted on, or, for a placement with none (the one at
start, or one loaded from a file), the mean of its first `drift_steps` served steps. A rank whose check fires says
so in its next message, and every rank starts an attempt at once.
"""

import numpy as np
import torch

from eplb.live.moe_layer import MoEDecodeLayer
from eplb.rebalance.config import RebalanceConfig
from placement.replay import drifted_steps


class DriftWatch:
    """The served steps' imbalance since the last switch, and the drift check on it.

    Attributes:
        fitted_imbalance: the serving placement's fitted level, when known (None: measured on served steps).
    """

    def __init__(self, config: RebalanceConfig) -> None:
        self.config = config
        self.fitted_imbalance: float | None = None
        self._imbalance_T: list[float] = []  # planned imbalance of each step served since the last switch

    def restart(self, fitted_imbalance: float | None = None) -> None:
        """A new placement serves (or the serving one is measured again): forget the steps served so far."""
        self.fitted_imbalance = fitted_imbalance
        self._imbalance_T.clear()

    def note_step(self, layers: list[MoEDecodeLayer]) -> None:
        """Append the last step's planned imbalance (mean over layers; one host read), keeping the first and the
        last `drift_steps` steps since the switch, which the check compares."""
        if self.config.refit_on_drift is None or "quota_P" not in layers[0].last_step:
            return
        per_layer = []
        for layer in layers:
            gpu_tokens = layer.last_step["quota_P"].view(-1, layer.slots_per_gpu).sum(1).double()
            per_layer.append(gpu_tokens.max() / gpu_tokens.mean().clamp_min(1e-9))
        self._imbalance_T.append(float(torch.stack(per_layer).mean()))
        span, keep = self.config.drift_steps, max(self.config.drift_steps, self.config.drift_check_every)
        if len(self._imbalance_T) > span + 2 * keep:
            del self._imbalance_T[span:-keep]

    def check(self, steps_since_attempt: int) -> bool:
        """True when this step is a check step (every `drift_check_every` steps since the last attempt, once a level
        is known or measurable) and a recent step drifted (`drifted`)."""
        config = self.config
        due = (config.refit_on_drift is not None and steps_since_attempt % config.drift_check_every == 0
               and (self.fitted_imbalance is not None or len(self._imbalance_T) >= 2 * config.drift_steps))
        return due and self.drifted()

    def drifted(self) -> bool:
        """The replay's refit-on-drift rule (`placement.replay.drifted_steps`) on the steps served since the last
        check: a step more imbalanced than `refit_on_drift` x the placement's level."""
        level = self.fitted_imbalance
        if level is None:
            level = float(np.mean(self._imbalance_T[: self.config.drift_steps]))
        recent = self._imbalance_T[-self.config.drift_check_every:]
        return bool(drifted_steps(np.array(recent), level, self.config.refit_on_drift).any())
