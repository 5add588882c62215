"""Configuration of the `cpsat` placement policy."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CpSatConfig(BaseModel):
    """Budget, objective and operator constraints of the OR-Tools CP-SAT placement solver."""

    model_config = ConfigDict(extra="forbid")

    time_limit_s: float = Field(
        10.0,
        gt=0,
        description="Wall-clock budget for the whole model (all layers); held on shared cores by doing less work "
        "per layer (CP-SAT skipped, fewer chain starts, the greedy; `info['levels']` counts them).",
    )
    workers: int = Field(2, ge=1, description="Layers solved at once (threads), one CP-SAT search worker each.")
    seed: int = Field(0, ge=0, description="Seed of CP-SAT and of the step sampling.")
    routing: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="The router that will run: 'dynamic' fits per-step splits, 'static' fits one fixed split.",
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
        "steps (up to half of each layer's time; skipped where too slow to pay off).",
    )
    good_enough: float | None = Field(
        None,
        ge=1,
        description="Stop a layer's search once a candidate's fitted objective (with its move penalty) is at most "
        "this, e.g. 1.001 for within 0.1% of perfect balance (None: search for the whole budget). Where the budget "
        "is CPU taken from serving (a live rebalance), a search past such a level gains nothing that new traffic "
        "keeps. Not with node awareness (its CP-SAT model is the only candidate that keeps groups within nodes).",
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
        None, ge=1, description="Expert groups (consecutive experts); with nodes_per_group, node awareness."
    )
    nodes_per_group: int | None = Field(
        None, ge=1, description="Most nodes one expert group's replicas may span (node-limited routing)."
    )

    @model_validator(mode="after")
    def _node_awareness_is_complete(self) -> "CpSatConfig":
        if (self.groups is None) != (self.nodes_per_group is None):
            raise ValueError("groups and nodes_per_group go together: set both for node awareness, or neither")
        if self.gpu_capacity is not None and min(self.gpu_capacity) <= 0:
            raise ValueError("every gpu_capacity must be > 0")
        if self.good_enough is not None and self.groups is not None:
            raise ValueError("good_enough stops before CP-SAT, which node awareness needs: unset one of them")
        return self
