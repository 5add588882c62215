"""vLLM and SGLang compute the placement on every rank and broadcast nothing: every entry point must give the same
map in every process, whatever the load beside it. Four processes run each entry point at the production shapes
(DESIGN.md: 144 x 2, 72 x 4, 64 x 4, 128 x 2, 32 x 9, and node-limited 64 x 4) at once, with two busy loops taking
the cores, at the smallest budgets the docs show, and their maps are compared byte for byte; so are the files of
four concurrent `eplb place` runs."""

import hashlib
import os
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eplb import CpsatEplbPolicy, rebalance_experts
from placement import ClusterSpec, fit_placement
from traces.synthetic import SyntheticConfig, generate_trace

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ((144, 2, 128), (72, 4, 128), (64, 4, 128), (128, 2, 128), (32, 9, 2048))  # GPUs, slots, tokens a GPU
SPINNER = ("import sys; from collectives.lifeline import end_with_parent; end_with_parent(int(sys.argv[1]), True)\n"
           "while True: pass")
RUN_TIMEOUT_S = 300


def window(gpus: int, tokens_per_gpu: int) -> np.ndarray:
    """[8, 2, 256] synthetic decode counts at the shape's tokens a step."""
    return generate_trace(SyntheticConfig(num_steps=8, num_layers=2, num_experts=256, top_k=8,
                                          tokens_per_step=gpus * tokens_per_gpu, seed=gpus)).counts_TLE


def digests() -> dict[str, str]:
    """Every entry point's map at every shape, hashed: what one process computes (run in each of four)."""
    found = {}
    for gpus, slots, tokens in SHAPES:
        counts = window(gpus, tokens)
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots)
        fitted = fit_placement("cpsat", counts, cluster, work_limit=0.5)
        found[f"fit_placement {gpus}x{slots}"] = fitted.phy2log_LP.tobytes() + fitted.weights_LP.tobytes()
        weight = torch.from_numpy(counts.sum(axis=0))
        found[f"rebalance_experts {gpus}x{slots}"] = rebalance_experts(weight, gpus * slots, 1, gpus // 8, gpus,
                                                                       "cpsat")[0].numpy().tobytes()
        found[f"CpsatEplbPolicy {gpus}x{slots}"] = CpsatEplbPolicy.rebalance_experts(
            weight, gpus * slots, 8, gpus // 8, gpus).numpy().tobytes()
    counts = window(64, 128)
    limited = fit_placement("cpsat", counts, ClusterSpec(num_gpus=64, slots_per_gpu=4), work_limit=0.5, groups=8,
                            nodes_per_group=1)
    found["fit_placement 64x4 node-limited"] = limited.phy2log_LP.tobytes() + limited.weights_LP.tobytes()
    return {name: hashlib.sha256(value).hexdigest() for name, value in found.items()}


def start_busy_loops(new_session, count: int) -> None:
    for _ in range(count):
        new_session([sys.executable, "-c", SPINNER, str(os.getpid())], cwd=ROOT)


def test_every_entry_point_gives_the_same_map_in_four_busy_processes(new_session):
    start_busy_loops(new_session, 2)
    code = "import json, sys; sys.path.insert(0, sys.argv[1]); import test_same_map_in_every_process as t; " \
           "print(json.dumps(t.digests()))"
    runs = [new_session([sys.executable, "-c", code, str(Path(__file__).parent)], cwd=ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [run.process.communicate(timeout=RUN_TIMEOUT_S) for run in runs]
    for run, (_, err) in zip(runs, outputs):
        assert run.process.returncode == 0, err[-2000:]
    maps = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert len(maps[0]) == 3 * len(SHAPES) + 1
    for other in maps[1:]:
        assert other == maps[0], [name for name in maps[0] if other[name] != maps[0][name]]


def test_four_concurrent_cli_fits_write_the_same_files(new_session, tmp_path):
    trace = tmp_path / "trace.npz"
    eplb = str(Path(sys.executable).with_name("eplb"))
    subprocess.run([eplb, "synth", "--out", str(trace), "--steps", "8", "--layers", "2", "--experts", "256",
                    "--tokens-per-step", "9216", "--seed", "3"], check=True, capture_output=True)
    start_busy_loops(new_session, 2)
    runs = []
    for index in range(4):
        args = [eplb, "place", "--trace", str(trace), "--gpus", "72", "--slots-per-gpu", "4", "--policy", "cpsat",
                "--routing", "dynamic", "--work-limit", "0.5", "--out", str(tmp_path / f"placement{index}.json"),
                "--sglang-out", str(tmp_path / f"sglang{index}.json"), "--sglang-num-layers", "2",
                "--sglang-first-moe-layer", "0"]
        runs.append(new_session(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for run in runs:
        _, err = run.process.communicate(timeout=RUN_TIMEOUT_S)
        assert run.process.returncode == 0, err[-2000:]
    for name in ("placement", "sglang"):
        first = (tmp_path / f"{name}0.json").read_bytes()
        assert all((tmp_path / f"{name}{index}.json").read_bytes() == first for index in range(1, 4)), name


@pytest.mark.parametrize("entry", ["fit_placement", "rebalance_experts"])
def test_a_wall_clock_budget_is_asked_for_by_name_and_reported(entry):
    counts = window(32, 128)
    if entry == "fit_placement":
        placement = fit_placement("cpsat", counts, ClusterSpec(num_gpus=32, slots_per_gpu=9), time_limit_s=0.5)
        assert placement.info["budget"] == "wall clock" and placement.info["work_limit"] is None
    else:
        weight = torch.from_numpy(counts.sum(axis=0))
        phy2log, _, _ = rebalance_experts(weight, 288, 1, 4, 32, "cpsat", time_limit_s=0.5)
        assert phy2log.shape == (2, 288)
