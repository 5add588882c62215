"""`scripts/live_demo.py` runs a real 3-process Gloo decode loop and reports the contract keys: outputs equal the
dense layer, no token lost, the measured imbalance equal to the planned one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "live_demo.py"
KEYS = {"steps", "world_size", "routing", "max_abs_err_vs_dense", "imbalance_measured", "imbalance_planned",
        "tokens_lost"}


@pytest.mark.parametrize("routing", ["dynamic", "oblivious"])
def test_live_demo_prints_the_contract_keys_last_with_no_token_lost(routing):
    result = subprocess.run([sys.executable, str(SCRIPT), "--world-size", "3", "--steps", "3", "--experts", "12",
                             "--hidden-size", "16", "--tokens-per-step", "60", "--time-limit", "0.5",
                             "--routing", routing, "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert KEYS <= report.keys()
    assert report["steps"] == 3 and report["world_size"] == 3 and report["routing"] == routing
    assert report["max_abs_err_vs_dense"] <= 1e-5 and report["tokens_lost"] == 0
    assert report["imbalance_measured"] == report["imbalance_planned"]
