"""How a running EP group rebalances: the settings of `Rebalancer`, one pydantic model (YAML or JSON friendly)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from placement.burst_patch import PatchConfig

PATCH = PatchConfig()  # the burst patch's defaults, which the replay's `eplb replay` shares


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
                               "either at a low CPU priority (nice 10)."
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
    patch_every: int | None = Field(
        PATCH.every, ge=1,
        description="Steps between burst patches while no refit is under way (None: never patch): rank 0 checks the "
                    "last patch_window steps' load and, in layers the live router would serve above patch_threshold, "
                    "moves up to patch_moves slots to the experts that burst (`placement.burst_patch`), taken from "
                    "the last fitted placement (with its drift swaps, patch_swaps) so that a layer goes back when the "
                    "burst ends. A patch moves a few experts, not a model."
    )
    refit_adopt_layers: int | None = Field(
        None, ge=1,
        description="With patches: a refit is solved in a helper of its own while patches go on, and its placement is "
                    "not moved as one attempt but adopted by the patches, up to this many layers each, the layers it "
                    "gains most on first (each patch planned against the placement serving, so no patch waits for a "
                    "refit's moves). None: a refit moves as one attempt, and no patch starts while it is under way.",
    )
    patch_swaps: int = Field(
        PATCH.drift_swaps, ge=0,
        description="Most replica-set swaps per layer and patch that follow the drifting mix of the last "
                    "patch_drift_window steps (`placement.drift_swaps`, ring layouts only); they stay in the fitted "
                    "placement patches start from until the next refit (0: none)."
    )
    patch_drift_window: int = Field(PATCH.drift_window, ge=1, description="Last steps whose mean load the drift "
                                                                          "swaps fit (at most the recorder's window).")
    patch_drift_stride: int = Field(
        PATCH.drift_stride, ge=1,
        description="A layer gets its drift swaps in every patch_drift_stride-th patch since the last refit, the "
                    "layers taking turns (`placement.drift_swaps.layers_in_turn`): a patch's job and weight moves "
                    "shrink with it, so patches land sooner (1: every layer in every patch). The least stride: "
                    "patch_swap_budget_s may widen it."
    )
    patch_swap_budget_s: float | None = Field(
        0.13, gt=0,
        description="Seconds a patch's drift swaps may take on rank 0: from the last patch's seconds per layer, the "
                    "next patches swap in every k-th layer so that one patch's swaps take about this long (k at least "
                    "patch_drift_stride), since a patch lands only when its job is done (None: the fixed stride)."
    )
    patch_window: int = Field(PATCH.window, ge=1, description="Last steps whose mean load a patch fits (at most the "
                                                    "recorder's window).")
    patch_moves: int = Field(PATCH.max_moves, ge=1, description="Most slots one layer may change in one patch.")
    patch_threshold: float = Field(
        PATCH.threshold, ge=1,
        description="Layers whose recent load the live router serves at or below this imbalance (max / mean GPU "
                    "load) are left as fitted."
    )
    patch_overlap: bool = Field(
        True, description="Start the next patch's job as soon as a patch's answer is broadcast, from its target, so "
                          "it solves while that patch's weights move and its answer is often ready at the switch "
                          "(False: the next patch starts patch_every steps after the last one started, once it "
                          "has switched)."
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
        if self.refit_adopt_layers is not None and self.patch_every is None:
            raise ValueError(f"refit_adopt_layers={self.refit_adopt_layers} hands refits to the patches: set "
                             "patch_every, or refit_adopt_layers=None")
        if self.heartbeat_timeout_s < 3 * self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s={self.heartbeat_timeout_s:g} must be at least 3 x "
                             f"heartbeat_interval_s={self.heartbeat_interval_s:g}")
        return self
