"""Small hostile dumps stay small: every engine dump or trace file whose header, shape or ids ask for gigabytes is
refused in one line before anything of that size is allocated. Each file is read by `load_trace` in one child process
under a 1 GiB address-space limit (RLIMIT_AS: a refused allocation fails there instead of swapping), and the child's
peak memory is checked to stay under 1 GB."""

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 1 << 30


def _meta(folder: Path, num_experts: int) -> None:
    folder.mkdir()
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": num_experts, "num_experts_per_token": 2}))


def _safetensors(path: Path, header: dict, data_bytes: int | None = None, data: bytes = b"") -> None:
    """A safetensors file with this header and data (or a sparse tail of `data_bytes` zero bytes)."""
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + data)
        if data_bytes is not None:
            handle.truncate(8 + len(raw) + data_bytes)


def expanded_logical_count(d: Path) -> Path:
    """A 1.6 KB stat dump whose logical_count is torch.ones(1, 1, 1).expand(200000, 61, 256): 3.1e9 counts."""
    torch.save({"logical_count": torch.ones(1, 1, 1, dtype=torch.int64).expand(200000, 61, 256)}, d / "x.pt")
    return d / "x.pt"


def detail_dump(d: Path, expert_id: int, name: str) -> Path:
    """A 3.6 KB detail dump whose map names expert `expert_id` (the trace would be [1, 4, expert_id + 1])."""
    phy2log = torch.arange(16).reshape(4, 4) % 4
    phy2log[0, 0] = expert_id
    record = {"forward_pass_id": 0, "global_physical_count": torch.ones(4, 4, dtype=torch.int64)}
    torch.save({"records": [record], "last_physical_to_logical_map": phy2log}, d / name)
    return d / name


def shared_storage_records(d: Path) -> Path:
    """30,000 records whose counts are one [61, 320] tensor: each counted as its own [61, 320] record."""
    shared = torch.ones(61, 320, dtype=torch.int64)
    records = [{"forward_pass_id": i, "global_physical_count": shared} for i in range(30000)]
    torch.save({"records": records, "last_physical_to_logical_map": torch.arange(61 * 320).reshape(61, 320) % 256},
               d / "shared.pt")
    return d / "shared.pt"


def compressed_record(d: Path) -> Path:
    """A torch file whose storage record is deflated: 2 GB of zeros in a few MB."""
    torch.save({"logical_count": torch.zeros(2, 2, 2, dtype=torch.int64)}, d / "plain.pt")
    with zipfile.ZipFile(d / "plain.pt") as source, zipfile.ZipFile(d / "bomb.pt", "w") as bomb:
        for info in source.infolist():
            bomb.writestr(info.filename, source.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return d / "bomb.pt"


def overlapping_offsets(d: Path) -> Path:
    """num_experts 5,000,000 and 100 records whose data_offsets all name the same 40 MB."""
    folder = d / "overlap"
    _meta(folder, 5_000_000)
    header = {f"{100 + i}_3": {"dtype": "I64", "shape": [5_000_000], "data_offsets": [0, 40_000_000]}
              for i in range(100)}
    _safetensors(folder / "rank0.safetensors", header, data_bytes=40_000_000)
    return folder


def sparse_rank_file(d: Path) -> Path:
    """A 3 GB rank file that is all holes, its header tiling it with [1,000,000] I64 records."""
    folder = d / "sparse"
    _meta(folder, 1_000_000)
    header = {f"{100 + i}_3": {"dtype": "I64", "shape": [1_000_000], "data_offsets": [i * 8_000_000,
                                                                                      (i + 1) * 8_000_000]}
              for i in range(375)}
    _safetensors(folder / "rank0.safetensors", header, data_bytes=375 * 8_000_000)
    return folder


def huge_rank_number(d: Path) -> Path:
    """rank0.safetensors and rank99999999999999999999.safetensors."""
    from safetensors.numpy import save_file

    folder = d / "ranks"
    _meta(folder, 4)
    for rank in (0, 99999999999999999999):
        save_file({"100_3": np.ones(4, dtype=np.int64)}, str(folder / f"rank{rank}.safetensors"))
    return folder


def huge_layer_id(d: Path, layer: int, name: str) -> Path:
    from safetensors.numpy import save_file

    folder = d / name
    _meta(folder, 4)
    save_file({"100_3": np.ones(4, dtype=np.int64), f"100_{layer}": np.ones(4, dtype=np.int64)},
              str(folder / "rank0.safetensors"))
    return folder


def zip_bomb_npz(d: Path) -> Path:
    """An .npz whose `counts` member inflates to [100000, 61, 256] int64 (12 GB) from a few MB."""
    path = d / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("counts.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, {"descr": "<i8", "fortran_order": False,
                                                          "shape": (100000, 61, 256)})
            chunk = bytes(1 << 24)
            for _ in range(4):  # the header is read first: a few chunks of the body are enough to show it
                member.write(chunk)
    return path


def topk_log_with_huge_experts(d: Path) -> Path:
    """A small top-k log whose num_experts array claims 10^12 experts."""
    np.savez(d / "topk.npz", chat_topk_ids=np.zeros((2, 64, 2), dtype=np.int64), num_experts=np.array(10**12))
    return d / "topk.npz"


HOSTILE = [
    ("sglang-expanded-logical-count", expanded_logical_count, "claim"),
    ("sglang-expert-id-50-million", lambda d: detail_dump(d, 50_000_000, "e50m.pt"), "expert id 50000000"),
    ("sglang-expert-id-1e9", lambda d: detail_dump(d, 10**9, "e1g.pt"), "expert id 1000000000"),
    ("sglang-records-sharing-one-storage", shared_storage_records, "sharing one storage"),
    ("sglang-compressed-record", compressed_record, "is compressed"),
    ("trtllm-overlapping-offsets", overlapping_offsets, "a trace may hold when read"),
    ("trtllm-sparse-3gb-rank-file", sparse_rank_file, "a trace may hold when read"),
    ("trtllm-rank-99999999999999999999", huge_rank_number, "rank1.safetensors is missing"),
    ("trtllm-layer-id-1e15", lambda d: huge_layer_id(d, 10**15, "l15"), "expected a model layer id below 1024"),
    ("trtllm-layer-id-50-million", lambda d: huge_layer_id(d, 50_000_000, "l50m"), "below 1024"),
    ("npz-zip-bomb", zip_bomb_npz, "a trace may hold when read"),
    ("topk-log-10-12-experts", topk_log_with_huge_experts, "a trace may hold when read"),
]

CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
import torch
from traces import TraceFormatError, load_trace
out = {{}}
for path in sys.argv[1:]:
    try:
        load_trace(path, **({{"tokens_per_step": 16}} if path.endswith("topk.npz") else {{}}))
        out[path] = ("read", "")
    except TraceFormatError as exc:
        out[path] = ("refused", str(exc))
    except BaseException as exc:
        out[path] = (type(exc).__name__, str(exc)[:300])
# This process's own peak (VmHWM): getrusage's ru_maxrss keeps the peak of the process it was forked from across exec.
with open("/proc/self/status") as status:
    out["peak_bytes"] = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def read_in_a_small_child(tmp_path_factory) -> dict:
    """{case id: (outcome, message)} of every HOSTILE file read by one child under the limit, and its peak."""
    folder = tmp_path_factory.mktemp("hostile")
    paths = {name: str(build(folder)) for name, build, _ in HOSTILE}
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", CHILD.format(limit=LIMIT_BYTES), *paths.values()],
                            capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    return {"peak_bytes": out["peak_bytes"], **{name: out[path] for name, path in paths.items()}}


@pytest.mark.parametrize(("name", "expected"), [(h[0], h[2]) for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_small_hostile_dump_is_refused_in_one_line_before_allocating(read_in_a_small_child, name, expected):
    outcome, message = read_in_a_small_child[name]
    assert outcome == "refused", (outcome, message)
    assert expected in message and "\n" not in message, message


def test_reading_every_hostile_dump_stays_under_one_gigabyte(read_in_a_small_child):
    assert read_in_a_small_child["peak_bytes"] < 1e9


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from traces import TraceFormatError, load_trace  # noqa: E402
from traces.routing_trace import MAX_READ_VALUES  # noqa: E402

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
BIG = st.one_of(st.integers(0, 8), st.integers(0, 2**64), st.sampled_from([5_000_000, 10**15, 2**63]))


@FUZZ
@given(entries=st.lists(st.tuples(st.one_of(st.integers(3, 4), BIG), BIG, BIG, BIG), min_size=1, max_size=4),
       num_experts=BIG, data_bytes=st.integers(0, 256))
def test_any_rank_file_header_reads_small_or_is_refused(tmp_path, entries, num_experts, data_bytes):
    """Headers with any layer ids, shapes and offsets over a few hundred bytes of data: read into a trace no larger
    than the data allows, or refused in one line."""
    folder = tmp_path / "dump"
    if folder.exists():
        for file in folder.iterdir():
            file.unlink()
        folder.rmdir()
    _meta(folder, max(1, num_experts))
    header = {f"{100 + i}_{layer}": {"dtype": "U8", "shape": [shape], "data_offsets": [begin, end]}
              for i, (layer, shape, begin, end) in enumerate(entries)}
    _safetensors(folder / "rank0.safetensors", header, data=bytes(data_bytes))
    try:
        trace = load_trace(folder)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
    else:
        assert trace.counts_TLE.size <= max(data_bytes, 1)


@FUZZ
@given(expert_id=BIG, shape=st.tuples(st.integers(1, 4), st.integers(1, 6)), dtype=st.sampled_from(
    [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32]), negative=st.integers(-3, 0))
def test_any_detail_dump_map_and_counts_read_small_or_are_refused(tmp_path, expert_id, shape, dtype, negative):
    """Expert ids of any size, counts of any dtype and ids below -1: read, or refused in one line."""
    layers, slots = shape
    phy2log = torch.arange(layers * slots).reshape(layers, slots) % slots
    phy2log[0, 0] = min(expert_id, 2**63 - 1)
    ids = torch.zeros(layers, 3, 2, dtype=torch.int64)
    ids[0, 0, 0] = negative
    record = {"forward_pass_id": 0, "topk_ids_of_layer": ids.to(dtype)}
    torch.save({"records": [record], "last_physical_to_logical_map": phy2log}, tmp_path / "d.pt")
    try:
        trace = load_trace(tmp_path / "d.pt")
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
    else:
        assert trace.counts_TLE.size <= MAX_READ_VALUES and expert_id < slots and negative >= -1
        assert dtype not in (torch.bool, torch.float32)
