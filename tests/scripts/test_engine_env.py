"""The engine environment: `scripts/engine_env.sh` refuses an engine or version it does not build in one line,
before creating anything, and the project's extras admit what each engine pins (the `hf` extra's transformers range
holds vLLM 0.33's and SGLang 0.5.23's, so `eplb[ENGINE,hf]` installs beside either). The build itself downloads the
engine and its CUDA torch: docs/adapters.md shows its output."""

import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# The transformers each engine's own requirements let pip choose (what `pip install --dry-run` resolved beside it).
ENGINE_TRANSFORMERS = {"vllm 0.33.0 (below 5.21)": "5.20.2", "sglang 0.5.23 (== 5.19.0)": "5.19.0"}


@pytest.mark.parametrize(("args", "expected"), [
    (["trtllm"], "the engine must be vllm or sglang; got 'trtllm'"),
    ([], "the engine must be vllm or sglang; got ''"),
    (["vllm", "0.33; rm -rf /"], "VERSION must be a release like 0.33.0"),
], ids=["unknown-engine", "no-engine", "not-a-release"])
def test_an_engine_or_version_it_does_not_build_is_refused_in_one_line(tmp_path, args, expected):
    venv = tmp_path / "venv"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "engine_env.sh"), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "ENGINE_VENV": str(venv)}, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and expected in done.stderr
    assert not venv.exists()


@pytest.mark.parametrize("engine", sorted(ENGINE_TRANSFORMERS))
def test_the_hf_extra_admits_the_transformers_each_engine_pins(engine):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    hf = [Requirement(text) for text in extras["hf"]]
    assert [requirement.name for requirement in hf] == ["transformers"]
    assert hf[0].specifier.contains(ENGINE_TRANSFORMERS[engine])
    assert {"vllm", "sglang"} <= extras.keys()  # eplb[ENGINE] names an extra for each engine
