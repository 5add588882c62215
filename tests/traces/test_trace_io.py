"""Reading and writing routing traces in every supported format."""

from pathlib import Path

import numpy as np
import pytest

from traces import EplbError, RoutingTrace, TraceFormatError, counts_from_topk_ids, load_trace, save_trace

ESFT = Path(__file__).resolve().parents[2].parent / "shared/data/esft-dsv2lite/esft_vanilla_lite_routing.npz"


def small_counts(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50, size=(5, 3, 8))


@pytest.mark.parametrize("suffix", [".npz", ".npy"], ids=["native-npz", "plain-npy"])
def test_save_then_load_keeps_counts(tmp_path, suffix):
    trace = RoutingTrace.from_counts(small_counts(), top_k=2, tokens_per_step=40, source="unit")
    path = tmp_path / f"t{suffix}"
    save_trace(trace, path)
    loaded = load_trace(path)
    np.testing.assert_array_equal(loaded.counts_TLE, trace.counts_TLE)
    if suffix == ".npz":
        assert loaded.header == trace.header


def test_npz_written_without_pickle_loads_with_allow_pickle_false(tmp_path):
    save_trace(RoutingTrace.from_counts(small_counts()), tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz", allow_pickle=False) as data:
        assert data["counts"].shape == (5, 3, 8)


def test_sglang_dump_with_logical_count_is_read(tmp_path):
    torch = pytest.importorskip("torch")
    counts = small_counts()
    torch.save({"logical_count": torch.tensor(counts), "other": 1}, tmp_path / "dump.pt")
    np.testing.assert_array_equal(load_trace(tmp_path / "dump.pt").counts_TLE, counts)


def test_sglang_dump_without_logical_count_is_rejected(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"something": torch.zeros(2)}, tmp_path / "dump.pt")
    with pytest.raises(TraceFormatError, match="logical_count"):
        load_trace(tmp_path / "dump.pt")


def test_topk_ids_are_grouped_into_steps_and_counted():
    # 2 layers, 5 tokens, top-2; steps of 2 tokens -> 2 steps, the fifth token dropped.
    ids = np.array(
        [
            [[0, 1], [1, 2], [3, 0], [3, 1], [2, 2]],
            [[2, 3], [2, 1], [0, 1], [0, -1], [1, 1]],
        ]
    )
    counts = counts_from_topk_ids(ids, num_experts=4, tokens_per_step=2)
    assert counts.shape == (2, 2, 4)
    np.testing.assert_array_equal(counts[0, 0], [1, 2, 1, 0])
    np.testing.assert_array_equal(counts[1, 0], [1, 1, 0, 2])
    np.testing.assert_array_equal(counts[1, 1], [2, 1, 0, 0])  # the -1 pick is not counted


def test_topk_log_npz_needs_tokens_per_step(tmp_path):
    np.savez(tmp_path / "log.npz", a_topk_ids=np.zeros((2, 10, 2), dtype=np.int8))
    with pytest.raises(TraceFormatError, match="tokens_per_step"):
        load_trace(tmp_path / "log.npz")
    trace = load_trace(tmp_path / "log.npz", tokens_per_step=5, num_experts=4)
    assert trace.counts_TLE.shape == (2, 2, 4)


@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((4, 4)), "3-D"),
        (-np.ones((2, 2, 2)), "negative"),
        (np.full((2, 2, 2), np.nan), "NaN"),
        (np.full((2, 2, 2), 0.5), "non-integer"),
        (np.zeros((0, 2, 2)), "empty"),
    ],
    ids=["rank-2", "negative", "nan", "fractional", "empty"],
)
def test_bad_counts_raise_clear_errors(tmp_path, array, message):
    np.save(tmp_path / "bad.npy", array)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(tmp_path / "bad.npy")


def test_missing_or_unknown_files_raise_trace_format_error(tmp_path):
    with pytest.raises(TraceFormatError, match="not found"):
        load_trace(tmp_path / "absent.npz")
    (tmp_path / "t.csv").write_text("1,2\n")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        load_trace(tmp_path / "t.csv")
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(tmp_path / "broken.npz")


def test_failed_write_leaves_old_file_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    save_trace(RoutingTrace.from_counts(small_counts(0)), path)
    before = path.read_bytes()

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", explode)
    with pytest.raises(EplbError, match="cannot write .*t.npz: disk full"):
        save_trace(RoutingTrace.from_counts(small_counts(1)), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]


@pytest.mark.skipif(not ESFT.exists(), reason="../shared/data/esft-dsv2lite is absent")
def test_esft_log_reads_every_task_and_one_task():
    every = load_trace(ESFT, tokens_per_step=256)
    law = load_trace(ESFT, tokens_per_step=256, tasks=["law"])
    assert every.num_layers == 26 and every.num_experts == 64 and every.header.top_k == 6
    assert (every.counts_TLE.sum(axis=2) == 256 * 6).all()
    assert law.num_steps == 8327 // 256
    with pytest.raises(TraceFormatError, match="available tasks"):
        load_trace(ESFT, tokens_per_step=256, tasks=["poetry"])
