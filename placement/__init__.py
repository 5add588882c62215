"""Cluster spec, placement model and file, policies, lower bounds, scoring and rolling replay."""

from placement.bounds import equal_split_bound, min_max_load_per_replica
from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError, PlacementInfeasibleError
from placement.migration import MigrationPlan, oblivious_moves, plan_migration
from placement.placement_file import load_placement, placement_to_dict, save_placement, save_sglang_mapping
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
    "equal_split_bound",
    "fit_placement",
    "load_placement",
    "min_max_load_per_replica",
    "oblivious_moves",
    "placement_to_dict",
    "plan_migration",
    "rolling_replay",
    "save_placement",
    "save_sglang_mapping",
    "score_placement",
    "static_gpu_loads",
]
