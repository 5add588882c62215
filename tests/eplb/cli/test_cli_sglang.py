"""`eplb` with SGLang: its dumps read (the circular buffer's zero steps dropped with one line that counts them, the
dense layers kept aside, detail mode too), and `--sglang-out` written with one row per model layer as SGLang indexes
its map, or refused in one line that names the fix. Runs without SGLang: SGLang's loader checks are mirrored here
(every id a logical expert, every expert a slot in every row, one row per decoder layer); they run for real in
`tests/eplb/engines/test_sglang_loader.py` where SGLang's source is installed.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

LAYERS, DENSE, EXPERTS = 61, 3, 256  # DeepSeek-V3
CLUSTER = ("--gpus", "32", "--slots-per-gpu", "9")  # 288 slots: 256 + 32 redundant


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict:
    """A DeepSeek-V3-shaped stat dump (30 of 100 buffer steps recorded; layers 0-2 dense), a 58-layer counts trace,
    and a detail-mode dump of a small model (layers 0-1 dense) on a map with redundant slots."""
    folder = tmp_path_factory.mktemp("sglang")
    rng = np.random.default_rng(0)
    buffer = np.zeros((100, LAYERS, EXPERTS), dtype=np.int32)
    buffer[:30, DENSE:] = rng.poisson(rng.lognormal(0.0, 1.0, size=(LAYERS - DENSE, EXPERTS)) * 8,
                                      size=(30, LAYERS - DENSE, EXPERTS))
    torch.save({"rank": 0, "logical_count": torch.tensor(buffer), "average_utilization_rate_over_window": None},
               folder / "stat.pt")
    np.save(folder / "moe58.npy", buffer[:30, DENSE:].astype(np.int64))
    phy2log = np.stack([np.r_[np.arange(16), np.arange(4)] for _ in range(6)])  # 6 layers, 20 slots, 16 experts
    records = []
    for step in range(12):
        count = np.zeros((6, 20), dtype=np.int32)
        count[2:] = rng.integers(0, 30, size=(4, 20))
        records.append({"forward_pass_id": step, "rank": 0, "gatherer_key": "primary",
                        "global_physical_count": torch.tensor(count)})
    torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(phy2log)}, folder / "detail.pt")
    return {"dir": folder, "buffer": buffer}


def loads_in_sglang(rows: list, num_layers: int, num_experts: int, num_slots: int) -> bool:
    """SGLang's loader checks on a `--init-expert-location` map, mirrored: one row per decoder layer, each `num_slots`
    logical expert ids in [0, E) (a list of E is indexed by them), every expert with a slot in every row (the static
    dispatch table asserts it)."""
    return (len(rows) == num_layers and all(len(row) == num_slots for row in rows)
            and all(set(row) == set(range(num_experts)) for row in rows))


def test_place_help_never_calls_the_placement_file_sglang_s(run_eplb):
    text = " ".join(run_eplb("place", "--help").stdout.split())
    assert "SGLang-readable" not in text
    assert "SGLang refuses it: give SGLang the --sglang-out file" in text
    assert "--sglang-num-layers" in text and "--sglang-first-moe-layer" in text


def test_a_deepseek_v3_dump_gives_61_aligned_rows_and_one_line_on_the_steps_dropped(run_eplb, dumps, tmp_path):
    out, sglang = tmp_path / "placement.json", tmp_path / "sglang.json"
    result = run_eplb("place", "--trace", dumps["dir"] / "stat.pt", *CLUSTER, "--out", out, "--sglang-out", sglang,
                      "--json")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "dropped 70 of 100 steps with no token" in lines[0], lines
    assert "3 dense layers with no token (layers 0-2)" in lines[0]
    report = json.loads(result.stdout)
    assert (report["steps"], report["layers"], report["sglang_rows"]) == (30, 58, 61)
    rows = json.loads(sglang.read_text())["physical_to_logical_map"]
    assert loads_in_sglang(rows, LAYERS, EXPERTS, 288)
    assert rows[DENSE:] == json.loads(out.read_text())["physical_to_logical_map"]


def test_scores_count_the_recorded_steps_only(run_eplb, dumps, tmp_path):
    placement = tmp_path / "placement.json"
    assert run_eplb("place", "--trace", dumps["dir"] / "moe58.npy", *CLUSTER, "--out", placement).returncode == 0
    scores = {}
    for name in ("stat.pt", "moe58.npy"):
        result = run_eplb("score", "--placement", placement, "--trace", dumps["dir"] / name, "--json")
        assert result.returncode == 0, result.stderr
        scores[name] = json.loads(result.stdout)
    assert scores["stat.pt"]["imbalance_mean"] == scores["moe58.npy"]["imbalance_mean"]
    assert scores["stat.pt"]["steps"] == 30


def test_flags_name_the_layers_of_a_trace_that_does_not_record_them(run_eplb, dumps, tmp_path):
    sglang = tmp_path / "sglang.json"
    result = run_eplb("place", "--trace", dumps["dir"] / "moe58.npy", *CLUSTER, "--out", tmp_path / "p.json",
                      "--sglang-out", sglang, "--sglang-num-layers", "61", "--sglang-first-moe-layer", "3", "--quiet")
    assert result.returncode == 0, result.stderr
    rows = json.loads(sglang.read_text())["physical_to_logical_map"]
    assert loads_in_sglang(rows, LAYERS, EXPERTS, 288)
    assert rows[DENSE:] == json.loads((tmp_path / "p.json").read_text())["physical_to_logical_map"]


@pytest.mark.parametrize(
    ("trace", "flags", "message"),
    [
        ("moe58.npy", (), "--sglang-out needs the model's layers, which moe58.npy does not record; add "
                          "--sglang-num-layers N --sglang-first-moe-layer K"),
        ("moe58.npy", ("--sglang-num-layers", "61", "--sglang-first-moe-layer", "0"),
         "the trace has 58 MoE layers but --sglang-num-layers 61 --sglang-first-moe-layer 0 name 61"),
        ("moe58.npy", ("--sglang-num-layers", "61", "--sglang-first-moe-layer", "0"),
         "give --sglang-first-moe-layer 3"),
        ("moe58.npy", ("--sglang-num-layers", "61"), "go together; add --sglang-first-moe-layer"),
        ("moe58.npy", ("--sglang-num-layers", "3", "--sglang-first-moe-layer", "3"),
         "--sglang-first-moe-layer 3 must be below --sglang-num-layers 3"),
        ("stat.pt", ("--sglang-num-layers", "61", "--sglang-first-moe-layer", "0"),
         "but the SGLang dump stat.pt records 61 layers, MoE layers 3-60; drop both flags"),
    ],
    ids=["58-rows-no-layout", "58-rows-shifted", "58-rows-names-the-fix", "one-flag", "first-not-below",
         "dump-disagrees"],
)
def test_a_map_that_would_not_line_up_is_refused_in_one_line(run_eplb, one_line_error, dumps, tmp_path, trace, flags,
                                                              message):
    result = run_eplb("place", "--trace", dumps["dir"] / trace, *CLUSTER, "--out", tmp_path / "p.json",
                      "--sglang-out", tmp_path / "s.json", *flags)
    one_line_error(result, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flags", "message"), [
    (("--sglang-num-layers", "61", "--sglang-first-moe-layer", "3"),
     "shape the --sglang-out file; add --sglang-out FILE or drop them"),
    (("--sglang-out", "{dir}/sglang.map"), "must end in .json: SGLang reads --init-expert-location from a file only"),
], ids=["layer-flags-without-sglang-out", "sglang-out-not-json"])
def test_sglang_flags_that_cannot_serve_are_refused(run_eplb_here, one_line_error, dumps, tmp_path, flags, message):
    flags = [flag.format(dir=tmp_path) for flag in flags]
    result = run_eplb_here("place", "--trace", dumps["dir"] / "stat.pt", *CLUSTER, "--out", tmp_path / "p.json",
                           *flags)
    one_line_error(result, message)


def test_a_detail_mode_dump_is_placed_with_its_own_layout(run_eplb, dumps, tmp_path):
    sglang = tmp_path / "sglang.json"
    result = run_eplb("place", "--trace", dumps["dir"] / "detail.pt", "--gpus", "4", "--slots-per-gpu", "5",
                      "--out", tmp_path / "p.json", "--sglang-out", sglang, "--json")
    assert result.returncode == 0, result.stderr
    assert (json.loads(result.stdout)["steps"], json.loads(result.stdout)["layers"]) == (12, 4)
    assert loads_in_sglang(json.loads(sglang.read_text())["physical_to_logical_map"], 6, 16, 20)
