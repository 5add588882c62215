"""Cluster spec, placement model and file, policies, lower bounds, scoring, burst exposure and rolling replay."""

from placement.bounds import imbalance_lower_bound, replica_count_load
from placement.burst_exposure import burst_exposure
from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError, PlacementInfeasibleError
from placement.migration import MigrationPlan, oblivious_moves, plan_migration
from placement.placement_file import load_placement, placement_to_dict, save_placement
from placement.placement_model import Placement
from placement.policies import POLICIES, fit_placement
from placement.replay import ReplayResult, rolling_replay
from placement.scoring import ROUTINGS, StepScores, score_placement, static_gpu_loads

__all__ = [
    "POLICIES",
    "ROUTINGS",
    "ClusterSpec",
    "MigrationPlan",
    "Placement",
    "PlacementFormatError",
    "PlacementInfeasibleError",
    "ReplayResult",
    "StepScores",
    "burst_exposure",
    "fit_placement",
    "imbalance_lower_bound",
    "load_placement",
    "oblivious_moves",
    "placement_to_dict",
    "plan_migration",
    "replica_count_load",
    "rolling_replay",
    "save_placement",
    "score_placement",
    "static_gpu_loads",
]
