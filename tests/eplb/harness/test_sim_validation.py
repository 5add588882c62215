"""`eplb sim validate`: the anchors file, the declared calibration against its fitted anchors, a predicted row's
error bound, and that no predicted figure has found its way into the simulator."""

import json
import re
from pathlib import Path

import pytest
import yaml

from eplb.harness.sim_validation import (ANCHORS_PATH, ROLES, AnchorError, _refit_one, load_anchors, simulate,
                                         validation_rows)
from sim.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[3]
CHEAP = ("deepep-low-latency-h800", "flashmla-memory-bound-h800", "deepseek-v3-mtp-speedup",
         "nebius-mtp-k7-tokens-per-step")


def _spellings(value: float) -> set[str]:
    """The ways a figure is written in prose and code: 22282, 22,282, 22.3k, 226.75."""
    spelled = {f"{value:g}"}
    if value >= 1000:
        spelled |= {f"{value:.0f}", f"{value:,.0f}", f"{value / 1000:.1f}k", f"{value / 1000:.1f} k"}
    return spelled


def test_every_anchor_has_a_role_and_every_fitted_constant_a_fitted_anchor():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    assert {anchor.role for anchor in anchors.values()} == set(ROLES)
    constants = load_calibration()
    for name, constant in constants.items():
        assert anchors[constant.anchor].role == "fitted", name
    fitted = {anchor.name for anchor in anchors.values() if anchor.role == "fitted"}
    assert fitted == {constant.anchor for constant in constants.values()}  # no fitted anchor without its constant


def test_no_predicted_figure_appears_in_the_simulators_code_or_configs():
    files = [path for path in (ROOT / "sim").rglob("*") if path.suffix in (".py", ".yaml", ".yml", ".json")]
    assert any(path.name == "calibration.yaml" for path in files)
    text = {path: path.read_text() for path in files}
    for anchor in load_anchors():
        if anchor.role == "fitted":
            continue
        for spelled in _spellings(anchor.published):
            pattern = re.compile(rf"(?<![\d.,]){re.escape(spelled)}(?![\d])")
            found = [str(path.relative_to(ROOT)) for path, body in text.items() if pattern.search(body)]
            assert not found, f"{anchor.name}'s published {spelled} appears in {found}"


def test_the_calibration_reproduces_its_fitted_anchors():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    for name in CHEAP + ("deepseek-decode-node",):
        assert simulate(anchors[name]) == pytest.approx(anchors[name].published, rel=0.005), name
    constants = load_calibration()
    for name, constant in constants.items():
        if name != "efficiency.compute":  # its refit is the decode row above, solved for the factor
            assert _refit_one(name, anchors[constant.anchor], ANCHORS_PATH, {}) == pytest.approx(
                constant.value, rel=0.005), name


def test_a_predicted_row_is_within_its_documented_error():
    # DeepSeek's prefill rate is predicted from the decode fit; docs/simulator.md states its error (+2.5%)
    rows = validation_rows([anchor for anchor in load_anchors() if anchor.name == "deepseek-prefill-node"])
    assert rows[0]["role"] == "predicted" and abs(rows[0]["error"]) < 0.15
    assert rows[0]["command"].startswith("eplb sim --config eplb/harness/anchors/deepseek-prefill.yaml --capacity")


def test_validate_prints_every_anchor_with_its_role_error_and_command(tmp_path, run_eplb_here):
    data = yaml.safe_load(ANCHORS_PATH.read_text())
    data["anchors"] = [entry for entry in data["anchors"] if entry["name"] in CHEAP]
    subset = tmp_path / "anchors.yaml"
    subset.write_text(yaml.safe_dump(data))
    result = run_eplb_here("sim", "validate", "--anchors", str(subset), "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["anchors"]
    assert [row["name"] for row in rows] == list(CHEAP)
    for row in rows:
        assert row["role"] == "fitted" and abs(row["error"]) < 0.005 and row["command"].startswith("eplb sim")
        assert row["source"] and row["unit"] and row["published"] > 0


def test_validate_refuses_run_flags_and_a_broken_anchors_file(tmp_path, run_eplb_here, one_line_error):
    one_line_error(run_eplb_here("sim", "validate", "--config", "sim/configs/cloudmatrix384.yaml"), "drop --config")
    one_line_error(run_eplb_here("sim", "validate", "--write"), "add --refit")
    one_line_error(run_eplb_here("sim", "--refit"), "add validate")
    broken = tmp_path / "anchors.yaml"
    broken.write_text("anchors:\n  - {name: x, role: guessed}\n")
    one_line_error(run_eplb_here("sim", "validate", "--anchors", str(broken)), "anchors file")
    with pytest.raises(AnchorError, match="missing beside"):
        broken.write_text(yaml.safe_dump({"anchors": [{
            "name": "x", "role": "predicted", "published": 1.0, "unit": "u", "source": "s", "conditions": "c",
            "measure": {"kind": "decode"}, "config": "absent.yaml"}]}))
        load_anchors(broken)
