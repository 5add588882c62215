"""Published imbalance figures of request-level traffic, measured as their source measured them.

An `imbalance` anchor (sim/anchors/anchors.yaml) names a stage's request-level traffic (`traces.request_traffic`), a
group of cards and slots, a placement and the steps scored; its figure is the source's metric, the mean over steps
and layers of the busiest card's load over the mean card's (TensorRT-LLM's `report_load_statistics.py` reports the
same less one). Placements:

- `none`: one replica per expert in order (`trivial`: expert e on card e // slots), no balancing;
- `deepseek` with `fit: rerun`: DeepSeek's algorithm fitted on the scored steps of one run and scored on the same
  steps of a rerun: the same requests (lengths and expert preferences) with fresh token sampling, as TensorRT-LLM's
  offline EPLB is fitted on recorded iterations and measured on the same iterations of the next run.

Every card gets an equal share of a replicated expert's tokens (static, equal split), as those engines route.
"""

from placement import ClusterSpec, fit_placement
from placement.scoring import score_placement
from traces.request_traffic import RequestTrafficConfig, request_traffic_TLE

FITS = ("none", "rerun")


def request_imbalance(measure: dict, skew: float, burst_rate: float = 2.0, seed_offset: int = 0) -> float:
    """The anchor's imbalance at popularity skew `skew`, with `burst_rate` bursts per layer per 1,000 steps, the
    traffic drawn from the measure's seed + `seed_offset` (see the module docstring; `sim.scenarios` names the
    readings of the skew and the bursts).

    `measure` keys: cards, slots, tokens_per_step, first_step, last_step (the steps scored: [first, last)), fit
    ("none" or "rerun"); optional experts (256), top_k (8), layers (8), output_tokens (512), seed (0)."""
    fit = measure["fit"]
    if fit not in FITS:
        raise ValueError(f"measure fit must be one of {FITS}; got {fit!r}")
    first, last = int(measure["first_step"]), int(measure["last_step"])
    run = RequestTrafficConfig(
        mode="decode", num_steps=last, num_layers=int(measure.get("layers", 8)),
        num_experts=int(measure.get("experts", 256)), top_k=int(measure.get("top_k", 8)),
        tokens_per_step=int(measure["tokens_per_step"]), output_tokens=float(measure.get("output_tokens", 512)),
        skew=skew, burst_rate=burst_rate, seed=int(measure.get("seed", 0)) + seed_offset)
    cards = int(measure["cards"])
    cluster = ClusterSpec(num_gpus=cards, slots_per_gpu=int(measure["slots"]), gpus_per_node=cards)
    scored_TLE = request_traffic_TLE(run)[first:last]
    if fit == "none":
        placement = fit_placement("trivial", scored_TLE[:1], cluster)
    else:
        placement = fit_placement("deepseek", scored_TLE, cluster)
        rerun = run.model_copy(update={"sample_seed": run.seed + 1})
        scored_TLE = request_traffic_TLE(rerun)[first:last]
    return float(score_placement(placement, scored_TLE, "static").imbalance_TL.mean())
