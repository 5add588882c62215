"""The simulator's validation (`eplb sim validate` prints it): the anchors file, the declared calibration against its
fitted anchors, a predicted row's error bound, and that no predicted figure has found its way into the simulator."""

import re
from pathlib import Path

import pytest

from sim.validation import ANCHORS_PATH, ROLES, AnchorError, _refit_one, anchor_error, load_anchors, simulate
from sim.validation_report import validation_rows, validation_text, within_tolerance
from sim.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[2]
CHEAP = ("deepep-low-latency-h800", "deepep-low-latency-latency-h800", "flashmla-memory-bound-h800",
         "flashmla-compute-bound-h800", "deepseek-v3-mtp-speedup", "nebius-mtp-k7-tokens-per-step")


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
    anchors_dir = ROOT / "sim" / "anchors"  # where the published figures are written down, with their sources
    files = [path for path in (ROOT / "sim").rglob("*")
             if path.suffix in (".py", ".yaml", ".yml", ".json") and anchors_dir not in path.parents]
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
        assert _refit_one(name, anchors[constant.anchor], ANCHORS_PATH, {}) == pytest.approx(
                constant.value, rel=0.005), name


def test_a_predicted_row_is_within_its_documented_error():
    # CloudMatrix384's prefill is predicted from H800 fits; docs/simulator.md states its error
    rows = validation_rows([anchor for anchor in load_anchors() if anchor.name == "cloudmatrix384-prefill-npu"])
    assert rows[0]["role"] == "predicted" and abs(rows[0]["error"]) < 0.15
    assert rows[0]["command"].startswith("eplb sim --config sim/anchors/cloudmatrix384-prefill.yaml --capacity")


def test_imbalance_rows_are_judged_on_their_excess_over_one():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    predicted = anchors["trtllm-r1-ep36-offline-eplb"]
    assert predicted.role == "predicted" and predicted.measure["fit"] == "rerun"
    assert anchor_error(predicted, 1.0 + 2 * (predicted.published - 1.0)) == pytest.approx(1.0)  # twice the excess
    assert anchor_error(anchors["cloudmatrix384-decode-npu"], 2 * 1943) == pytest.approx(1.0)  # a rate: itself
    assert within_tolerance({"unit": predicted.unit, "error": -0.3})
    assert not within_tolerance({"unit": predicted.unit, "error": -0.34})
    assert not within_tolerance({"unit": "output tokens/s per node", "error": -0.3})


def test_the_offline_eplb_prediction_runs_on_the_fitted_skew_beats_no_balancing_and_carries_its_range():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    row = validation_rows([anchors["trtllm-r1-ep36-offline-eplb"]])[0]
    assert 1.0 < row["simulated"] < anchors["trtllm-r1-ep32-no-balancing"].published
    assert row["error"] == pytest.approx((row["simulated"] - 1) / (row["published"] - 1) - 1)
    assert row["metric"] == "card_step"
    found = row["range"]
    assert len(found["cases"]) == 6, "the fitted skew, bursts on and off, 3 seeds"
    values = [found["central"], *(case["simulated"] for case in found["cases"])]
    assert (found["min"], found["max"]) == (min(values), max(values)) and found["central"] == row["simulated"]
    assert all(case["error"] == anchor_error(anchors["trtllm-r1-ep36-offline-eplb"], case["simulated"])
               for case in found["cases"])


def test_a_row_with_a_range_counts_only_if_every_case_is_within():
    row = {"unit": "max / mean rank load", "error": 0.1, "range": {"cases": [{"error": -0.2}, {"error": 0.3}]}}
    assert within_tolerance(row)
    row["range"]["cases"][0]["error"] = -0.4
    assert not within_tolerance(row)


def test_the_open_row_shows_every_definition_and_is_counted_neither_way():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    anchor = anchors["deepseek-decode-imbalance"]
    assert (anchor.role, anchor.metric) == ("open", "unstated")
    row = {"name": anchor.name, "role": "open", "metric": "unstated", "unit": anchor.unit, "published": 1.09,
           "simulated": 1.3, "error": 2.3, "tokens_per_card": 91.5, "cases": 12,
           "definitions": {"card_step": {"central": 1.3, "min": 1.1, "max": 1.4, "noise_floor": 1.098,
                                         "definition": "per step"}}}
    predicted = {"name": "p", "role": "predicted", "metric": None, "unit": "tokens/s", "published": 1.0,
                 "simulated": 1.0, "error": 0.0}
    text = validation_text([row, predicted])
    assert "1 predicted, 1 open (no metric named: counted neither way)" in text and "1 of 1" in text
    assert "card_step         1.300 (1.100 to 1.400), noise floor 1.098" in text
    assert "+230.0%" not in text, "an open row shows no error: it is not judged"


def test_an_anchors_file_without_an_imbalance_s_metric_is_refused(tmp_path):
    import yaml

    data = yaml.safe_load(ANCHORS_PATH.read_text())
    for entry in data["anchors"]:
        if entry["name"] == "trtllm-r1-ep36-offline-eplb":
            del entry["metric"]
    broken = tmp_path / "anchors.yaml"
    broken.write_text(yaml.safe_dump(data))
    _copy_configs(tmp_path)
    with pytest.raises(AnchorError, match="names its source's metric"):
        load_anchors(broken)


def _copy_configs(folder: Path) -> None:
    """The anchors' operating-point configs, copied beside an anchors file written to `folder`."""
    for config in {anchor.config for anchor in load_anchors() if anchor.config}:
        target = folder / config
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((ANCHORS_PATH.parent / config).read_text())


def test_a_row_with_a_band_counts_only_if_every_value_of_the_band_is_within():
    row = {"unit": "input tokens/s per node", "error": 0.05,
           "band": [{"trace": "a", "value": 1.9, "error": -0.10}, {"trace": "b", "value": 2.7, "error": 0.05}]}
    assert within_tolerance(row)
    row["band"][0]["error"] = -0.16
    assert not within_tolerance(row)


def test_the_prompt_spread_band_is_every_measured_trace_and_each_value_is_that_traces():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    band = anchors["deepseek-prefill-node"].measure["band"]
    assert band["field"] == "capacity.prompt_length_spread"
    data = ROOT.parent / "shared" / "data" / "requests"
    if not data.is_dir():
        pytest.skip("../shared/data/requests is absent")
    from sim.prompt_mix import length_spread
    from traces import load_request_trace

    traces = sorted(path.name for path in data.iterdir() if path.suffix in (".csv", ".jsonl"))
    assert sorted(entry["trace"] for entry in band["values"]) == traces
    for entry in band["values"]:
        lengths = [request.input_tokens for request in load_request_trace(data / entry["trace"])]
        assert length_spread(lengths) == pytest.approx(entry["value"], abs=0.001), entry["trace"]


def test_a_malformed_band_is_refused_naming_the_anchor(tmp_path):
    text = ANCHORS_PATH.read_text().replace("field: capacity.prompt_length_spread", "field: capacity.nothing")
    broken = tmp_path / "anchors.yaml"
    broken.write_text(text)
    _copy_configs(tmp_path)
    with pytest.raises(AnchorError, match="deepseek-prefill-node"):
        load_anchors(broken)


def test_a_row_whose_figure_is_a_fitted_rows_is_an_identity():
    anchors = {anchor.name: anchor for anchor in load_anchors()}
    perfect, profile = anchors["sglang-h100-prefill-ep32-4k-perfect-node"], anchors["deepseek-profile-prefill-node"]
    assert perfect.role == "identity"
    assert simulate(perfect) == pytest.approx(simulate(profile), rel=1e-9)
