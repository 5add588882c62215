"""Tests for eplb.cli.plots: each figure is a real PNG, bad inputs raise ValueError, a failed write leaves no file."""

import struct

import numpy as np
import pytest
from matplotlib.figure import Figure

from eplb.cli.plots import plot_gpu_loads, plot_imbalance_over_time, plot_load_heatmap
from traces import EplbError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 10_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} does not start with the PNG signature"
    assert len(data) >= min_bytes, f"{path} is only {len(data)} bytes"
    width, height = struct.unpack(">II", data[16:24])  # IHDR follows the signature
    assert 300 <= width <= 4000 and 300 <= height <= 4000, (width, height)


def no_temp_files_left(directory) -> bool:
    return not [p for p in directory.iterdir() if p.name.endswith(".tmp.png")]


@pytest.mark.parametrize("shape", [(2, 12), (61, 256)], ids=["small", "full-61x256"])
def test_load_heatmap_writes_png(tmp_path, shape):
    load_LE = np.random.default_rng(0).lognormal(0, 1, size=shape) * 50
    load_LE[0, 0] = 0  # an expert with no tokens must not break the log scale
    path = tmp_path / "heat.png"
    plot_load_heatmap(load_LE, path, title="test")
    assert_png(path)
    assert no_temp_files_left(tmp_path)


def test_load_heatmap_copes_with_integer_counts_and_an_empty_layer(tmp_path):
    load_LE = np.random.default_rng(1).integers(0, 100, size=(3, 16))
    load_LE[1] = 0
    plot_load_heatmap(load_LE, tmp_path / "heat.png")
    assert_png(tmp_path / "heat.png")


@pytest.mark.parametrize("shape", [(4, 8), (61, 128)], ids=["small", "full-61x128"])
def test_gpu_loads_writes_png(tmp_path, shape):
    rng = np.random.default_rng(2)
    before_LG = rng.gamma(3, 100, size=shape)
    after_LG = before_LG.mean(axis=1, keepdims=True) * (1 + 0.05 * rng.random(shape))
    path = tmp_path / "gpu.png"
    plot_gpu_loads(before_LG, after_LG, path, labels=("greedy", "OR-Tools"))
    assert_png(path)


def test_gpu_loads_copes_with_one_layer_and_a_layer_without_tokens(tmp_path):
    plot_gpu_loads(np.zeros((1, 4)), np.zeros((1, 4)), tmp_path / "gpu.png")
    assert_png(tmp_path / "gpu.png")


def test_imbalance_over_time_writes_png_for_short_series(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "time.png"
    plot_imbalance_over_time({"greedy": 1 + rng.random(20), "ortools": 1 + 0.2 * rng.random(12)}, path)
    assert_png(path)


def test_imbalance_over_time_writes_png_for_long_series_with_refits_and_bound(tmp_path):
    rng = np.random.default_rng(4)
    series = {f"policy {i}": 1 + rng.exponential(0.3 / (i + 1), size=2000 - 100 * i) for i in range(9)}
    path = tmp_path / "time.png"
    plot_imbalance_over_time(
        series, path, refit_steps=list(range(0, 2000, 250)), lower_bound_T=np.full(2000, 1.02), title="rolling replay"
    )
    assert_png(path)


BAD_CALLS = [
    (lambda p: plot_load_heatmap(np.ones(12), p), "load_LE"),
    (lambda p: plot_load_heatmap(np.ones((2, 3, 4)), p), "load_LE"),
    (lambda p: plot_load_heatmap(np.ones((0, 12)), p), "load_LE"),
    (lambda p: plot_load_heatmap(np.array([[1.0, np.nan]]), p), "finite"),
    (lambda p: plot_load_heatmap(np.array([[1.0, -1.0]]), p), ">= 0"),
    (lambda p: plot_load_heatmap([["a", "b"]], p), "numeric"),
    (lambda p: plot_gpu_loads(np.ones((4, 8)), np.ones((4, 16)), p), "same shape"),
    (lambda p: plot_gpu_loads(np.ones(8), np.ones(8), p), "before_LG"),
    (lambda p: plot_gpu_loads(np.ones((4, 8)), np.full((4, 8), np.inf), p), "after_LG"),
    (lambda p: plot_gpu_loads(np.ones((4, 8)), np.ones((4, 8)), p, labels=("only one",)), "labels"),
    (lambda p: plot_imbalance_over_time({}, p), "series"),
    (lambda p: plot_imbalance_over_time({"a": np.ones((3, 3))}, p), "series['a']"),
    (lambda p: plot_imbalance_over_time({"a": np.ones(5)}, p, lower_bound_T=np.ones((5, 1))), "lower_bound_T"),
    (lambda p: plot_imbalance_over_time({"a": np.ones(5)}, p, refit_steps=[-1]), "refit_steps"),
]


@pytest.mark.parametrize(
    "call, needle",
    BAD_CALLS,
    ids=[
        "heatmap-1d", "heatmap-3d", "heatmap-empty", "heatmap-nan", "heatmap-negative", "heatmap-strings",
        "gpu-shape-mismatch", "gpu-1d", "gpu-inf", "gpu-one-label",
        "time-empty-dict", "time-2d-series", "time-2d-bound", "time-negative-refit",
    ],
)
def test_bad_input_raises_one_line_value_error_and_writes_nothing(tmp_path, call, needle):
    path = tmp_path / "bad.png"
    with pytest.raises(ValueError) as info:
        call(path)
    message = str(info.value)
    assert needle in message and "expected" in message and "\n" not in message, message
    assert not path.exists()


CALLS = [
    lambda p: plot_load_heatmap(np.ones((2, 12)), p),
    lambda p: plot_gpu_loads(np.ones((2, 8)), np.ones((2, 8)), p),
    lambda p: plot_imbalance_over_time({"a": np.ones(10)}, p),
]


@pytest.mark.parametrize("call", CALLS, ids=["heatmap", "gpu-loads", "over-time"])
def test_failing_write_keeps_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, call):
    path = tmp_path / "figure.png"
    path.write_bytes(b"old content")

    def broken_savefig(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(PNG_SIGNATURE)  # a partial file, then the disk "fills up"
        raise OSError("No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(EplbError, match=r"cannot write .*figure\.png: No space left on device"):
        call(path)
    assert path.read_bytes() == b"old content"
    assert no_temp_files_left(tmp_path)


def test_failing_write_to_new_path_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(Figure, "savefig", lambda self, fname, **kwargs: (_ for _ in ()).throw(OSError("boom")))
    path = tmp_path / "new" / "heat.png"
    with pytest.raises(EplbError, match="heat.png: boom"):
        plot_load_heatmap(np.ones((2, 12)), path)
    assert not path.exists()
    assert list(path.parent.iterdir()) == []
