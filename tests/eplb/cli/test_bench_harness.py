"""`eplb.cli.bench_harness`: the benches' tables, their JSON written whole, and their parsers' one-line refusals."""

import json

import pytest

from eplb.cli.bench_harness import bench_parser, cell, finish, markdown_table


def test_a_table_has_its_header_its_rule_and_one_line_a_row():
    text = markdown_table(("shape", "imbalance"), [("144 x 2", 1.25), ("72 x 4", cell(None, ".4f"))])
    assert text.splitlines() == ["| shape | imbalance |", "|---|---|", "| 144 x 2 | 1.25 |", "| 72 x 4 | - |"]
    assert cell(0.5, ".0%") == "50%"


def test_finish_prints_the_tables_and_writes_the_rows_whole(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert finish(str(out), [{"row": 1}], "table one", "table two") == 0
    assert capsys.readouterr().out == "table one\n\ntable two\n"
    assert json.loads(out.read_text()) == [{"row": 1}]
    assert finish(None, [{"row": 2}], "alone") == 0 and capsys.readouterr().out == "alone\n"


@pytest.mark.parametrize("argv", [["--json", "notes.txt"], ["--json", "no-such-folder/rows.json"], ["--no-such-flag"]])
def test_the_parser_refuses_a_bad_flag_in_one_line(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a document, not a bench's rows\n")  # never replaced by --json
    parser = bench_parser("Which question?\n\nMore text.")
    assert parser.description == "Which question?"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_bench_without_json_output_has_no_json_flag():
    parser = bench_parser("Which question?", whole_doc=True, json_help=None)
    assert "--json" not in parser.format_help() and parser.description == "Which question?"
