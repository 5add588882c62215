#!/usr/bin/env bash
# Builds an environment that holds a serving engine, installed normally (the engine with every dependency it declares,
# its own torch included, not --no-deps), with this project and its test tools beside it (`eplb[ENGINE,hf,test]`,
# editable), then runs the engine's tests there; none of them may be skipped.
#
#   scripts/engine_env.sh vllm|sglang [VERSION]        (or: make engine-env ENGINE=vllm|sglang [VERSION=...])
#
# VERSION defaults to the one the engine's README (eplb/engines/ENGINE/README.md) was checked against (vLLM 0.33.0, SGLang 0.5.23). The environment is
# $ENGINE_VENV, default ${TMPDIR:-/tmp}/eplb-engine-ENGINE-VERSION, outside the repository; a second run reinstalls
# only what changed. constraints-cpu.txt does not apply here: each engine pins its own torch (vLLM 0.33.0: 2.14.0,
# SGLang 0.5.23: 2.14.1), a CUDA build of several GB, which runs these tests on a CPU as well.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine="${1:-}"
case "$engine" in
  vllm)
    version="${2:-0.33.0}"
    tests=(tests/eplb/engines/test_vllm_plugin.py tests/eplb/engines/test_vllm_policy.py
           tests/eplb/engines/test_vllm_reference.py tests/eplb/engines/test_vllm_ray.py
           tests/eplb/engines/test_hf_models.py) ;;
  sglang)
    version="${2:-0.5.23}"
    tests=(tests/eplb/engines/test_sglang_file.py tests/eplb/engines/test_sglang_loader.py
           tests/eplb/engines/test_hf_models.py) ;;
  *)
    echo "engine_env.sh: the engine must be vllm or sglang; got '${engine}' (scripts/engine_env.sh vllm|sglang [VERSION])" \
      >&2
    exit 2 ;;
esac
if [[ ! "$version" =~ ^[0-9]+(\.[0-9]+)*((rc|post)[0-9]+)?$ ]]; then
  echo "engine_env.sh: VERSION must be a release like 0.33.0; got '${version}'" >&2
  exit 2
fi
venv="${ENGINE_VENV:-${TMPDIR:-/tmp}/eplb-engine-${engine}-${version}}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
echo "installing ${engine}==${version} and eplb[${engine},hf,test] into ${venv} (log: ${venv}/install.log)" >&2
if ! "$venv/bin/python" -m pip install "${engine}==${version}" -e "${root}[${engine},hf,test]" \
    > "$venv/install.log" 2>&1; then
  tail -n 20 "$venv/install.log" >&2
  echo "engine_env.sh: installing ${engine}==${version} beside eplb failed: see ${venv}/install.log" >&2
  exit 1
fi
"$venv/bin/python" - "$engine" <<'PY'
import importlib.metadata as metadata
import sys

names = (sys.argv[1], "eplb", "torch", "transformers", "protobuf", "ortools", "numpy")
print("installed: " + ", ".join(f"{name} {metadata.version(name)}" for name in names))
PY
cd "$root"
log="$venv/pytest.log"
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "${tests[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
if grep -q "^SKIPPED" "$log"; then
  echo "engine_env.sh: an engine test was skipped beside ${engine}==${version} (above): the engine is not there as" \
    "the test needs it" >&2
  exit 1
fi
