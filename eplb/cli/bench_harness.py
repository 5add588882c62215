"""What every bench shares: its parser, its `--json` flag, its tables and its output.

A bench's question is the first line of its docstring; `bench_parser` shows it (or the whole docstring) as the help,
refuses a bad flag in one line with exit 2 (`OneLineParser`), and adds `--json`. `markdown_table` sets rows of cells
as the tables docs/benchmarks.md holds; `finish` prints the tables and writes the rows as JSON atomically (whole, or
not at all), so an interrupted bench never leaves half a file. A generator kept aside (`scripts/aside_*.py`) runs
as a script with `generator_parser`'s flags and prints `trace_summary`'s lines.
"""

import argparse
import json
from collections.abc import Iterable, Sequence

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer, json_output, number
from eplb.cli.flags import OneLineParser
from traces.atomic_file import write_text_atomically


def bench_parser(doc: str, whole_doc: bool = False,
                 json_help: str | None = "also write the rows here as JSON") -> argparse.ArgumentParser:
    """The bench's parser: the docstring's first paragraph as its description (all of it with `whole_doc`, for a
    bench whose sections the docstring lists) and, unless `json_help` is None, a `--json PATH` flag (a new file's
    path, checked before any work)."""
    if whole_doc:
        parser = OneLineParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        parser = OneLineParser(description=doc.split("\n\n")[0])
    if json_help is not None:
        parser.add_argument("--json", type=json_output(), default=None, help=json_help)
    return parser


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: `header` [C] cell texts, then each row's C cells (str() of each)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(value: object, spec: str = "") -> str:
    """`value` formatted by `spec`, or "-" where it is None (a figure a row does not have)."""
    return "-" if value is None else format(value, spec)


def finish(json_path: str | None, result: object, *tables: str) -> int:
    """Print `tables` (a blank line between two) and, with `json_path`, write `result` there as JSON atomically;
    returns the bench's exit status, 0."""
    print("\n\n".join(tables))
    if json_path:
        write_text_atomically(json_path, json.dumps(result, indent=1) + "\n")
    return 0


def generator_parser(doc: str) -> argparse.ArgumentParser:
    """A kept-aside generator's parser: the docstring's first paragraph as its description, `--steps`, `--layers`,
    `--tokens-per-step` (at most that many tokens a step), `--sigma` (the popularity spread) and `--seed`."""
    parser = OneLineParser(description=doc.split("\n\n")[0])
    parser.add_argument("--steps", type=integer(100, 5000), default=300, help="steps (default: %(default)s)")
    parser.add_argument("--layers", type=integer(1, 64), default=4, help="layers (default: %(default)s)")
    parser.add_argument("--tokens-per-step", type=integer(1, 10**6), default=144 * 128,
                        help="tokens a step (default: %(default)s, 144 GPUs x 128)")
    parser.add_argument("--sigma", type=number(0, high=4), default=1.2, help="popularity spread (default: %(default)s)")
    parser.add_argument("--seed", type=integer(0, SEED_MAX), default=1, help="trace seed (default: %(default)s)")
    return parser


def trace_summary(counts_TLE: np.ndarray, top_k: int) -> list[str]:
    """What a trace [T >= 100, L, E] of top-`top_k` picks looks like: per layer the hottest expert's share of the picks
    and the share of the picks that change experts between the first and the last 50 steps; then the batch's size."""
    share_L = counts_TLE.sum(axis=0).max(axis=1) / counts_TLE.sum(axis=(0, 2))
    early, late = counts_TLE[:50].sum(axis=0), counts_TLE[-50:].sum(axis=0)
    moved_L = 0.5 * np.abs(early / early.sum(axis=1, keepdims=True) - late / late.sum(axis=1, keepdims=True)).sum(axis=1)
    lines = [f"layer {layer}: hottest expert {share:.2%} of the picks; {moved:.1%} of the picks change experts between "
             "the first and the last 50 steps" for layer, (share, moved) in enumerate(zip(share_L, moved_L))]
    batch_T = counts_TLE[:, 0].sum(axis=1) / top_k
    return lines + [f"batch: {batch_T.mean():.0f} tokens a step on average, {batch_T.min():.0f} to {batch_T.max():.0f}"]
