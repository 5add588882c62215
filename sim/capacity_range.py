"""Capacity over the traffic scenarios: each stage's tokens/s per card and imbalance as a central figure and a range.

`eplb sim --capacity` answers at the config's own traffic (the central figure); the traffic's unmeasured constants
(`sim.scenarios`: the skew, the bursts) and the seed move the answer by more than many of the differences it
reports. This runs the same capacity (`sim.capacity.decode_capacity`, `prefill_capacity`) for every case and reports
each figure as `{"central", "min", "max"}`. A config whose decode traffic is the user's routing trace keeps it: there
the cases change only the seed of its thinning to the decode loads (and prefill's synthetic traffic).
"""

from collections.abc import Callable

from sim.capacity import decode_capacity, prefill_capacity
from sim.config import SimConfig
from sim.scenarios import TrafficCase, apply_case, spread

FIGURES = ("tokens_per_s_per_card", "imbalance")


def capacity_ranges(config: SimConfig, central: dict, case_list: list[TrafficCase],
                    progress: Callable[[int, int], None] | None = None) -> dict:
    """{"cases": [one row per case], "decode": {figure: spread}, "prefill": {figure: spread}} around `central`
    (`capacity_report(config)`: the config's own figures). `progress(done, total)` after each case."""
    rows = []
    for done, case in enumerate(case_list, 1):
        reading = apply_case(config, case)
        decode, prefill = decode_capacity(reading), prefill_capacity(reading)
        rows.append({"scenario": case.scenario, "bursts": case.bursts, "seed": case.seed,
                     "decode": {figure: decode[figure] for figure in FIGURES},
                     "prefill": {figure: prefill[figure] for figure in FIGURES}})
        if progress is not None:
            progress(done, len(case_list))
    return {"cases": rows, **{stage: {figure: spread(central[stage][figure], [row[stage][figure] for row in rows])
                                      for figure in FIGURES} for stage in ("decode", "prefill")}}


def ranges_text(ranges: dict, trace: bool) -> str:
    """Two lines: each stage's figures with their range over the cases."""
    count = len(ranges["cases"])
    scenarios = sorted({(row["scenario"], row["bursts"]) for row in ranges["cases"]})
    what = ", ".join(f"{name} bursts {bursts}" for name, bursts in scenarios)
    seeds = len({row["seed"] for row in ranges["cases"]})
    seed_text = f"{seeds} seed{'s' if seeds > 1 else ''}"
    trace_text = "; decode reads the routing trace" if trace else ""
    lines = [f"over {count} traffic cases ({what}; {seed_text}{trace_text}):"]
    for stage in ("decode", "prefill"):
        rate, imbalance = ranges[stage]["tokens_per_s_per_card"], ranges[stage]["imbalance"]
        lines.append(f"  {stage}: {rate['central']:,.0f} tokens/s per card ({rate['min']:,.0f} to {rate['max']:,.0f}), "
                     f"imbalance {imbalance['central']:.3f} ({imbalance['min']:.3f} to {imbalance['max']:.3f})")
    return "\n".join(lines)
