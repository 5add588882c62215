"""Plain-text tables of scores for the terminal."""

from placement.imbalance_metrics import metrics_line

SCORE_COLUMNS = (
    ("imbalance_mean", "mean"),
    ("imbalance_p99", "p99"),
    ("imbalance_max", "max"),
    ("lower_bound", "bound"),
)


def format_table(rows: list[dict], label_keys: tuple[str, ...], after_keys: tuple[str, ...] = ()) -> str:
    """A fixed-width table: the `label_keys` columns, then mean / p99 / max imbalance and the lower bound, then the
    `after_keys` columns (each row's value as text)."""
    headers = [*label_keys, *(title for _, title in SCORE_COLUMNS), *after_keys]
    cells = [
        [str(row.get(k, "")) for k in label_keys] + [f"{row[key]:.3f}" for key, _ in SCORE_COLUMNS]
        + [str(row.get(k, "")) for k in after_keys] for row in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def yardstick_lines(result: dict) -> str:
    """Two lines under a score table: the yardsticks (noise floor, granularity bound, in-batch bound) and every
    named metric with its noise floor (docs/formats.md, 'Imbalance metrics')."""
    return "\n".join([
        f"yardsticks: noise floor {result['noise_floor']:.3f} (a perfect expectation sampled at this load, static "
        f"split); granularity bound {result['granularity_bound']:.3f} (best replica counts for the "
        f"{result['granularity_from']}); in-batch bound {result['lower_bound']:.3f} (knows each step's noise)",
        "metrics: " + metrics_line(result["metrics"])])

