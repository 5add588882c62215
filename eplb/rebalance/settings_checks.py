"""The `Rebalancer`'s checks of what it is given: settings that cannot work together, and a placement to load that
does not fit the group. Each raises with the same verdict on every rank (every rank has the same inputs)."""

from collectives import Communicator
from eplb.live.load_recorder import LoadRecorder
from eplb.live.moe_layer import MoEDecodeLayer, check_placement_fits
from eplb.rebalance.config import RebalanceConfig
from placement import Placement, PlacementFormatError


def check_settings(config: RebalanceConfig, comm: Communicator, layers: list[MoEDecodeLayer],
                   recorder: LoadRecorder, placement: Placement) -> None:
    """Raise `ValueError` for settings that cannot work together (the same verdict on every rank)."""
    if len(layers) != placement.num_layers or recorder.num_layers != placement.num_layers:
        raise ValueError(f"layers ({len(layers)}) and recorder.num_layers ({recorder.num_layers}) must match the "
                         f"placement's {placement.num_layers} layers")
    first = layers[0].config
    row_bytes = max(first.hidden_size, first.intermediate_size) * layers[0].slot_experts.gate_ADF.element_size()
    if config.max_bytes_per_step < row_bytes:
        raise ValueError(f"max_bytes_per_step={config.max_bytes_per_step} is below one row of an expert's "
                         f"weights ({row_bytes} bytes); raise it")
    if config.transfer_timeout_s >= comm.timeout_s:
        raise ValueError(f"transfer_timeout_s={config.transfer_timeout_s:g} must be below the communicator's "
                         f"timeout_s={comm.timeout_s:g}, so that the agreement after a transfer outlasts it")
    if config.failures_tolerated is not None and comm.world_size > 1 and config.failures_tolerated >= comm.world_size:
        raise ValueError(f"failures_tolerated={config.failures_tolerated} must be below the group's "
                         f"{comm.world_size} ranks (someone must survive); lower it")


def check_loadable(target: Placement, current: Placement, layers: list[MoEDecodeLayer], world_size: int) -> None:
    """Raise `PlacementFormatError` unless `target` has `current`'s layers, experts, GPUs and slots and fits the
    layers (`check_placement_fits`)."""
    if (target.num_layers, target.num_experts, target.cluster.num_gpus, target.cluster.slots_per_gpu) != (
            current.num_layers, current.num_experts, current.cluster.num_gpus, current.cluster.slots_per_gpu):
        raise PlacementFormatError(
            f"the placement is for {target.num_layers} layers x {target.num_experts} experts on "
            f"{target.cluster.num_gpus} GPUs x {target.cluster.slots_per_gpu} slots; this group serves "
            f"{current.num_layers} x {current.num_experts} on {current.cluster.num_gpus} x "
            f"{current.cluster.slots_per_gpu}: place again for this group"
        )
    for index, layer in enumerate(layers):
        check_placement_fits(target, index, layer.config, world_size)
