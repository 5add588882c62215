"""What a decode worker imports: the MoE decode layer, its config and gate, and the load recorder."""

from eplb.live.experts import ExpertWeights
from eplb.live.load_recorder import LoadRecorder, count_picks_E
from eplb.live.moe_config import MoELayerConfig
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.live.replica_assignment import ROUTING_MODES

__all__ = ["ROUTING_MODES", "ExpertWeights", "LoadRecorder", "MoEDecodeLayer", "MoELayerConfig", "count_picks_E"]
