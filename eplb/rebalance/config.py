"""How a running EP group rebalances: the settings of `Rebalancer`, one pydantic model (YAML or JSON friendly)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from placement.patch_planner import PatchSettings


class RebalanceConfig(BaseModel):
    """When to fit a new placement, how, how fast to move the weights, and how long anything may take.

    Steps are decode steps (one forward of every MoE layer). Every rank must use the same settings.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(100, ge=1, description="Finished decode steps the load recorder keeps and the fit uses.")
    interval: int = Field(500, ge=1, description="Steps from one rebalance attempt to the next.")
    policy: Literal["cpsat", "deepseek"] = Field("cpsat", description="Placement policy of the background solve.")
    time_limit_s: float = Field(
        4.0, gt=0, description="The cpsat policy's budget for one fit of all layers. Below what one chain start a "
                               "layer takes (about 2 s at 61 x 256 on 64 x 5, 3-4 s on 128 x 3, on one core), layers "
                               "fall back to DeepSeek's greedy; at the full shape the weight moves, not the solve, set "
                               "most of a refit's lag."
    )
    solve_threads: int = Field(1, ge=1, description="Threads of the cpsat solve (layers at once).")
    good_enough: float | None = Field(
        1.001, ge=1, description="The cpsat policy stops a layer's search once a candidate fits the window this well "
                                 "(mean max / mean GPU load; None: search for the whole time_limit_s). The solve's "
                                 "CPU is taken from serving, and a search below such a level gains nothing the next "
                                 "traffic keeps."
    )
    min_gain: float = Field(
        0.005, ge=0, description="A fitted placement replaces the one serving only when it fits the window at least "
                                 "this much better (relative, mean max / mean GPU load; 0: always). A refit of "
                                 "traffic that has not changed otherwise moves experts for nothing. A placement "
                                 "loaded from a file always switches."
    )
    solve_in: Literal["process", "thread"] = Field(
        "process", description="Where rank 0 solves: a helper process (no lock shared with decode) or a thread; "
                               "either at the decode processes' priority (a lower one starves the solve beside "
                               "CPU-bound work; solve_cpu_share caps its share instead)."
    )
    solve_cpu_share: float = Field(
        1.0, gt=0, le=1, description="Share of the time the helper process may run while it solves (below 1 it is "
                                     "paused and resumed in 20 ms cycles, and the solve takes 1/share as long): "
                                     "where decode ranks fill every core, background work delays them for as long "
                                     "as it is runnable, whatever its priority; 1 where cores are spare (a GPU host)."
    )
    forecast: Literal["trend", "none"] = Field(
        "trend", description="trend: where the window's own later steps confirm a trend "
                             "(`placement.forecast.trend_supported`), rank 0 fits the window moved along each "
                             "expert's load trend to the steps the placement will serve (from the last measured lag "
                             "to one interval later), else the window as it is; none: always the window as it is."
    )
    routing: Literal["static", "dynamic"] = Field(
        "dynamic", description="The routing the fit optimises for (as the layers route)."
    )
    refit_on_drift: float | None = Field(
        1.4, gt=1, description="Rebalance at once when a served step's imbalance exceeds this times the placement's "
                               "fitted imbalance (the replay's trigger; None: fixed interval only)."
    )
    patches: PatchSettings | None = Field(
        PatchSettings(),
        description="Patches between refits (None: none): every `patches.every` steps while no refit is under way, "
                    "rank 0 swaps a few replica sets per layer of the placement the patches follow toward the drifting "
                    "mix, and on top moves a few slots to the experts the last steps overload "
                    "(`placement.patch_planner`). A patch moves a few experts, not a model."
    )
    drift_steps: int = Field(8, ge=1, description="Served steps that set the level of a placement with no fitted "
                                                  "imbalance (the one at start, or one loaded from a file).")
    drift_check_every: int = Field(4, ge=1, description="Steps between a rank's drift checks (the flag travels with "
                                                        "the step's counts).")
    max_bytes_per_step: int = Field(
        64 << 20, ge=1, description="Bytes of expert weights a rank sends or receives between two decode steps, at "
                                    "most (per rank; at least one row of one weight matrix)."
    )
    solve_timeout_s: float = Field(30.0, gt=0, description="A solve still running after this long is abandoned.")
    transfer_timeout_s: float = Field(
        5.0, gt=0, description="Each weight transfer's timeout; must be below the communicator's, so that the "
                               "agreement after it outlasts a transfer that times out."
    )
    failures_tolerated: int | None = Field(
        None, ge=1, le=64, description="Ranks that may die at once, any set of them, with every expert still served "
                                       "by a survivor: each rank keeps host copies of experts it serves nowhere so "
                                       "that every expert has a copy on this many ranks + 1 (the host memory grows "
                                       "with it). None: 2 for groups of 8 ranks or more, else 1."
    )
    heartbeat_interval_s: float = Field(0.2, gt=0, description="Seconds between a rank's heartbeats in the store.")
    heartbeat_timeout_s: float = Field(
        2.0, gt=0, description="A rank whose heartbeat has not moved for this long is taken for dead."
    )

    def failures_tolerated_for(self, world_size: int) -> int:
        """The failures a group of `world_size` ranks tolerates: `failures_tolerated`, or its default."""
        if self.failures_tolerated is not None:
            return self.failures_tolerated
        return 2 if world_size >= 8 else 1

    @model_validator(mode="after")
    def _check(self) -> "RebalanceConfig":
        if self.solve_cpu_share < 1 and self.solve_in != "process":
            raise ValueError(f"solve_cpu_share={self.solve_cpu_share:g} paces a helper process: set "
                             "solve_in='process' (a thread cannot be paused)")
        if self.heartbeat_timeout_s < 3 * self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s={self.heartbeat_timeout_s:g} must be at least 3 x "
                             f"heartbeat_interval_s={self.heartbeat_interval_s:g}")
        return self
