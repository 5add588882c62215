"""The simulator's fleet bench and the speculative-decoding bench run end to end on their quick settings (smoke
tests, not timing tests), and the fleet model agrees with the request-by-request run where both run."""

import importlib.util
import re
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fleet_section_prints_every_table_and_the_two_models_agree(capsys):
    assert _module("bench_sim").main(["--section", "fleet", "--quick"]) == 0
    out = capsys.readouterr().out
    for row in ("| nodes_mean | 226.75 |", "| reroute | 1 |", "| restart | 0 |", "seed fleet", "| decode saturated |"):
        assert row in out, row
    agreement = re.findall(r"\| (?:decode|prefill) saturated \|[^\n]*\| ([+-][\d.]+)% \|", out)
    assert len(agreement) == 2 and all(abs(float(gap)) < 10 for gap in agreement)


def test_speculative_bench_finds_where_selective_verification_gains_six_percent(capsys):
    assert _module("bench_speculative").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "first gains 6% over verify-all" in out
    assert re.search(r"first acceptance 0\.875: [\d.]+ sequences per card", out)
