# Two entry points; each sets up .venv itself on first use (see scripts/setup_env.sh).
.PHONY: demo test bench setup

setup:
	@bash scripts/setup_env.sh

demo: setup
	.venv/bin/eplb demo

test: setup
	.venv/bin/python -m pytest

bench: setup
	.venv/bin/python scripts/bench_placement.py
