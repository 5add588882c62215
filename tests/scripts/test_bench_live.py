"""The live bench's planning, noise and demo-runs sections run end to end on their quick shapes (smoke tests, not
timing tests): every row printed, a rank's part of the plan decodes in less time than planning the moves itself,
and the demo's repeated runs lose no token and pool into one ratio with an interval, beside a placebo's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_live.py"


@pytest.fixture
def run_bench(load_script):
    """`run_bench(*argv)`: the bench's `main` in this process, the script loaded by its path."""
    return lambda *argv: load_script("bench_live").main(list(argv))


def test_plan_section_prints_every_row(run_bench, capsys):
    assert run_bench("--section", "plan", "--quick") == 0
    out = capsys.readouterr().out
    for row in ("| plan (fills and rounds) |", "| encode |", "| decode the whole plan |", "| decode this rank's part |"):
        assert row in out, row
    ratio = float(re.search(r"a rank spends ([\d.]+)x the time", out).group(1))
    assert ratio < 1


def test_noise_section_prints_every_row():
    # A process of its own: the timed compute runs in spawned processes, which import the script by its path.
    result = subprocess.run([sys.executable, str(SCRIPT), "--section", "noise", "--quick", "--world-size", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| decode loop", "| fixed compute"))]
    assert len(rows) == 3, result.stdout
    for row in rows:
        median, share, tail = (cell.strip() for cell in row.strip("|").split("|")[1:])
        assert float(median) > 0 and 0 <= float(share.rstrip("%")) <= 100 and float(tail) >= 1


def test_demo_runs_section_reports_every_run_and_the_pooled_ratio(run_bench, capsys):
    assert run_bench("--section", "demo-runs", "--quick") == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 2, out
    assert all(row.rstrip().endswith("| 0 |") for row in rows)  # no token lost in any run
    under, runs = map(int, re.search(r"runs under 1.10: (\d+) of (\d+)", out).groups())
    assert runs == 2 and 0 <= under <= 2
    ratio, low, high = map(float, re.search(
        r"p99 ratio ([\d.]+) \(90% interval over runs ([\d.]+)-([\d.]+)\)", out).groups())
    assert ratio > 0 and 0 < low <= high
    placebo = re.search(r"placebo .* runs under 1.10: (\d+) of (\d+) .* pooled p99 ratio ([\d.]+)", out)
    assert placebo and int(placebo.group(2)) == 2 and float(placebo.group(3)) > 0


def test_host_copies_section_prints_a_row_per_policy_and_failures_tolerated(run_bench, capsys):
    assert run_bench("--section", "host-copies", "--quick") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 16 x 5 |")]
    assert len(rows) == 6
    most = {(row.split("|")[2].strip(), int(row.split("|")[3])): int(row.split("|")[5]) for row in rows}
    for policy in ("deepseek", "cpsat"):  # each failure more tolerated costs more host copies
        assert 0 < most[policy, 1] < most[policy, 2] < most[policy, 3]


def test_demo_switches_section_counts_the_runs_that_switched_before_the_kill(run_bench, capsys):
    assert run_bench("--section", "demo-switches", "--quick", "--runs", "1") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| `--world-size 3")]
    assert len(rows) == 1
    runs, good = (int(cell) for cell in rows[0].split("|")[2:4])
    assert runs == 1 and good in (0, 1)
    assert "(20)" in rows[0]  # the step the rank is killed in
