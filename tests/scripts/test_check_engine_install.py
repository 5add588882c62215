"""`scripts/check_engine_install.py` reads pip's dry-run report into the versions both sides constrain, and says in
one line why when pip cannot resolve the two together (pip itself is replaced here: the real check needs the
package index; its result is in docs/adapters.md)."""

import json
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def script(load_script):
    return load_script("check_engine_install")


def _fake_pip(report: dict | None, returncode: int = 0, stderr: str = ""):
    def run(command, **kwargs):
        assert command[3:6] == ["install", "--dry-run", "--ignore-installed"] and "vllm==0.33.0" in command
        assert any(part.endswith("[vllm,hf]") for part in command)  # the project with its vllm and hf extras
        if report is not None:
            Path(command[command.index("--report") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(command, returncode, "", stderr)

    return run


def test_a_resolution_prints_the_versions_both_sides_constrain(script, monkeypatch, capsys):
    installed = [{"metadata": {"name": name, "version": version}} for name, version in
                 (("vllm", "0.33.0"), ("eplb", "0.1.0"), ("protobuf", "6.33.6"), ("ortools", "9.15.6755"),
                  ("Transformers", "5.20.2"))]
    monkeypatch.setattr(script.subprocess, "run", _fake_pip({"install": installed}))
    assert script.main(["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["versions"]["protobuf"] == "6.33.6" and result["versions"]["transformers"] == \
        "5.20.2" and result["versions"]["torch"] is None


def test_a_conflict_is_one_line_naming_pips_reason(script, monkeypatch, capsys):
    reason = "ERROR: Cannot install vllm==0.33.0 and eplb because these package versions have conflicting " \
             "dependencies."
    monkeypatch.setattr(script.subprocess, "run", _fake_pip(None, 1, "WARNING: x is ignored\n" + reason + "\n"))
    assert script.main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "conflicting dependencies" in err and "is ignored" not in err


def test_a_version_that_is_not_a_release_is_refused(script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--version", "0.33; rm -rf /"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
