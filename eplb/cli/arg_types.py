"""argparse types for the flags of `eplb` and the scripts: a value out of range is refused in the parser, with one line
that names the bound and the text given (`OneLineParser` prints it as `argument --flag: expected ..., got ...`)."""

import argparse
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

from placement.cluster import MAX_GPUS, MAX_SLOTS_PER_GPU
from traces import EplbError
from traces.atomic_file import resolve_target

SEED_MAX = 2**31 - 1  # the largest seed OR-Tools' CP-SAT takes (`CpSatConfig.seed`); numpy's seeds go beyond


def bounded(kind: Callable[[str], float], low: float, *, low_open: bool = False, high: float | None = None):
    """An argparse type: a finite number of `kind` >= low (> low when `low_open`) and <= high when given."""
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    limit = f" and <= {high:g}" if high is not None else ""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}{limit}; got {text!r}") from None
        too_high = high is not None and value > high
        if not math.isfinite(value) or value < low or (low_open and value == low) or too_high:
            raise argparse.ArgumentTypeError(f"must be {bound}{limit}; got {text}")
        return value

    return parse


# The bounded types the `eplb` subcommands share.
POSITIVE_INT = bounded(int, 1)
NON_NEGATIVE_INT = bounded(int, 0)
POSITIVE_FLOAT = bounded(float, 0, low_open=True)
NON_NEGATIVE_FLOAT = bounded(float, 0)
GPUS = bounded(int, 1, high=MAX_GPUS)
SLOTS_PER_GPU = bounded(int, 1, high=MAX_SLOTS_PER_GPU)
DRIFT_RATIO = bounded(float, 1, low_open=True)
BURST_FACTOR = bounded(float, 1)
WORK_LIMIT = bounded(float, 0, low_open=True, high=1e6)
TIME_LIMIT = bounded(float, 0, low_open=True, high=86400)
SEED = bounded(int, 0, high=SEED_MAX)


def layout(text: str) -> tuple[int, int]:
    """'GxS' -> (G, S): GPUs and slots per GPU of a layout."""
    try:
        gpus, slots = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPUsxSLOTS such as 144x2; got {text!r}") from None
    if not (1 <= gpus <= MAX_GPUS and 1 <= slots <= MAX_SLOTS_PER_GPU):
        raise argparse.ArgumentTypeError(f"{text}: GPUs must be in [1, {MAX_GPUS}] and slots per GPU in [1, "
                                         f"{MAX_SLOTS_PER_GPU}]")
    return gpus, slots


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


def one_of(names):
    """An argparse type: one of `names` (for the parts of a `comma_separated` flag; a whole flag takes `choices`)."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got {text}")
        return text

    return parse


def comma_separated(item):
    """An argparse type: a comma-separated list, each part parsed by `item` (`integer`, `number`, `one_of`); a bad
    part is refused with `item`'s line."""

    def parse(text: str) -> list:
        return [item(part) for part in text.split(",")]

    return parse


def json_output():
    """An argparse type: a path a script writes a JSON file to at its end (atomically). Refused at once, before any
    work: a folder, a device, a path whose folder is missing or not writable, and an existing file that is not JSON
    (a script's own earlier output may be replaced; a source file, a document or another input may not)."""
    return _output("JSON", _holds_json)


def png_output():
    """An argparse type: a path a script writes a PNG figure to at its end (atomically), refused as `json_output`
    refuses, an existing file that is not a PNG included."""
    return _output("PNG", holds_png)


def _output(kind: str, holds_kind):
    def parse(text: str) -> Path:
        path = Path(text)
        try:
            target = resolve_target(path)
        except EplbError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not target.parent.is_dir():
            raise argparse.ArgumentTypeError(f"folder {target.parent} does not exist; create it first")
        if not os.access(target.parent, os.W_OK):
            raise argparse.ArgumentTypeError(f"folder {target.parent} is not writable; give a path you can write")
        if target.exists() and target.stat().st_size and not holds_kind(target):
            raise argparse.ArgumentTypeError(f"{path} exists and is not a {kind} file of this script's kind; give a "
                                             f"new path (this would replace it), or remove it first")
        return path

    parse.writes = kind  # marks an output flag's type (the scripts' flag fuzz tells outputs from numbers by it)
    return parse


def _holds_json(path: Path) -> bool:
    """JSON that is not a placement file (a script's rows never replace a placement a worker may load)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return not (isinstance(data, dict) and "physical_to_logical_map" in data)


def holds_png(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False
