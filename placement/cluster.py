"""The EP group a placement is for: GPUs, nodes and expert slots."""

import numbers

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from placement.errors import PlacementInfeasibleError

# Sizes beyond any EP group in service (DeepSeek's largest decode unit has 320 GPUs): refused at once, since the
# policies' work grows with GPUs x slots and an absurd size would run until killed rather than fail.
MAX_GPUS = 1024
MAX_SLOTS_PER_GPU = 256
MAX_SLOTS = 16384


class ClusterSpec(BaseModel):
    """One expert-parallel group of `num_gpus` cards with `slots_per_gpu` expert slots each.

    Slot p (0 <= p < P = num_gpus * slots_per_gpu) lives on GPU p // slots_per_gpu, and GPU g on node
    g // gpus_per_node.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_gpus: int = Field(gt=0, le=MAX_GPUS, description="G: cards in the EP group.")
    slots_per_gpu: int = Field(gt=0, le=MAX_SLOTS_PER_GPU, description="S: expert slots per card.")
    gpus_per_node: int = Field(8, gt=0, description="Cards per server; the EP group spans G / gpus_per_node nodes.")

    @field_validator("num_gpus", "slots_per_gpu", "gpus_per_node", mode="before")
    @classmethod
    def _whole_number(cls, value, info):
        """A count is an integer (numpy's too), never a string, a bool or a float, which pydantic would coerce."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{info.field_name} must be an integer; got {value!r} ({type(value).__name__})")
        return int(value)

    @model_validator(mode="after")
    def _whole_nodes(self) -> "ClusterSpec":
        if self.num_gpus % self.gpus_per_node != 0 and self.num_gpus > self.gpus_per_node:
            raise ValueError(
                f"num_gpus={self.num_gpus} does not fill whole nodes of gpus_per_node={self.gpus_per_node}; "
                f"use num_gpus={self.whole_nodes(self.num_gpus)} (or set gpus_per_node)"
            )
        if self.num_slots > MAX_SLOTS:
            raise ValueError(
                f"num_gpus x slots_per_gpu = {self.num_slots} slots exceeds the limit of {MAX_SLOTS}; "
                f"no EP group in service is this large"
            )
        return self

    def whole_nodes(self, gpus: int) -> int:
        """The smallest GPU count >= `gpus` that this spec accepts (whole nodes above one node)."""
        if gpus <= self.gpus_per_node:
            return gpus
        return -(-gpus // self.gpus_per_node) * self.gpus_per_node

    @property
    def num_slots(self) -> int:
        """P: expert slots in the whole group."""
        return self.num_gpus * self.slots_per_gpu

    @property
    def num_nodes(self) -> int:
        """N: servers the group spans (1 when the group is smaller than one node)."""
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def node_size(self) -> int:
        """GPUs per node actually used (min of gpus_per_node and num_gpus)."""
        return min(self.gpus_per_node, self.num_gpus)

    def check_fits(self, num_experts: int) -> None:
        """Raise `PlacementInfeasibleError` unless every one of `num_experts` experts can have a slot (P >= E)."""
        if self.num_slots < num_experts:
            need_slots = -(-num_experts // self.num_gpus)
            need_gpus = self.whole_nodes(-(-num_experts // self.slots_per_gpu))
            raise PlacementInfeasibleError(
                f"{self.num_gpus} GPUs x {self.slots_per_gpu} slots = {self.num_slots} slots cannot hold "
                f"{num_experts} experts; use slots_per_gpu >= {need_slots} or num_gpus >= {need_gpus}"
            )
