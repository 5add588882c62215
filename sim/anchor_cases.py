"""The imbalance anchors over the readings their sources leave open: traffic cases and, where no metric is named,
every metric side by side.

An imbalance anchor's source states its cluster, its steps and its metric, but not the traffic's skew or bursts
(`sim.scenarios`), and a seed is a draw. Each such row is run over the cases of the scenarios its measure names
(`measure.scenarios`, default the fitted `single-dataset`), bursts on and off, `ANCHOR_SEEDS` seeds, and reports its
range beside the central figure. An anchor whose source names no metric (role `open`: DeepSeek's production figure,
"between the slowest and average expert groups", no level, no window) is read every way `placement.imbalance_metrics`
defines, at the operating point's load (`sim.imbalance_readings`), each with its range over the cases: the definitions
side by side, counted neither as a hit nor as a miss.
"""

from pathlib import Path

from sim.scenarios import BURSTS, TrafficCase, apply_case, cases, skew_of, spread

ANCHOR_SEEDS = 3
OPEN_METRICS = ("card_step", "node_step", "card_window_10", "card_window_100", "card_window_1000", "group_step")


def anchor_cases(anchor) -> list[TrafficCase]:
    """The traffic cases an imbalance anchor runs over: its measure's `scenarios`, bursts on and off, the seeds."""
    return cases(tuple(anchor.measure.get("scenarios", ("single-dataset",))), tuple(BURSTS), ANCHOR_SEEDS)


def request_case_figure(anchor, case: TrafficCase) -> float:
    """An `imbalance` anchor's figure under `case` (`sim.traffic_anchor.request_imbalance`)."""
    from sim.traffic_anchor import request_imbalance

    return request_imbalance(anchor.measure, skew_of(case.scenario), BURSTS[case.bursts], case.seed)


def case_range(anchor, central: float) -> dict:
    """{"central", "min", "max", "cases": [{"case", "simulated"}]} of an `imbalance` anchor over its cases."""
    found = [(case, request_case_figure(anchor, case)) for case in anchor_cases(anchor)]
    return {**spread(central, [value for _, value in found]),
            "cases": [{"case": case.label, "simulated": value} for case, value in found]}


def open_definitions(anchor, anchors_path: Path) -> dict:
    """An `open` anchor's readings: {"tokens_per_card", "cases", "definitions": {metric: {"central", "min", "max",
    "noise_floor", "definition"}}, "yardsticks"} at its operating point's micro-batch load (`decode_capacity` on the
    anchor's config), central at the config's own traffic (with its yardsticks, the expectation oracle included),
    the range over `anchor_cases`."""
    from sim.capacity import decode_capacity
    from sim.imbalance_readings import decode_readings, read_decode_unit
    from sim.validation import anchor_config

    config = anchor_config(anchor, anchors_path)
    load = decode_capacity(config)["micro_batch_tokens_per_card"]
    reading = read_decode_unit(config, load)
    central = reading.metrics
    readings = [decode_readings(apply_case(config, case), load) for case in anchor_cases(anchor)]
    definitions = {}
    for name in OPEN_METRICS:
        if name not in central or central[name]["value"] is None:
            continue
        values = [reading[name]["value"] for reading in readings]
        definitions[name] = {**spread(central[name]["value"], values), "noise_floor": central[name]["noise_floor"],
                             "definition": central[name]["definition"]}
    return {"tokens_per_card": load, "cases": len(readings), "definitions": definitions,
            "yardsticks": reading.yardsticks}
