"""TensorRT-LLM expert-statistic dumps read as routing traces: the ranks' counts summed into [T, L, E], the model's
layer ids and the recorded iterations kept, the files TensorRT-LLM writes beside them ignored, and every dump that
is not the documented layout refused with one line saying what was expected."""

import json
import os
import struct
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces import TraceFormatError, load_trace
from traces.safetensors_reader import read_header, read_tensors
from traces.trtllm_statistics import is_trtllm_dump, load_trtllm_statistics, read_dump_layout

LAYERS = (3, 4, 6)  # decoder-layer ids of the MoE layers, not consecutive (layer 5 dense)
RANKS, STEPS, EXPERTS = 2, 4, 8


def identity_counts() -> np.ndarray:
    """[R, T, L, E] counts that encode where they come from: rank * 10^6 + t * 10^4 + l * 100 + e."""
    r, t, l, e = np.meshgrid(*(np.arange(n) for n in (RANKS, STEPS, len(LAYERS), EXPERTS)), indexing="ij")
    return r * 10**6 + t * 10**4 + l * 100 + e


@pytest.fixture()
def dump(tmp_path, write_trtllm_dump):
    return write_trtllm_dump(tmp_path / "expert_statistic", identity_counts(), LAYERS, first_iteration=100, top_k=2)


def test_dump_reads_as_the_ranks_counts_summed_per_iteration_layer_and_expert(dump):
    trace = load_trtllm_statistics(dump)
    np.testing.assert_array_equal(trace.counts_TLE, identity_counts().sum(axis=0))
    assert trace.counts_TLE.dtype == np.int64
    assert (trace.header.num_layers, trace.header.num_experts, trace.header.top_k) == (3, EXPERTS, 2)
    assert "iterations 100..103" in trace.header.source and "layers 3,4,6" in trace.header.source


def test_layout_names_the_model_layer_ids_iterations_and_rank_files(dump):
    layout = read_dump_layout(dump)
    assert layout.layer_ids == LAYERS
    assert layout.iterations == range(100, 104)
    assert (layout.num_ranks, layout.num_experts, layout.top_k) == (RANKS, EXPERTS, 2)


def test_load_trace_takes_the_dump_directory_as_any_trace(dump):
    assert is_trtllm_dump(dump)
    np.testing.assert_array_equal(load_trace(dump).counts_TLE, identity_counts().sum(axis=0))


def test_int32_counts_of_older_versions_read_the_same(tmp_path, write_trtllm_dump):
    folder = write_trtllm_dump(tmp_path / "d", identity_counts() % 1000, LAYERS, dtype="int32")
    np.testing.assert_array_equal(load_trace(folder).counts_TLE, (identity_counts() % 1000).sum(axis=0))


def test_files_other_versions_write_beside_the_counts_are_ignored(dump):
    """rank<r>_raw.safetensors (raw top-k ids [N, K]), cooccurrence_rank<r>.safetensors, rank<r>_numtokens.json."""
    from safetensors.numpy import save_file

    save_file({"100_3": np.zeros((5, 2), dtype=np.int32)}, str(dump / "rank0_raw.safetensors"))
    save_file({"100_3": np.ones((EXPERTS, EXPERTS), dtype=np.int32)}, str(dump / "cooccurrence_rank0.safetensors"))
    (dump / "rank0_numtokens.json").write_text("{}")
    np.testing.assert_array_equal(load_trace(dump).counts_TLE, identity_counts().sum(axis=0))


@pytest.mark.parametrize(("writer", "recorded", "raw_files"), [
    ("exclusive", range(100, 103), False),  # START <= i < STOP
    ("inclusive", range(100, 104), True),  # START..STOP, and rank<r>_raw.safetensors beside the counts
], ids=["start-to-before-stop", "start-to-stop-with-raw-ids"])
def test_either_writer_versions_dump_reads_as_the_iterations_it_recorded(tmp_path, record_trtllm_dump, writer,
                                                                         recorded, raw_files):
    """EXPERT_STATISTIC_ITER_RANGE=100-103 on 2 ranks: each version's dump reads as the bincounts of the iterations
    that version records, summed over ranks, whatever else it writes beside them."""
    ids_RILNK = np.random.default_rng(5).integers(0, EXPERTS, size=(RANKS, 106, len(LAYERS), 6, 2))
    folder = record_trtllm_dump(tmp_path / "expert_statistic", ids_RILNK, LAYERS, "100-103", EXPERTS, writer)
    assert (folder / "rank0_raw.safetensors").is_file() == raw_files
    assert read_dump_layout(folder).iterations == recorded
    expected = [[np.bincount(ids_RILNK[:, i, l].ravel(), minlength=EXPERTS) for l in range(len(LAYERS))]
                for i in recorded]
    np.testing.assert_array_equal(load_trace(folder).counts_TLE, expected)


def test_safetensors_reader_matches_the_safetensors_package(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    tensors = {"a": np.arange(12, dtype=np.int64).reshape(3, 4), "b": np.array([1.5, -2.0], dtype=np.float32),
               "c": np.array([7, 8, 9], dtype=np.uint16), "empty": np.zeros((0, 3), dtype=np.int32)}
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "np"})
    ours, theirs = read_tensors(tmp_path / "t.safetensors"), load_file(str(tmp_path / "t.safetensors"))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name])
        assert ours[name].dtype == theirs[name].dtype
    # The header read without mapping the file claims what the package lists.
    with safe_open(str(tmp_path / "t.safetensors"), framework="numpy") as handle:
        assert read_header(tmp_path / "t.safetensors") == {
            name: {"dtype": handle.get_slice(name).get_dtype(), "shape": list(handle.get_slice(name).get_shape())}
            for name in handle.keys()}


def _overlapping(dump):
    """rank1.safetensors whose records all claim the first record's bytes (a file the package refuses)."""
    records = [f"{100 + t}_{layer}" for t in range(STEPS) for layer in LAYERS]
    raw = json.dumps({key: {"dtype": "I64", "shape": [8], "data_offsets": [0, 64]} for key in records}).encode()
    (dump / "rank1.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(64))


def _meta(dump, text):
    (dump / "meta_info.json").write_text(text)


def _save(dump, name, records):
    from safetensors.numpy import save_file

    save_file(records, str(dump / name))


MALFORMED = [
    ("no-meta-info", lambda d: (d / "meta_info.json").unlink(), "without meta_info.json"),
    ("meta-info-null", lambda d: _meta(d, "null"), "recorded no iteration"),
    ("meta-info-not-json", lambda d: _meta(d, "{num_experts"), "not valid JSON"),
    ("meta-info-without-num-experts", lambda d: _meta(d, '{"num_experts_per_token": 2}'), '{"num_experts": E'),
    ("top-k-above-experts", lambda d: _meta(d, '{"num_experts": 8, "num_experts_per_token": 9}'),
     "num_experts_per_token is 9"),
    ("no-rank-file", lambda d: [f.unlink() for f in d.glob("rank*.safetensors")], "no rank<r>.safetensors"),
    ("a-rank-missing", lambda d: shutil.move(d / "rank1.safetensors", d / "rank2.safetensors"),
     "rank1.safetensors is missing"),
    ("tensor-name-not-iteration-layer", lambda d: _save(d, "rank1.safetensors", {"layer3": np.zeros(8, np.int64)}),
     "expected names '<iteration>_<layer>'"),
    ("counts-of-other-length", lambda d: _save(d, "rank1.safetensors", {"100_3": np.zeros(9, np.int64)}),
     "expected integer counts [8]"),
    ("float-counts", lambda d: _save(d, "rank1.safetensors", {"100_3": np.zeros(8, np.float32)}),
     "expected integer counts [8]"),
    ("an-iteration-missing", lambda d: _save(d, "rank1.safetensors", {"110_3": np.zeros(8, np.int64)}),
     "records missing"),
    ("truncated-file", lambda d: (d / "rank1.safetensors").write_bytes((d / "rank1.safetensors").read_bytes()[:-9]),
     "truncated"),
    ("not-a-safetensors-file", lambda d: (d / "rank0.safetensors").write_bytes(b"\x00" * 40),
     "not a safetensors file"),
    ("a-rank-with-another-layer-set", lambda d: _save(d, "rank1.safetensors", {
        f"{100 + t}_{layer}": np.zeros(8, np.int64) for t in range(STEPS) for layer in (3, 4, 7)}),
     "rank0.safetensors lacks '100_7'"),
    ("a-rank-missing-a-layer", lambda d: _save(d, "rank1.safetensors", {
        f"{100 + t}_{layer}": np.zeros(8, np.int64) for t in range(STEPS) for layer in (3, 4)}),
     "rank1.safetensors lacks '100_6'"),
    ("a-rank-file-that-is-a-folder", lambda d: ((d / "rank1.safetensors").unlink(), (d / "rank1.safetensors").mkdir()),
     "rank1.safetensors is not a regular file"),
    ("a-rank-file-that-is-a-fifo", lambda d: ((d / "rank1.safetensors").unlink(), os.mkfifo(d / "rank1.safetensors")),
     "rank1.safetensors is not a regular file"),
    ("a-rank-file-linked-to-dev-zero", lambda d: ((d / "rank1.safetensors").unlink(),
                                                  os.symlink("/dev/zero", d / "rank1.safetensors")),
     "rank1.safetensors is not a regular file"),
    ("counts-summing-past-int64", lambda d: [_save(d, f"rank{r}.safetensors", {
        f"{100 + t}_{layer}": np.full(8, 2**62, np.int64) for t in range(STEPS) for layer in LAYERS})
        for r in range(RANKS)], "sum to more than 2^53 tokens"),
    ("records-sharing-their-bytes", _overlapping, "rank1.safetensors is not a safetensors file (invalid offset"),
    ("negative-counts", lambda d: _save(d, "rank1.safetensors", {
        f"{100 + t}_{layer}": np.full(8, -1, np.int64) for t in range(STEPS) for layer in LAYERS}),
     "holds a negative count"),
]


@pytest.mark.parametrize(("spoil", "expected"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_dump_not_in_the_documented_layout_is_refused_in_one_line(dump, spoil, expected):
    spoil(dump)
    with pytest.raises(TraceFormatError) as caught:
        load_trace(dump)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message


def test_one_file_of_a_dump_is_refused_with_the_directory_to_give(dump):
    for name in ("rank0.safetensors", "meta_info.json"):
        with pytest.raises(TraceFormatError, match=f"give its directory {dump}"):
            load_trace(dump / name)


def test_top_k_id_log_options_are_refused_for_a_dump(dump):
    with pytest.raises(TraceFormatError, match="tokens_per_step=4: only top-k id logs"):
        load_trace(dump, tokens_per_step=4)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 400), flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4))
def test_a_corrupted_rank_file_reads_or_is_refused_never_crashes(dump, cut, flips):
    original = (dump / "rank0.safetensors").read_bytes()
    spoilt = bytearray(original[:len(original) - cut])
    for at, value in flips:
        if at < len(spoilt):
            spoilt[at] = value
    (dump / "rank0.safetensors").write_bytes(bytes(spoilt))
    try:
        load_trace(dump)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
    finally:
        (dump / "rank0.safetensors").write_bytes(original)

