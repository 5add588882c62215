"""The figure TensorRT-LLM's `report_load_statistics.py` prints, computed on this project's arrays.

Legend: T iterations (steps), L layers, E experts (or slots), G ranks.

`examples/wide_ep/ep_load_balancer/report_load_statistics.py` (formerly `examples/ep_load_balancer/`) reads an
expert-statistic dump and prints, per layer and on its `average` row, the `imbalance-ratio`: per (iteration, layer)
max over ranks / mean over ranks - 1, averaged over the iterations for each layer, then over the layers. That is this
project's imbalance less one, averaged the same way, with two details of its own, kept here so the figures agree:
a (iteration, layer) with no tokens gives 0 / 0, so its layer's mean is NaN and the `average` row (a pandas mean,
which skips NaN) leaves that layer out; and it computes in float32 (figures agree to about 1e-6).

Which ranks' loads it takes:
- a dump alone: the counted ids grouped in `ep_size` consecutive blocks, `ep_size` the number of `rank<r>.safetensors`
  files: the ranks of the recorded run under TensorRT-LLM's default layout (expert e on rank e // (E / ep_size)), or,
  for a run under a load balancer, whose ids are slots, its actual ranks;
- with `--projection_eplb_config_path FILE`: each expert's count split equally over its replicas in FILE's
  `initial_global_assignments` and slot p on rank p // (num_slots / ep_size), `ep_size` a key FILE must hold beside
  the three TensorRT-LLM loads. For a placement that is this project's static GPU load of its equal split.
"""

import numpy as np

from placement.placement_model import Placement
from placement.scoring import check_compatible, static_gpu_loads


def imbalance_ratio(loads_TLG: np.ndarray) -> float | None:
    """`report_load_statistics.py`'s average imbalance-ratio of rank loads [T, L, G] (float): None where no layer
    has tokens in every iteration (its `average` row would be NaN)."""
    loads = np.asarray(loads_TLG, dtype=np.float64)
    mean_TL = loads.mean(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio_TL = np.where(mean_TL > 0, loads.max(axis=2) / mean_TL - 1.0, np.nan)
    ratio_L = ratio_TL.mean(axis=0)  # NaN for a layer with an iteration of no tokens, as torch's mean gives
    kept = ratio_L[~np.isnan(ratio_L)]
    return float(kept.mean()) if kept.size else None


def recorded_imbalance_ratio(counts_TLE: np.ndarray, num_ranks: int) -> float | None:
    """The figure for a dump alone: counts [T, L, E] of the ids a run recorded, grouped into `num_ranks` consecutive
    blocks of E / num_ranks ids. None when E is not a multiple of `num_ranks` (the script's reshape fails) or no
    layer has tokens in every iteration."""
    steps, layers, num_ids = counts_TLE.shape
    if num_ranks < 1 or num_ids % num_ranks:
        return None
    return imbalance_ratio(counts_TLE.reshape(steps, layers, num_ranks, -1).sum(axis=3))


def projected_imbalance_ratio(placement: Placement, counts_TLE: np.ndarray) -> float | None:
    """The figure with `--projection_eplb_config_path` naming the file `eplb.engines.trtllm.load_balancer_file` writes
    for `placement` (with `ep_size: G` added): counts [T, L, E] split equally over each expert's replicas, slot p on
    rank p // S. None when no layer has tokens in every iteration.

    Raises:
        PlacementFormatError: the placement is for another number of layers or experts than the counts.
    """
    check_compatible(placement, counts_TLE)
    equal = Placement.equal_split(placement.phy2log_LP, placement.cluster, placement.num_experts, placement.policy)
    return imbalance_ratio(static_gpu_loads(counts_TLE, equal))
