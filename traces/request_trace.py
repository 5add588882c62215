"""Request traces for the serving simulator: arrival time, prompt and output lengths, prefix blocks.

Formats (chosen by suffix):
- Mooncake `.jsonl` (kvcache-ai/Mooncake FAST25 traces): one JSON object a line,
  `{"timestamp": ms since trace start, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}`;
  `hash_ids` name the prompt's 512-token prefix blocks in order (the last block may be partial), so two requests that
  share a leading run of ids share that prefix.
- Azure LLM inference trace `.csv` (Azure/AzurePublicDataset, 2023): header `TIMESTAMP,ContextTokens,GeneratedTokens`,
  absolute timestamps such as `2023-11-16 18:15:46.6805900`; no prefix blocks. An optional `NumImages` column (the
  2025 multimodal trace's schema) is read into `Request.images`.

Both give `Request`s sorted by arrival, with `arrival_s` counted from the trace's earliest request.

A malformed line is refused in one line naming the file, the line and the field. What the message repeats of the
file is capped (`SHOWN_CHARS`), and nothing of it is repeated when the path is a symbolic link: the error of a trace
linked to another file (`/etc/shadow`) must not print that file.
"""

import csv
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from traces.errors import TraceFormatError

TRAFFIC_CLASSES = ("chat", "agent")
MOONCAKE_FIELDS = "timestamp (ms), input_length, output_length and hash_ids"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SUPPORTED = "a Mooncake .jsonl trace or an Azure LLM inference .csv trace"

# `YYYY-MM-DD HH:MM:SS` (or with a `T`), then an optional fraction of any length: whole seconds and the fraction are
# kept apart so that the 100 ns digits of the Azure timestamps survive the subtraction of the first arrival.
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(\.\d+)?")
_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)
SHOWN_CHARS = 40  # the most characters of a value an error repeats


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request of a trace.

    Attributes:
        arrival_s: seconds since the trace's earliest request (>= 0).
        input_tokens: prompt length in tokens (>= 1).
        output_tokens: tokens generated, the first one included (>= 1).
        block_hashes: ids of the prompt's 512-token prefix blocks, in prompt order (Mooncake `hash_ids`); the last
            block may be partial; () when the trace has no prefix information.
        traffic_class: "chat" or "agent"; picks the retention of the persistent KV cache.
        images: images attached to the prompt (vision stage); 0 for text-only traces.
        session: conversation id for multi-turn synthetic traffic; -1 = none.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()
    traffic_class: str = "chat"
    images: int = 0
    session: int = -1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"arrival_s must be a finite number of seconds >= 0; found {self.arrival_s}")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"input_tokens and output_tokens must be >= 1; found {self.input_tokens} and {self.output_tokens}"
            )
        if self.traffic_class not in TRAFFIC_CLASSES:
            raise ValueError(f"traffic_class must be one of {TRAFFIC_CLASSES}; found {self.traffic_class!r}")
        if self.images < 0 or self.session < -1:
            raise ValueError(f"images must be >= 0 and session >= -1 (-1: none); found {self.images}, {self.session}")


def load_request_trace(
    path: str | os.PathLike, *, traffic_class: str = "chat", limit: int | None = None
) -> list[Request]:
    """Read the requests of a Mooncake `.jsonl` or Azure `.csv` trace, sorted by arrival (ties keep file order).

    A zero output length is read as 1 (every request emits at least the token its prefill produces); the Mooncake
    and Azure 2023 traces hold no such row (figures: docs/formats.md, 'Request traces').
    Blank lines are skipped.

    Args:
        path: the trace file; its suffix picks the format.
        traffic_class: "chat" or "agent", given to every request (neither format records it).
        limit: keep only the `limit` earliest requests (default: all); the whole file is still read and checked.

    Returns:
        The requests; `arrival_s` is 0 for the earliest.

    Raises:
        TraceFormatError: the file is missing, empty, has an unknown suffix, or a line lacks a field or holds a
            non-numeric or negative value; the message names the file and line.
        ValueError: `traffic_class` or `limit` is invalid.
    """
    if traffic_class not in TRAFFIC_CLASSES:
        raise ValueError(f"traffic_class must be one of {TRAFFIC_CLASSES}; found {traffic_class!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None (all requests); found {limit!r}")
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise TraceFormatError(f"unknown request-trace format '{suffix}' for {file}; expected {SUPPORTED}")
    if not file.is_file():
        raise TraceFormatError(f"request trace not found: {file}; expected {SUPPORTED}")
    shown = _Shown(os.path.islink(file))
    try:
        with open(file, encoding="utf-8-sig", newline="") as f:
            rows = _read_mooncake(f, file, shown) if suffix == ".jsonl" else _read_azure(f, file, shown)
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{file} is not UTF-8 text ({exc.reason}); expected {SUPPORTED}") from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read {file}: {exc.strerror or exc}; expected {SUPPORTED}") from None
    if not rows:
        raise TraceFormatError(f"{file} holds no requests; expected {SUPPORTED} with at least one request")
    rows.sort(key=lambda row: row[0])
    if limit is not None:
        rows = rows[:limit]
    first = rows[0][0]
    return [
        Request(
            arrival_s=float(time - first),
            input_tokens=inp,
            output_tokens=max(out, 1),
            block_hashes=blocks,
            traffic_class=traffic_class,
            images=images,
        )
        for time, inp, out, blocks, images in rows
    ]


# A row before conversion to `Request`: (arrival key in seconds, input, output, block hashes, images).
_Row = tuple[float, int, int, tuple[int, ...], int]


def _read_mooncake(f, file: Path, shown: "_Shown") -> list[_Row]:
    rows: list[_Row] = []
    for number, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(
                f"{file} line {number}: not valid JSON ({exc.msg} at column {exc.colno}); "
                f"expected one object a line with {MOONCAKE_FIELDS}"
            ) from None
        except (ValueError, RecursionError) as exc:  # an integer past Python's digit limit, arrays nested too deep
            why = "a number too long" if isinstance(exc, ValueError) else "arrays or objects nested too deeply"
            raise TraceFormatError(f"{file} line {number}: {why} to read; expected one object a line with "
                                   f"{MOONCAKE_FIELDS}") from None
        if not isinstance(obj, dict):
            raise TraceFormatError(
                f"{file} line {number}: found a JSON {type(obj).__name__}; expected an object with {MOONCAKE_FIELDS}"
            )
        missing = [key for key in ("timestamp", "input_length", "output_length", "hash_ids") if key not in obj]
        if missing:
            raise TraceFormatError(
                f"{file} line {number}: missing field {', '.join(missing)}; each line needs {MOONCAKE_FIELDS}"
            )
        timestamp = obj["timestamp"]
        if type(timestamp) not in (int, float) or not math.isfinite(timestamp) or timestamp < 0:
            raise TraceFormatError(
                f"{file} line {number}: timestamp={shown(timestamp)}; expected a finite number of milliseconds >= 0"
            )
        inp = _count(obj["input_length"], "input_length", 1, file, number, shown)
        out = _count(obj["output_length"], "output_length", 1, file, number, shown)
        hashes = obj["hash_ids"]
        if not isinstance(hashes, list) or any(type(h) is not int for h in hashes):
            raise TraceFormatError(
                f"{file} line {number}: hash_ids must be a list of integer block ids; found {shown(hashes)}"
            )
        rows.append((timestamp / 1000.0, inp, out, tuple(hashes), 0))
    return rows


def _read_azure(f, file: Path, shown: "_Shown") -> list[_Row]:
    reader = csv.reader(f)
    try:
        return _azure_rows(reader, file, shown)
    except csv.Error as exc:  # a field past csv's limit (128 KiB), a NUL byte
        raise TraceFormatError(f"{file} line {reader.line_num}: not CSV that can be read ({exc}); expected "
                               f"{','.join(AZURE_COLUMNS)} rows") from None


def _azure_rows(reader, file: Path, shown: "_Shown") -> list[_Row]:
    header = next(reader, None)
    if header is None:
        return []
    columns = [name.strip() for name in header]
    missing = [name for name in AZURE_COLUMNS if name not in columns]
    if missing:
        raise TraceFormatError(
            f"{file} line 1: header lacks {', '.join(missing)}; "
            f"expected {','.join(AZURE_COLUMNS)} (and optionally NumImages)"
        )
    at_time, at_in, at_out = (columns.index(name) for name in AZURE_COLUMNS)
    at_images = columns.index("NumImages") if "NumImages" in columns else None
    rows: list[_Row] = []
    base = None  # whole seconds of the first row: keys are kept small so float keeps the 100 ns digits
    for fields in reader:
        number = reader.line_num
        if not fields or not "".join(fields).strip():
            continue
        if len(fields) != len(columns):
            raise TraceFormatError(
                f"{file} line {number}: {len(fields)} fields; expected {len(columns)}, one per column of the header"
            )
        inp = _count(_integer(fields[at_in], "ContextTokens", file, number, shown), "ContextTokens", 1, file, number,
                     shown)
        out = _count(_integer(fields[at_out], "GeneratedTokens", file, number, shown), "GeneratedTokens", 1, file,
                     number, shown)
        images = 0
        if at_images is not None:
            images = _count(_integer(fields[at_images], "NumImages", file, number, shown), "NumImages", 0, file,
                            number, shown)
        whole, fraction = _azure_time(fields[at_time], file, number, shown)
        base = whole if base is None else base
        rows.append((whole - base + fraction, inp, out, (), images))
    return rows


def _azure_time(text: str, file: Path, number: int, shown: "_Shown") -> tuple[int, float]:
    """A naive Azure timestamp as (whole seconds since 1970-01-01, fraction of a second in [0, 1))."""
    match = _AZURE_TIME.fullmatch(text.strip())
    if match is None:
        raise TraceFormatError(
            f"{file} line {number}: TIMESTAMP={shown(text)}; expected a date and time like 2023-11-16 18:15:46.6805900"
        )
    try:
        whole = datetime.fromisoformat(match.group(1))
    except ValueError:
        raise TraceFormatError(f"{file} line {number}: TIMESTAMP={shown(text)} is not a valid date and "
                               f"time") from None
    fraction = float("0" + match.group(2)) if match.group(2) else 0.0
    return (whole - _EPOCH) // _ONE_SECOND, fraction


def _integer(text: str, name: str, file: Path, number: int, shown: "_Shown") -> int:
    if len(text.strip()) > 20:  # beyond any token count, and past int()'s digit limit at 4,300
        raise TraceFormatError(f"{file} line {number}: {name}={shown(text)}; expected a whole number of tokens")
    try:
        return int(text)
    except ValueError:
        raise TraceFormatError(f"{file} line {number}: {name}={shown(text)}; expected a whole number of "
                               f"tokens") from None


MAX_REQUEST_TOKENS = 10**7  # tokens one request's prompt or output may have: beyond any served context window


def _count(value, name: str, least: int, file: Path, number: int, shown: "_Shown") -> int:
    """`value` as an int in [`least`, MAX_REQUEST_TOKENS], else a TraceFormatError naming the field."""
    if type(value) is not int:
        raise TraceFormatError(f"{file} line {number}: {name}={shown(value)}; expected a whole number of tokens")
    if not least <= value <= MAX_REQUEST_TOKENS:
        raise TraceFormatError(f"{file} line {number}: {name}={shown(value)}; expected a whole number of tokens in "
                               f"[{least}, {MAX_REQUEST_TOKENS}]")
    return value


class _Shown:
    """How an error repeats a value read from the file: its repr cut to SHOWN_CHARS, or nothing of it when the trace
    is a symbolic link (the file it points to may be anyone's)."""

    def __init__(self, linked: bool) -> None:
        self.linked = linked

    def __call__(self, value) -> str:
        if self.linked:
            return "(a value not shown: the trace is a symbolic link)"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 64:
            return f"(an integer of {abs(value).bit_length()} bits)"  # repr() of a huge int is slow, or refused
        text = repr(value)
        return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."

