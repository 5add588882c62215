"""argparse types for the scripts' flags: a value out of range is refused in the parser, with one line that names the
bound and the text given (`OneLineParser` prints it as `argument --flag: expected ..., got ...`)."""

import argparse
import math


def integer(low: int, high: int | None = None):
    """An argparse type: an integer >= low (and <= high when given); a bad value names the bound and the text."""
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {text}")
        return value

    return parse


def number(low: float, *, low_open: bool = False, high: float | None = None, or_exactly: float | None = None):
    """An argparse type: a finite number >= low (> low when `low_open`) and <= high when given, or `or_exactly`."""
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    bound = bound if high is None else f"{bound} and <= {high:g}"
    bound = bound if or_exactly is None else f"{or_exactly:g} or {bound}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        fits = math.isfinite(value) and (value > low if low_open else value >= low) and (high is None or value <= high)
        if not (fits or value == or_exactly):
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text}")
        return value

    return parse
