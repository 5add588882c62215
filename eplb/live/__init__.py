"""What a decode worker imports: the MoE decode layer, its config and gate, the load recorder, and the rebalancer
that changes the placement of a running group and survives a lost rank."""

from eplb.live.experts import ExpertWeights
from eplb.live.load_recorder import LoadRecorder, count_picks_E
from eplb.live.moe_config import MoELayerConfig
from eplb.live.moe_layer import MoEDecodeLayer
from eplb.live.rebalance_config import RebalanceConfig
from eplb.live.rebalancer import Rebalancer, RecoveryReport
from eplb.live.replica_assignment import ROUTING_MODES

__all__ = ["ROUTING_MODES", "ExpertWeights", "LoadRecorder", "MoEDecodeLayer", "MoELayerConfig", "RebalanceConfig",
           "Rebalancer", "RecoveryReport", "count_picks_E"]
