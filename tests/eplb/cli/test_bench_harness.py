"""`eplb.cli.bench_harness`: the benches' tables, their JSON written whole, and their parsers' one-line refusals."""

import json

import numpy as np
import pytest

from eplb.cli.bench_harness import bench_parser, cell, finish, generator_parser, markdown_table, trace_summary


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


def test_a_generators_summary_gives_each_layers_hottest_share_its_drift_and_the_batch():
    counts_TLE = np.zeros((100, 2, 4), dtype=np.int64)
    counts_TLE[:, 0] = [6, 2, 0, 0]  # 4 tokens a step, top-2; layer 0 never moves
    counts_TLE[:50, 1] = [4, 4, 0, 0]
    counts_TLE[50:, 1] = [0, 0, 4, 4]  # layer 1 moves every pick at step 50
    lines = trace_summary(counts_TLE, top_k=2)
    assert lines[0].startswith("layer 0: hottest expert 75.00% of the picks; 0.0% of the picks change")
    assert lines[1].startswith("layer 1: hottest expert 25.00% of the picks; 100.0% of the picks change")
    assert lines[2] == "batch: 4 tokens a step on average, 4 to 4"


def test_a_generators_parser_bounds_its_flags():
    parser = generator_parser("Which traffic?\n\nMore text.")
    args = parser.parse_args(["--steps", "200", "--sigma", "0.6"])
    assert (args.steps, args.layers, args.sigma, args.seed) == (200, 4, 0.6, 1) and parser.description == "Which traffic?"
    with pytest.raises(SystemExit):
        parser.parse_args(["--steps", "10"])
