"""`eplb sim validate`: every anchor printed with its role, error and command; run flags and a broken anchors file
refused with one line."""

import json

import pytest
import yaml

from sim.validation import ANCHORS_PATH, AnchorError, load_anchors

# anchors whose simulated figure is pure arithmetic: cheap enough for a command-line test
CHEAP = ("deepep-low-latency-h800", "flashmla-memory-bound-h800", "deepseek-v3-mtp-speedup",
         "nebius-mtp-k7-tokens-per-step")


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


@pytest.mark.parametrize("text, found", [("", "an empty file"), ("- a\n", "a list"), ("other: 1\n", "no `anchors` key"),
                                         ("anchors: 3\n", "`anchors` a int")],
                         ids=["empty", "a-list", "no-key", "not-a-list"])
def test_an_anchors_file_of_the_wrong_shape_says_what_was_found_and_expected(tmp_path, run_eplb_here, one_line_error,
                                                                             text, found):
    broken = tmp_path / "anchors.yaml"
    broken.write_text(text)
    one_line_error(run_eplb_here("sim", "validate", "--anchors", str(broken)),
                   f"found {found}; expected a YAML mapping")
