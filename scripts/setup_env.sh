#!/usr/bin/env bash
# Creates .venv in the repository and installs the project with its test tools and the transformers extra (hf).
# Idempotent: a second run only re-checks. On a machine without a GPU the CPU build of torch is pinned
# through constraints-cpu.txt; set EPLB_TORCH_CONSTRAINTS= (empty) to let pip pick torch itself.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
constraints="${EPLB_TORCH_CONSTRAINTS-constraints-cpu.txt}"
stamp=".venv/.installed-$(cat pyproject.toml constraints-cpu.txt | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
args=(-q -e ".[test,hf]")
if [ -n "$constraints" ]; then
  args+=(-c "$constraints")
fi
echo "setting up .venv (first run only; log in .venv/setup.log)" >&2
if ! .venv/bin/python -m pip install "${args[@]}" > .venv/setup.log 2>&1; then
  tail -n 30 .venv/setup.log >&2
  echo "setup failed: see .venv/setup.log" >&2
  exit 1
fi
rm -f .venv/.installed-*
touch "$stamp"
