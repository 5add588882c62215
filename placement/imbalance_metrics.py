"""Named imbalance metrics: the same served steps read at each level and window a published figure may mean.

Legend: T steps, L layers, E logical experts, G cards, N nodes, B blocks of steps, X groups of experts.

A published "max / mean" names a level (card, node, expert group) and a window (one micro-batch or step, or load
summed over many) only sometimes. Each metric here is defined once (docs/formats.md, 'Imbalance metrics'); every one
is a mean over its rows of max / mean, 1.0 for a row without load:

- `card_step`: per step (or micro-batch) and layer, the busiest card over the mean card (the project's figure, and
  the figure the engines' own reports print);
- `node_step`: per step and layer, the cards' loads summed per node of `gpus_per_node` cards, busiest over mean;
- `card_window_W` (W in `WINDOWS`): per layer and block of W consecutive steps (the last partial block dropped), each
  card's load summed over the block first, then busiest over mean: what a window of statistics shows;
- `group_step`: per step and layer, the load of each routing group (the model's experts cut into `groups`
  contiguous groups, DeepSeek-V3's `n_group`), busiest over mean: a property of the traffic, not of the placement.

Beside each value, `noise_floor`: the same metric of a perfect expectation, sampled at the metric's own load
(`placement.yardsticks.noise_floor`: the picks of one row spread over its cells).
"""

import numpy as np

from placement.noise_floor import noise_floor

WINDOWS = (10, 100, 1000)
DEFINITIONS = {
    "card_step": "per step and layer: busiest card / mean card",
    "node_step": "per step and layer: busiest node / mean node (cards' loads summed per node)",
    "card_window": "per layer and block of {window} steps: busiest card / mean card of the loads summed over the "
                   "block",
    "group_step": "per step and layer: busiest routing group / mean group (experts in {groups} contiguous groups)",
}


def max_over_mean(loads_RC: np.ndarray) -> np.ndarray:
    """[...] max / mean over the last axis of loads [..., C] (1.0 where the mean is 0)."""
    mean = loads_RC.mean(axis=-1)
    peak = loads_RC.max(axis=-1)
    return np.divide(peak, mean, out=np.ones_like(mean, dtype=np.float64), where=mean > 0)


def node_loads_TLN(loads_TLG: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """[T, L, N] the cards' loads summed per node (card g on node g // gpus_per_node; G a multiple of it)."""
    steps, layers, cards = loads_TLG.shape
    if gpus_per_node < 1 or cards % gpus_per_node:
        raise ValueError(f"gpus_per_node={gpus_per_node} must divide the {cards} cards")
    return loads_TLG.reshape(steps, layers, cards // gpus_per_node, gpus_per_node).sum(axis=-1, dtype=np.float64)


def window_loads_BLG(loads_TLG: np.ndarray, window: int) -> np.ndarray:
    """[B, L, G] the cards' loads summed over consecutive blocks of `window` steps (B = T // window; the last
    partial block dropped)."""
    steps, layers, cards = loads_TLG.shape
    blocks = steps // window
    return loads_TLG[:blocks * window].reshape(blocks, window, layers, cards).sum(axis=1, dtype=np.float64)


def group_loads_TLX(counts_TLE: np.ndarray, groups: int) -> np.ndarray:
    """[T, L, X] each routing group's load: experts [x E / X, (x + 1) E / X) summed (X divides E)."""
    steps, layers, experts = counts_TLE.shape
    if groups < 1 or experts % groups:
        raise ValueError(f"groups={groups} must divide the {experts} experts")
    return counts_TLE.reshape(steps, layers, groups, experts // groups).sum(axis=-1, dtype=np.float64)


def named_metrics(loads_TLG: np.ndarray, gpus_per_node: int, counts_TLE: np.ndarray | None = None,
                  groups: int | None = None) -> dict[str, dict]:
    """Every metric of the module docstring on the served card loads [T, L, G] (and, for `group_step`, the
    counts [T, L, E] with `groups`): {name: {"value", "noise_floor", "rows", "definition"}}. A metric the steps
    cannot give (fewer steps than its window, one node) has value None and a `why`."""
    loads = np.asarray(loads_TLG, dtype=np.float64)
    steps, layers, cards = loads.shape
    picks = float(loads.sum(axis=-1).mean()) if loads.size else 0.0
    found = {"card_step": _metric(max_over_mean(loads), noise_floor(picks, cards), DEFINITIONS["card_step"])}
    nodes = cards // gpus_per_node if cards % gpus_per_node == 0 else 1
    if nodes > 1:
        found["node_step"] = _metric(max_over_mean(node_loads_TLN(loads, gpus_per_node)), noise_floor(picks, nodes),
                                     DEFINITIONS["node_step"])
    else:
        found["node_step"] = _missing(DEFINITIONS["node_step"], f"the {cards} cards are one node")
    for window in WINDOWS:
        definition = DEFINITIONS["card_window"].format(window=window)
        if steps >= window:
            found[f"card_window_{window}"] = _metric(max_over_mean(window_loads_BLG(loads, window)),
                                                     noise_floor(picks * window, cards), definition)
        else:
            found[f"card_window_{window}"] = _missing(definition, f"{steps} steps scored, fewer than {window}")
    if counts_TLE is not None and groups is not None:
        found["group_step"] = group_metric(counts_TLE, groups)
    return found


def group_metric(counts_TLE: np.ndarray, groups: int) -> dict:
    """The `group_step` metric of counts [T, L, E] whose experts form `groups` contiguous routing groups (it needs
    no placement: every placement serves the same group loads)."""
    group_TLX = group_loads_TLX(np.asarray(counts_TLE), groups)
    picks = float(group_TLX.sum(axis=-1).mean())
    return _metric(max_over_mean(group_TLX), noise_floor(picks, groups), DEFINITIONS["group_step"].format(groups=groups))


def _metric(values: np.ndarray, floor: float, definition: str) -> dict:
    return {"value": float(values.mean()), "noise_floor": floor, "rows": int(values.size), "definition": definition}


def _missing(definition: str, why: str) -> dict:
    return {"value": None, "noise_floor": None, "rows": 0, "definition": definition, "why": why}


LABELS = {"card_step": "card/step", "node_step": "node/step", "card_window_10": "card/10 steps",
          "card_window_100": "card/100 steps", "card_window_1000": "card/1000 steps", "group_step": "group/step"}


def metrics_line(metrics: dict[str, dict]) -> str:
    """The metrics of `named_metrics` on one line: each value with its noise floor, or why it has none."""
    cells = []
    for name, metric in metrics.items():
        label = LABELS.get(name, name)
        if metric["value"] is None:
            cells.append(f"{label} - ({metric['why']})")
        else:
            cells.append(f"{label} {metric['value']:.3f} (floor {metric['noise_floor']:.3f})")
    return "; ".join(cells)
