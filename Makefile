# Two entry points; each sets up .venv itself on first use (see scripts/setup_env.sh).
.PHONY: demo test bench setup engine-env

setup:
	@bash scripts/setup_env.sh

demo: setup
	.venv/bin/eplb demo

test: setup
	.venv/bin/python -m pytest

bench: setup
	.venv/bin/python scripts/bench_placement.py

# An environment holding a serving engine installed normally, outside the repository, and the engine's tests run there
# (scripts/engine_env.sh): make engine-env ENGINE=vllm|sglang [VERSION=0.33.0]
engine-env:
	bash scripts/engine_env.sh $(ENGINE) $(VERSION)
