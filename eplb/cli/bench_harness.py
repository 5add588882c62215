"""What every bench shares: its parser, its `--json` flag, its tables and its output.

A bench's question is the first line of its docstring; `bench_parser` shows it (or the whole docstring) as the help,
refuses a bad flag in one line with exit 2 (`OneLineParser`), and adds `--json`. `markdown_table` sets rows of cells
as the tables docs/benchmarks.md holds; `finish` prints the tables and writes the rows as JSON atomically (whole, or
not at all), so an interrupted bench never leaves half a file.
"""

import argparse
import json
from collections.abc import Iterable, Sequence

from eplb.cli.arg_types import json_output
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
