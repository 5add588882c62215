"""Plain-text tables of scores for the terminal."""

SCORE_COLUMNS = (
    ("imbalance_mean", "mean"),
    ("imbalance_p99", "p99"),
    ("imbalance_max", "max"),
    ("lower_bound", "bound"),
)


def format_table(rows: list[dict], label_keys: tuple[str, ...]) -> str:
    """A fixed-width table: the `label_keys` columns, then mean / p99 / max imbalance and the lower bound."""
    headers = [*label_keys, *(title for _, title in SCORE_COLUMNS)]
    cells = [
        [str(row.get(k, "")) for k in label_keys] + [f"{row[key]:.3f}" for key, _ in SCORE_COLUMNS] for row in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


METRIC_LABELS = {"card_step": "card/step", "node_step": "node/step", "card_window_10": "card/10 steps",
                 "card_window_100": "card/100 steps", "card_window_1000": "card/1000 steps",
                 "group_step": "group/step"}


def yardstick_lines(result: dict) -> str:
    """Two lines under a score table: the yardsticks (noise floor, granularity bound, in-batch bound) and every
    named metric with its noise floor (docs/formats.md, 'Imbalance metrics')."""
    lines = [f"yardsticks: noise floor {result['noise_floor']:.3f} (a perfect expectation sampled at this load, "
             f"static split); granularity bound {result['granularity_bound']:.3f} (best replica counts for the "
             f"{result['granularity_from']}); in-batch bound {result['lower_bound']:.3f} (knows each step's noise)"]
    cells = []
    for name, metric in result["metrics"].items():
        label = METRIC_LABELS.get(name, name)
        if metric["value"] is None:
            cells.append(f"{label} - ({metric['why']})")
        else:
            cells.append(f"{label} {metric['value']:.3f} (floor {metric['noise_floor']:.3f})")
    lines.append("metrics: " + "; ".join(cells))
    return "\n".join(lines)
