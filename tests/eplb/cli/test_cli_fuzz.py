"""Property-based fuzzing of the command line and the file readers (hypothesis, derandomised so CI is repeatable).

Random malformed traces (every supported format, broken shapes, dtypes and values, truncated and garbage files),
random malformed placement files (any key replaced by any JSON value) and random flag values: every run of
`eplb.cli.main.main` (in this process, `run_eplb_here`) ends with status 0 or 2 (an uncaught exception, which would
print a traceback, fails the test), prints one line on stderr when it fails, and leaves every input file
byte-for-byte unchanged.
"""

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("MPLBACKEND", "Agg")

SHAPE = (12, 2, 16)  # steps, layers, experts: 16 experts fit 4 GPUs x 4 slots
FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _good_counts(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50, size=SHAPE)


def _mutated_counts(draw) -> np.ndarray | object:
    """A counts array that is good or broken in one of the ways a user's file can be."""
    counts = _good_counts(draw(st.integers(0, 3)))
    kind = draw(st.sampled_from(["good", "negative", "nan", "fraction", "float-whole", "rank2", "rank4", "empty",
                                 "strings", "bool", "huge", "inf", "uint8", "other-experts"]))
    if kind == "negative":
        counts[0, 0, 0] = -draw(st.integers(1, 10**6))
    elif kind == "nan":
        counts = counts.astype(float)
        counts[1, 1, 3] = np.nan
    elif kind == "fraction":
        counts = counts + 0.5
    elif kind == "float-whole":
        counts = counts.astype(np.float32)
    elif kind == "rank2":
        counts = counts[0]
    elif kind == "rank4":
        counts = counts[None]
    elif kind == "empty":
        counts = counts[:0]
    elif kind == "strings":
        counts = counts.astype(str)
    elif kind == "bool":
        counts = counts > 10
    elif kind == "huge":
        counts[2, 0, 1] = 2**62
    elif kind == "inf":
        counts = counts.astype(float)
        counts[0, 1, 2] = np.inf
    elif kind == "uint8":
        counts = counts.astype(np.uint8)
    elif kind == "other-experts":
        counts = counts[:, :, :12]
    return counts


@st.composite
def trace_files(draw) -> tuple[str, bytes | None, object]:
    """(file suffix, raw bytes or None, payload) of a random routing trace file."""
    form = draw(st.sampled_from(["npz", "npy", "pt", "topk", "garbage", "truncated"]))
    if form == "garbage":
        return ".npz", draw(st.binary(max_size=200)), None
    if form == "topk":
        ids = np.random.default_rng(draw(st.integers(0, 3))).integers(-1, 16, size=(2, 96, 3))
        mutation = draw(st.sampled_from(["good", "float", "too-large", "too-small", "rank2"]))
        ids = {"good": ids, "float": ids + 0.5, "too-large": ids + 300, "too-small": ids - 5,
               "rank2": ids[0]}[mutation]
        return ".topk", None, ids
    return {"npz": ".npz", "npy": ".npy", "pt": ".pt", "truncated": ".npz-truncated"}[form], None, \
        _mutated_counts(draw)


def _write_trace(folder: Path, suffix: str, raw: bytes | None, payload) -> Path:
    if raw is not None:
        path = folder / "trace.npz"
        path.write_bytes(raw)
    elif suffix == ".topk":
        path = folder / "trace.npz"
        np.savez(path, chat_topk_ids=payload, code_topk_ids=payload)
    elif suffix in (".npz", ".npz-truncated"):
        path = folder / "trace.npz"
        np.savez(path, counts=payload)
        if suffix == ".npz-truncated":
            path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])
    elif suffix == ".npy":
        path = folder / "trace.npy"
        np.save(path, payload)
    else:
        path = folder / "trace.pt"
        tensor = torch.as_tensor(payload) if payload.dtype.kind in "iufb" else payload.tolist()
        torch.save({"logical_count": tensor}, path)
    return path


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def placement_texts(draw) -> str:
    """A placement file for SHAPE on 4 GPUs x 4 slots with one key, row or entry replaced by random JSON."""
    phy2log = [list(np.random.default_rng(layer).permutation(16).tolist()) for layer in range(SHAPE[1])]
    data = {"schema_version": 1, "num_layers": SHAPE[1], "num_logical_experts": SHAPE[2], "num_gpus": 4,
            "gpus_per_node": 8, "slots_per_gpu": 4, "physical_to_logical_map": phy2log,
            "replica_weights": [[1.0] * 16 for _ in range(SHAPE[1])], "policy": "fuzz", "info": {}}
    where = draw(st.sampled_from(["keep", "key", "row", "entry", "drop", "text"]))
    key = draw(st.sampled_from(sorted(data)))
    if where == "key":
        data[key] = draw(JSON_VALUES)
    elif where == "drop":
        del data[key]
    elif where in ("row", "entry") and key in ("physical_to_logical_map", "replica_weights"):
        if where == "row":
            data[key][0] = draw(JSON_VALUES)
        else:
            data[key][1][draw(st.integers(0, 15))] = draw(JSON_VALUES)
    elif where == "text":
        return draw(st.sampled_from(["", "{", "[]", "null", "[" * 5000, '{"a": NaN}', "\ufeff{}"]))
    return json.dumps(data)


BAD_VALUES = ["-1", "0", "1e9", "nan", "inf", "x", ""]
FLAG_VALUES = st.sampled_from(["1", "2", "3", "4", "8", *BAD_VALUES])
# Mostly the size that fits the fuzzed model, so that most runs get past the flags into the readers and policies.
CLUSTER_VALUES = st.sampled_from(["4"] * 8 + ["1", "2", "8", "16", *BAD_VALUES])
STEP_RANGES = st.sampled_from(["0:6", ":", "3:", ":5", "5:2", "0:999", "a:b", "-3:2", "1:1"])


@st.composite
def command_lines(draw, trace: str, placement: str, out: str) -> list[str]:
    """A random subcommand with random values for its flags (some valid, some not)."""
    command = draw(st.sampled_from(["place", "score", "replay", "plot", "synth"]))
    cluster = ["--gpus", draw(CLUSTER_VALUES), "--slots-per-gpu", draw(CLUSTER_VALUES)]
    optional = {
        "--steps": STEP_RANGES, "--task": st.sampled_from(["chat", "code,chat", "chat,chat", "", "law"]),
        "--tokens-per-step": st.sampled_from(["16", "32", *BAD_VALUES]), "--num-experts": FLAG_VALUES,
        "--routing": st.sampled_from(["static", "dynamic", "live", "bogus"]),
        "--policy": st.sampled_from(["deepseek", "trivial", "bogus"]), "--groups": FLAG_VALUES,
        "--gpus-per-node": FLAG_VALUES,
    }
    if command == "synth":
        args = ["synth", "--out", out, "--steps", draw(CLUSTER_VALUES), "--layers", draw(CLUSTER_VALUES),
                "--experts", draw(CLUSTER_VALUES), "--top-k", draw(CLUSTER_VALUES),
                "--tokens-per-step", draw(CLUSTER_VALUES)]
        optional = {"--popularity": st.sampled_from(["zipf", "lognormal"]), "--skew": FLAG_VALUES,
                    "--zipf-exponent": FLAG_VALUES}
    elif command == "place":
        args = ["place", "--trace", trace, *cluster, "--out", out]
    elif command == "score":
        args = ["score", "--placement", placement, "--trace", trace]
    elif command == "replay":
        args = ["replay", "--trace", trace, *cluster, "--every", draw(CLUSTER_VALUES),
                "--window", draw(CLUSTER_VALUES)]
        optional.update({"--lag": FLAG_VALUES, "--refit-on-drift": FLAG_VALUES})
    else:
        args = ["plot", "--trace", trace, "--placement", placement, "--out-dir", str(Path(out).parent / "figs")]
    for flag in draw(st.lists(st.sampled_from(sorted(optional)), max_size=3, unique=True)):
        args += [flag, draw(optional[flag])]
    return args + ["--json"]


def _check_run(run_eplb_here, argv: list[str], inputs: list[Path]) -> None:
    before = {path: path.read_bytes() for path in inputs}
    result = run_eplb_here(*argv)
    status, stderr = result.returncode, result.stderr
    assert status in (0, 2), f"exit {status} for {argv}: {stderr}"
    if status == 2:
        assert len(stderr.strip().splitlines()) == 1, f"{argv}: stderr {stderr!r}"
    for path, content in before.items():
        assert path.read_bytes() == content, f"{argv} changed the input {path.name}"


@FUZZ
@given(trace=trace_files(), placement=placement_texts(), data=st.data())
def test_random_traces_placements_and_flags_exit_0_or_2_and_keep_every_input(run_eplb_here, trace, placement,
                                                                             data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        trace_path = _write_trace(folder, *trace)
        placement_path = folder / "placement.json"
        placement_path.write_text(placement)
        out = folder / "out" / "placement.json"
        argv = data.draw(command_lines(str(trace_path), str(placement_path), str(out)))
        _check_run(run_eplb_here, argv, [trace_path, placement_path])


@FUZZ
@given(trace=trace_files(), routing=st.sampled_from(["static", "dynamic", "live"]))
def test_random_traces_scored_against_a_good_placement_exit_0_or_2(run_eplb_here, trace, routing):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        trace_path = _write_trace(folder, *trace)
        (folder / "good").mkdir()
        good = _write_trace(folder / "good", ".npy", None, _good_counts(0))
        placement_path = folder / "placement.json"
        assert run_eplb_here("place", "--trace", good, "--gpus", "4", "--slots-per-gpu", "4",
                             "--out", placement_path, "--quiet").returncode == 0
        _check_run(run_eplb_here, ["score", "--placement", str(placement_path), "--trace", str(trace_path), "--routing", routing,
                    "--json"], [trace_path, placement_path, good])
