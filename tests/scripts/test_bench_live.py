"""The live bench's planning section runs end to end on its quick shape (a smoke test, not a timing test): every
row printed, and a rank's part of the plan decodes in less time than planning the moves itself."""

import importlib.util
import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_live.py"


def test_plan_section_prints_every_row(capsys):
    spec = importlib.util.spec_from_file_location("bench_live", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--section", "plan", "--quick"]) == 0
    out = capsys.readouterr().out
    for row in ("| plan (fills and rounds) |", "| encode |", "| decode the whole plan |", "| decode this rank's part |"):
        assert row in out, row
    ratio = float(re.search(r"a rank spends ([\d.]+)x the time", out).group(1))
    assert ratio < 1
