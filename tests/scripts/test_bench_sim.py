"""The simulator's fleet bench and the speculative-decoding bench run end to end on their quick settings (smoke
tests, not timing tests): every table has its rows and columns, every figure is finite and positive where it must
be, the differences printed are the figures' own, a policy that should not be worse is not worse, and the fleet
model agrees with the request-by-request run where both run. No figure of a run is pinned."""

import math
import re
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NUMBER = re.compile(r"^[$+-]*[\d,]*\.?\d+(?:e[+-]?\d+)?%?$")


def _number(cell: str) -> float:
    """A printed figure as a float: '$1,234.5' -> 1234.5, '+6.2%' -> 0.062, 'nan' -> nan."""
    text = cell.strip()
    if text == "nan":
        return math.nan
    assert NUMBER.match(text), f"not a number: {cell!r}"
    value = float(text.replace(",", "").replace("$", "").rstrip("%"))
    return value / 100 if text.endswith("%") else value


def _table(out: str, header: str) -> tuple[list[str], list[list[str]]]:
    """The markdown table whose header row starts with `header`: (column names, rows of cells)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    columns, separator, *rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
                                 for line in lines[start:end]]
    assert set(separator) == {"---"} and len(separator) == len(columns), "the header's separator row"
    assert rows and all(len(row) == len(columns) for row in rows), "every row has every column"
    return columns, rows


@pytest.fixture(scope="module")
def fleet_bench(load_script) -> tuple[object, str]:
    import contextlib
    import io

    module = load_script("bench_sim")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert module.main(["--section", "fleet", "--quick"]) == 0
    return module, out.getvalue()


def test_fleet_bench_prints_the_published_day_beside_the_simulated_one(fleet_bench):
    module, out = fleet_bench
    columns, rows = _table(out, "| figure | published |")
    assert columns == ["figure", "published", "simulated", "difference"]
    assert [row[0] for row in rows] == list(module.PUBLISHED_FEB)
    for name, published, simulated, difference in rows:
        published, simulated = _number(published), _number(simulated)
        assert published == pytest.approx(module.PUBLISHED_FEB[name]), name
        assert math.isfinite(simulated) and simulated > 0, name
        assert _number(difference) == pytest.approx(simulated / published - 1, abs=0.0006), name


def test_fleet_bench_autoscaled_waits_no_longer_than_a_fixed_split_of_the_same_node_hours(fleet_bench):
    _, out = fleet_bench
    line = next(line for line in out.splitlines() if line.startswith("autoscaled vs a fixed split"))
    found = re.search(r"p50 ([\d.,]+) / ([\d.,]+) s, p99 ([\d.,]+) / ([\d.,]+) s, cost \$([\d,]+) / \$([\d,]+), "
                      r"requests lost ([\d,]+) / ([\d,]+)", line)
    assert found, line
    p50, p50_fixed, p99, p99_fixed, cost, cost_fixed, lost, lost_fixed = map(_number, found.groups())
    assert p50 <= p50_fixed and p99 <= p99_fixed and lost <= lost_fixed
    assert cost == pytest.approx(cost_fixed, rel=0.05)  # the same node-hours cost about the same


def test_fleet_bench_faults_table_covers_each_handling_with_and_without_spares(fleet_bench):
    _, out = fleet_bench
    columns, rows = _table(out, "| handling | spare nodes per stage |")
    assert len(columns) == 9
    assert [(row[0], row[1]) for row in rows] == [("reroute", "1"), ("reroute", "0"), ("restart", "1"),
                                                  ("restart", "0")]
    by_case = {}
    for handling, spares, *figures in rows:
        values = [_number(cell) for cell in figures]
        assert all(math.isfinite(value) and value >= 0 for value in values), figures
        failures, covered, requeued, lost, wait_p99, wait_max, spare_cost = values
        assert failures > 0 and covered <= failures and wait_p99 <= wait_max
        assert (covered == 0 and spare_cost == 0) if spares == "0" else spare_cost > 0
        by_case[handling, spares] = requeued, wait_max
    for spares in ("0", "1"):  # restarting the unit re-queues all of it and waits at least as long as rerouting
        assert by_case["restart", spares][0] > by_case["reroute", spares][0]
        assert by_case["restart", spares][1] >= by_case["reroute", spares][1]


def test_fleet_bench_seed_fleet_line_is_consistent(fleet_bench):
    _, out = fleet_bench
    line = next(line for line in out.splitlines() if line.startswith("seed fleet"))
    found = re.search(r"([\d,]+) nodes on average \(([\d,]+) cards\), peak ([\d,]+); revenue at R1's valley price "
                      r"\$([\d.]+) per card-hour \(list price: \$([\d.]+)\)", line)
    assert found, line
    nodes, cards, peak, valley, listed = map(_number, found.groups())
    assert 0 < nodes <= peak and cards == pytest.approx(8 * nodes, abs=8)
    assert 0 < valley <= listed


def test_fleet_bench_fleet_model_agrees_with_the_request_level_run_within_10_percent(fleet_bench):
    _, out = fleet_bench
    columns, rows = _table(out, "| run | figure | request by request")
    assert len(columns) == 5
    assert [row[0] for row in rows] == ["decode saturated", "prefill saturated"]
    for _, _, request_level, fleet_level, difference in rows:
        request_level, fleet_level = _number(request_level), _number(fleet_level)
        assert request_level > 0 and fleet_level > 0
        assert _number(difference) == pytest.approx(fleet_level / request_level - 1, abs=0.001)
        assert abs(_number(difference)) < 0.10


def test_speculative_bench_tables_hold_for_every_acceptance_and_batch(load_script, capsys):
    module = load_script("bench_speculative")
    assert module.main(["--quick"]) == 0
    out = capsys.readouterr().out
    policies = ("all", "first_n", "threshold")
    columns, per_step = _table(out, "| first acceptance | all tok/step")
    assert len(columns) == 1 + 2 * len(policies)
    acceptances = [_number(row[0]) for row in per_step]
    assert len(acceptances) >= 2 and acceptances == sorted(acceptances)
    draft_tokens = 5  # SpeculativeConfig's default k
    tokens = {policy: [_number(row[1 + 2 * i]) for row in per_step] for i, policy in enumerate(policies)}
    for i, policy in enumerate(policies):
        assert all(1 <= value <= 1 + draft_tokens for value in tokens[policy]), policy
        assert tokens[policy] == sorted(tokens[policy]), f"{policy}: more acceptance, more tokens per step"
        assert all(0 <= _number(row[2 + 2 * i]) <= draft_tokens for row in per_step), policy
    assert all(every >= selective for every, selective in zip(tokens["all"], tokens["threshold"]))

    columns, by_batch = _table(out, "| first acceptance | seq/card |")
    assert len(columns) == 5 + 2 * len(policies)
    assert len(by_batch) % len(acceptances) == 0 and len(by_batch) > len(acceptances)
    for row in by_batch:
        figures = [_number(cell) for cell in row[2:3 + 2 * len(policies)]]
        assert all(math.isfinite(value) and value > 0 for value in figures), row
        gain = _number(row[-2])
        best = re.fullmatch(r"([\d.]+) \(([+-][\d.]+%)\)", row[-1])
        assert best, row[-1]
        assert 0 < float(best.group(1)) < 1 and _number(best.group(2)) >= gain - 0.001  # the cut is among those tried

    assert f"first gains {module.TARGET_GAIN:.0%} over verify-all" in out
    found = re.findall(r"first acceptance ([\d.]+): (?:([\d.]+) sequences per card|not up to 256 per card)", out)
    assert [float(acceptance) for acceptance, _ in found] == acceptances
    at_default = dict(found)["0.875"]
    assert at_default and 0 < float(at_default) <= 256  # selective verification gains somewhere at the default
