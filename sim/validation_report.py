"""`eplb sim validate`'s rows and table: each anchor beside the simulator's figure, its metric, its range over the
readings its source leaves open, and how the rows count.

A row counts as a hit when its error is within the project's bar (`within_tolerance`): 15% of a figure, a third of
an imbalance's excess over 1.0; a row with a band or a range (values its source does not state: a trace's prompt
spread, the traffic's skew, bursts and seed) only if every value is. An `open` row (a source that names no metric)
shows its definitions side by side and counts neither way.
"""

from pathlib import Path

from placement.yardsticks import yardsticks_line
from sim.validation import ANCHORS_PATH, ROLES, Anchor, anchor_error, band_values, command, load_anchors, simulate


def validation_rows(anchors: list[Anchor] | None = None, anchors_path: Path = ANCHORS_PATH) -> list[dict]:
    """One row per anchor: name, role, source, conditions, metric (the source's; null for a figure that is no
    imbalance), unit, published, simulated, error (simulated / published - 1, on the excess for an imbalance) and
    the command behind the simulated figure; `band` where the anchor has one, `range` (central, min, max, cases) for
    a request-level imbalance, `definitions` for an open row."""
    from sim.anchor_cases import case_range, open_definitions

    anchors = load_anchors(anchors_path) if anchors is None else anchors
    rows = []
    for anchor in anchors:
        extra = {}
        if anchor.role == "open":
            extra = open_definitions(anchor, anchors_path)
            value = extra["definitions"]["card_step"]["central"]
        else:
            value = simulate(anchor, anchors_path)
        row = {"name": anchor.name, "role": anchor.role, "source": anchor.source,
               "conditions": anchor.conditions, "metric": anchor.metric, "unit": anchor.unit,
               "published": anchor.published, "simulated": value, "error": anchor_error(anchor, value),
               "command": command(anchor), **extra}
        if "band" in anchor.measure:
            band = band_values(anchor, anchors_path)
            row["band"] = [{**entry, "simulated": figure, "error": anchor_error(anchor, figure)}
                           for entry, figure in zip(anchor.measure["band"]["values"], band)]
        if anchor.measure["kind"] == "imbalance":
            row["range"] = case_range(anchor, value)
            for case in row["range"]["cases"]:
                case["error"] = anchor_error(anchor, case["simulated"])
        if anchor.role == "open":
            for definition in row["definitions"].values():
                definition["error"] = anchor_error(anchor, definition["central"])
        rows.append(row)
    return rows


def within_tolerance(row: dict) -> bool:
    """Whether a row's error is within the project's bar: 15% of a figure, a third of an imbalance's excess; a row
    with a band or a range (values its source does not state) only if every value of it is."""
    limit = 1.0 / 3.0 if row["unit"].startswith("max / mean") else 0.15
    errors = [row["error"], *(entry["error"] for entry in row.get("band", ())),
              *(case["error"] for case in row.get("range", {}).get("cases", ()))]
    return all(abs(error) <= limit for error in errors)


def validation_text(rows: list[dict]) -> str:
    """The rows as a table, fitted rows first, then each band, range and open row's definitions, and the count."""
    width = max([len("anchor"), *(len(row["name"]) for row in rows)])
    lines = [f"{'anchor':{width}} {'role':9} {'published':>11} {'simulated':>11} {'error':>7}  unit"]
    for role in ROLES:
        for row in (r for r in rows if r["role"] == role):
            error = f"{'-':>7}" if row["role"] == "open" else f"{row['error']:+7.1%}"  # an open row is not judged
            lines.append(f"{row['name']:{width}} {row['role']:9} {_figure(row['published']):>11} "
                         f"{_figure(row['simulated']):>11} {error}  {row['unit']}"
                         + (f" ({row['metric']})" if row.get("metric") else ""))
    for row in rows:
        if "band" in row:
            errors = [entry["error"] for entry in row["band"]]
            lines.append(f"{row['name']}: over its band ({', '.join(entry['trace'] for entry in row['band'])}) "
                         f"{min(errors):+.1%} to {max(errors):+.1%}")
        if "range" in row:
            found = row["range"]
            errors = [case["error"] for case in found["cases"]]
            lines.append(f"{row['name']}: over {len(found['cases'])} traffic cases {found['min']:.4g} to "
                         f"{found['max']:.4g} ({min(errors):+.1%} to {max(errors):+.1%})")
        if "definitions" in row:
            lines.append(f"{row['name']} ({_figure(row['published'])}; its source names no level or window), every "
                         f"definition at {row['tokens_per_card']:.1f} tokens per card a micro-batch, range over "
                         f"{row['cases']} traffic cases:")
            for name, found in row["definitions"].items():
                lines.append(f"  {name:17} {found['central']:.3f} ({found['min']:.3f} to {found['max']:.3f}), noise "
                             f"floor {found['noise_floor']:.3f}: {found['definition']}")
            if "yardsticks" in row:
                lines.append(f"  yardsticks at that load: {yardsticks_line(row['yardsticks'])}")
    roles = {role: sum(r["role"] == role for r in rows) for role in ROLES}
    predicted = [r for r in rows if r["role"] == "predicted"]
    lines.append(f"rows: {roles['fitted']} fitted, {roles['identity']} identity, {roles['predicted']} predicted, "
                 f"{roles['open']} open (no metric named: counted neither way); predicted rows within 15% (imbalance "
                 f"rows: a third of the excess over 1.0; a band or a range: all of it): "
                 f"{sum(map(within_tolerance, predicted))} of {len(predicted)}")
    return "\n".join(lines)


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"
