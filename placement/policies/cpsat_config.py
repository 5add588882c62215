"""Configuration of the `cpsat` placement policy."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CpSatConfig(BaseModel):
    """Budget, objective and operator constraints of the OR-Tools CP-SAT placement solver."""

    model_config = ConfigDict(extra="forbid")

    work_limit: float = Field(
        20.0,
        gt=0,
        le=1e6,
        description="Deterministic budget for the whole model (all layers), in work units of about one second of one "
        "core: each layer gets an equal share, spent on counted work (CP-SAT's deterministic time, search rounds, "
        "modelled costs of the fixed phases), never on the clock, so the same input gives the same placement in any "
        "process, under any load, on any machine. Where a layer's share cannot pay for a phase it does less "
        "(`info['levels']`).",
    )
    time_limit_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="A wall-clock budget instead of work_limit, seconds, for callers that solve once and hand the "
        "result to everyone (the project's rank-0 rebalancer): layers step down as the clock runs short, so the "
        "result depends on the machine's speed and load. None: the deterministic work_limit.",
    )
    workers: int = Field(2, ge=1, le=256, description="Layers solved at once (threads), one CP-SAT search worker "
                         "each; the placement does not depend on it.")
    seed: int = Field(0, ge=0, lt=2**31, description="Seed of CP-SAT and of the step sampling.")
    routing: Literal["dynamic", "static", "equal"] = Field(
        "dynamic",
        description="The router that will run: 'dynamic' fits per-step splits, 'static' fits one fixed split, "
        "'equal' fits an equal split over each expert's replicas (what static dispatch routes).",
    )
    sampled_steps: int = Field(
        6, ge=1, description="Steps of the window the model fits (the busiest-looking and evenly spread ones)."
    )
    layout_seeds: int = Field(
        2, ge=0, description="Chain layouts with random ring orders tried per layer (besides the interleaved one)."
    )
    ring_search: bool = Field(
        True,
        description="Dynamic routing: swap the replica sets of the best chain layout's experts to fit the window's "
        "steps (up to half of each layer's spare budget; skipped where too slow to pay off).",
    )
    swap_search: bool = Field(
        True,
        description="Search the greedy's slot map by swapping experts between GPUs, on the window's steps under equal "
        "split (`swap_search`; under equal routing also moving replicas between experts): what pays at two to four "
        "slots per GPU.",
    )
    good_enough: float | None = Field(
        None,
        ge=1,
        description="Stop a layer's search once a candidate's fitted objective (with its move penalty) is at most "
        "this, e.g. 1.001 for within 0.1% of perfect balance (None: search for the whole budget). Where the budget "
        "is CPU taken from serving (a live rebalance), a search past such a level gains nothing that new traffic "
        "keeps.",
    )
    extra_candidates: int = Field(
        2, ge=0, description="GPUs beyond the hint's and the construction's that each expert may move to."
    )
    weight_scale: int = Field(1000, ge=10, description="Static shares are integers out of this many parts.")
    migration_cost: float = Field(
        0.0,
        ge=0,
        description="Penalty per expert copy against the current placement, in units of mean GPU load per step "
        "(0 = off; needs a current placement).",
    )
    gpu_capacity: list[float] | None = Field(
        None, description="Relative speed of each GPU (1.0 = nominal); a GPU's load is divided by its speed."
    )
    groups: int | None = Field(
        None, ge=1, description="Expert groups (consecutive experts); with nodes_per_group, node limits: a multiple "
        "of the cluster's nodes, as DeepSeek's hierarchical policy needs (each node starts with whole groups)."
    )
    nodes_per_group: int | None = Field(
        None, ge=1, description="Most nodes one expert group's replicas may span (node-limited routing)."
    )

    @model_validator(mode="after")
    def _node_awareness_is_complete(self) -> "CpSatConfig":
        if self.time_limit_s is not None and "work_limit" in self.model_fields_set:
            raise ValueError("give work_limit (a deterministic budget) or time_limit_s (a wall-clock one), not both")
        if (self.groups is None) != (self.nodes_per_group is None):
            raise ValueError("groups and nodes_per_group go together: set both for node awareness, or neither")
        if self.gpu_capacity is not None and min(self.gpu_capacity) <= 0:
            raise ValueError("every gpu_capacity must be > 0")
        return self
