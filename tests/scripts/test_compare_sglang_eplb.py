"""`scripts/compare_sglang_eplb.py`: SGLang's in-tree DeepSeek EPLB beside DeepSeek's `eplb.py` and `eplb place`
(needs SGLang's source, `pip install --no-deps`), and its usage errors (run everywhere)."""

import importlib.util
import json

import pytest


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
def test_sglang_s_maps_differ_from_eplb_py_only_where_the_imbalance_is_the_same(load_script, tmp_path, capsys):
    script = load_script("compare_sglang_eplb")
    assert script.main(["--layers", "2", "--steps", "10", "--json", str(tmp_path / "out.json")]) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert set(result) == {"eplb.py", "eplb place"}
    for row in result.values():
        assert row["cases"] == 2 * len(script.SHAPES) and row["imbalance_delta_max_abs"] < 1e-12
    assert capsys.readouterr().out.count("maps differ") == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--layers", "0"], "--layers must be in [1, 256]"),
    (["--steps", "20000"], "--steps in [1, 10000]"),
    ([], "SGLang is not installed: pip install --no-deps --target DIR sglang==0.5.23"),
], ids=["no-layers", "too-many-steps", "no-sglang"])
def test_a_usage_mistake_is_one_line(load_script, capsys, argv, message):
    script = load_script("compare_sglang_eplb")
    script.sglang_deepseek = lambda: None  # as where SGLang is not installed
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
