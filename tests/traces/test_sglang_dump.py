"""SGLang's expert-distribution dumps, stat and detail mode, in the layouts SGLang 0.5.23's recorder writes
(`sglang/srt/eplb/expert_distribution.py`): the recorded steps and the MoE layers kept, the model's layer layout
returned, what was left out said in one warning."""

import logging
import os
import re

import numpy as np
import pytest

from placement import ClusterSpec, fit_placement, score_placement
from traces import TraceFormatError, load_trace
from traces.model_layers import ModelLayers
from traces.sglang_dump import check_torch_for_pickles, read_sglang_dump

torch = pytest.importorskip("torch")

LAYERS, DENSE, EXPERTS = 8, 2, 16  # a small DeepSeek-like model: layers 0-1 dense, 2-7 MoE


def recorded_counts(steps: int, seed: int = 0) -> np.ndarray:
    """[steps, LAYERS, EXPERTS] counts as SGLang's recorder sums them: zero in the dense layers."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((steps, LAYERS, EXPERTS), dtype=np.int32)
    popularity = rng.lognormal(2.0, 1.0, size=(LAYERS - DENSE, EXPERTS))
    counts[:, DENSE:] = rng.poisson(popularity, size=counts[:, DENSE:].shape)
    return counts


def stat_dump(path, counts: np.ndarray) -> None:
    """`_StatAccumulator.dump`'s file: rank, logical_count [buffer, layers, experts], the utilisation window."""
    torch.save({"rank": 0, "logical_count": torch.tensor(counts), "average_utilization_rate_over_window": None}, path)


def test_a_circular_buffer_s_zero_steps_and_the_dense_layers_are_left_out(tmp_path):
    buffer = np.zeros((100, LAYERS, EXPERTS), dtype=np.int32)  # 30 steps recorded into a buffer of 100
    buffer[:30] = recorded_counts(30)
    stat_dump(tmp_path / "dump.pt", buffer)
    dump = read_sglang_dump(tmp_path / "dump.pt")
    assert dump.mode == "stat" and dump.zero_steps_dropped == 70
    assert dump.model_layers == ModelLayers(LAYERS, tuple(range(DENSE, LAYERS)))
    np.testing.assert_array_equal(dump.trace.counts_TLE, buffer[:30, DENSE:])
    assert dump.dropped_note().startswith("dropped 70 of 100 steps with no token")
    assert "2 dense layers with no token (layers 0-1)" in dump.dropped_note()


def test_zero_steps_left_out_score_as_the_recorded_steps_alone(tmp_path):
    recorded = recorded_counts(30, seed=1)
    buffer = np.concatenate([recorded, np.zeros((70, LAYERS, EXPERTS), dtype=np.int32)])
    stat_dump(tmp_path / "dump.pt", buffer)
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5)
    placement = fit_placement("deepseek", recorded[:, DENSE:], cluster)
    alone = score_placement(placement, recorded[:, DENSE:], "static").summary()["imbalance_mean"]
    read = score_placement(placement, load_trace(tmp_path / "dump.pt").counts_TLE, "static").summary()
    with_zeros = score_placement(placement, buffer[:, DENSE:].astype(np.int64), "static").summary()
    assert read["imbalance_mean"] == alone and read["steps"] == 30
    assert with_zeros["imbalance_mean"] < alone  # each zero step would count as a perfectly balanced one


def test_load_trace_warns_once_with_the_count_left_out(tmp_path, caplog):
    buffer = np.zeros((10, LAYERS, EXPERTS), dtype=np.int32)
    buffer[:4] = recorded_counts(4)
    stat_dump(tmp_path / "dump.pt", buffer)
    with caplog.at_level(logging.WARNING, logger="traces.trace_io"):
        assert load_trace(tmp_path / "dump.pt").counts_TLE.shape == (4, LAYERS - DENSE, EXPERTS)
    assert len(caplog.records) == 1 and "dropped 6 of 10 steps" in caplog.records[0].getMessage()


def test_a_full_dump_reads_unchanged_and_without_a_warning(tmp_path, caplog):
    counts = recorded_counts(5)[:, DENSE:]  # every layer MoE, every step recorded
    stat_dump(tmp_path / "dump.pt", counts)
    with caplog.at_level(logging.WARNING, logger="traces.trace_io"):
        np.testing.assert_array_equal(load_trace(tmp_path / "dump.pt").counts_TLE, counts)
    assert caplog.records == []


def test_a_dump_with_no_recorded_step_is_refused(tmp_path):
    stat_dump(tmp_path / "dump.pt", np.zeros((10, LAYERS, EXPERTS), dtype=np.int32))
    with pytest.raises(TraceFormatError, match="no recorded step.*start_expert_distribution_record"):
        read_sglang_dump(tmp_path / "dump.pt")


def physical_map(seed: int = 0) -> np.ndarray:
    """[LAYERS, 24] a serving map with 8 redundant slots: each row every expert once, then 8 hot ones again."""
    rng = np.random.default_rng(seed)
    return np.stack([np.concatenate([rng.permutation(EXPERTS), rng.choice(EXPERTS, 8, replace=False)])
                     for _ in range(LAYERS)])


def detail_records(phy2log: np.ndarray, passes: int, tokens: int, *, with_counts: bool) -> tuple[list, np.ndarray]:
    """`_DetailAccumulator`'s records of per_token mode (one per forward pass) and the logical counts they hold.

    Each token picks 4 logical experts per MoE layer; each pick goes to one of that expert's slots (so the record
    holds physical slot ids, as SGLang's recorder sees them after its logical-to-physical dispatch); dense layers
    stay -1.
    """
    rng = np.random.default_rng(7)
    records, expected = [], np.zeros((passes, LAYERS, EXPERTS), dtype=np.int64)
    for step in range(passes):
        ids = np.full((LAYERS, tokens, 8), -1, dtype=np.int32)  # SGLang's buffer has 8 columns; top-4 fills 4
        for layer in range(DENSE, LAYERS):
            for token in range(tokens):
                logical = rng.choice(EXPERTS, 4, replace=False)
                expected[step, layer] += np.bincount(logical, minlength=EXPERTS)
                ids[layer, token, :4] = [rng.choice(np.flatnonzero(phy2log[layer] == e)) for e in logical]
        record = {"forward_pass_id": 100 + step, "rank": 0, "gatherer_key": "primary", "input_ids": [1] * tokens,
                  "positions": list(range(tokens)), "extend_seq_lens": None, "forward_mode": 2,
                  "topk_ids_of_layer": torch.tensor(ids), "misc_objects": []}
        if with_counts:
            flat = ids.reshape(LAYERS, -1)
            record["global_physical_count"] = torch.tensor(
                np.stack([np.bincount(row[row >= 0], minlength=phy2log.shape[1]) for row in flat]), dtype=torch.int32)
        records.append(record)
    return records, expected


@pytest.mark.parametrize("with_counts", [True, False], ids=["global_physical_count", "topk_ids_only"])
def test_a_detail_dump_is_read_through_its_physical_to_logical_map(tmp_path, with_counts):
    phy2log = physical_map()
    records, expected = detail_records(phy2log, passes=5, tokens=6, with_counts=with_counts)
    records = records[::-1]  # any order: the reader sorts by forward_pass_id
    torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(phy2log)}, tmp_path / "detail.pt")
    dump = read_sglang_dump(tmp_path / "detail.pt")
    assert dump.mode == "detail" and dump.zero_steps_dropped == 0
    assert dump.model_layers == ModelLayers(LAYERS, tuple(range(DENSE, LAYERS)))
    np.testing.assert_array_equal(dump.trace.counts_TLE, expected[:, DENSE:])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("last_physical_to_logical_map"), "last_physical_to_logical_map must be a tensor"),
        (lambda d: d.update(records=[]), "records must be a non-empty list"),
        (lambda d: d["records"][0].pop("forward_pass_id"), "forward_pass_id must be an integer"),
        (lambda d: d["records"][0].update(global_physical_count=torch.zeros(3, 3, dtype=torch.int32)),
         "global_physical_count must be \\[8, 24\\]"),
        (lambda d: [(r.pop("global_physical_count"), r.pop("topk_ids_of_layer")) for r in d["records"]],
         "neither global_physical_count nor topk_ids_of_layer"),
    ],
    ids=["no-map", "no-records", "no-pass-id", "counts-wrong-shape", "no-counts-no-ids"],
)
def test_a_broken_detail_dump_is_refused_naming_the_key(tmp_path, change, message):
    records, _ = detail_records(physical_map(), passes=2, tokens=2, with_counts=True)
    data = {"records": records, "last_physical_to_logical_map": torch.tensor(physical_map())}
    change(data)
    torch.save(data, tmp_path / "detail.pt")
    with pytest.raises(TraceFormatError, match=message):
        read_sglang_dump(tmp_path / "detail.pt")


def test_a_pt_file_that_is_no_dump_names_both_modes(tmp_path):
    torch.save({"physical_to_logical_map": torch.zeros(2, 4, dtype=torch.int64)}, tmp_path / "map.pt")
    with pytest.raises(TraceFormatError, match="no 'logical_count' \\(stat mode\\) or 'records' \\(detail mode\\)"):
        load_trace(tmp_path / "map.pt")


def test_model_layers_from_the_first_moe_layer_and_their_checks():
    layers = ModelLayers.from_first_moe_layer(3, 61)
    assert layers.num_moe_layers == 58 and layers.dense_layer_ids == (0, 1, 2)
    assert layers.describe() == "61 layers, MoE layers 3-60"
    with pytest.raises(TraceFormatError, match="first_moe_layer=61 must be below num_layers=61"):
        ModelLayers.from_first_moe_layer(61, 61)
    with pytest.raises(TraceFormatError, match="moe_layer_ids must be increasing"):
        ModelLayers(4, (2, 1))


def test_bool_counts_are_refused_not_read_as_zeros_and_ones(tmp_path):
    torch.save({"logical_count": torch.ones(3, LAYERS, EXPERTS, dtype=torch.bool)}, tmp_path / "bool.pt")
    with pytest.raises(TraceFormatError, match="logical_count must hold integer counts or ids; found dtype torch.bool"):
        read_sglang_dump(tmp_path / "bool.pt")


def test_slot_ids_below_minus_one_are_refused_not_dropped(tmp_path):
    records, _ = detail_records(physical_map(), passes=2, tokens=2, with_counts=False)
    records[1]["topk_ids_of_layer"][3, 0, 0] = -5
    torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(physical_map())}, tmp_path / "d.pt")
    with pytest.raises(TraceFormatError, match="or -1 for no pick; .* ids -5 to"):
        read_sglang_dump(tmp_path / "d.pt")


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_pickle_with_code_is_refused_in_one_clean_line_without_torch_s_advice(tmp_path):
    torch.save({"logical_count": _Evil()}, tmp_path / "evil.pt")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(tmp_path / "evil.pt")
    message = str(caught.value)
    assert "holds Python objects beyond tensors" in message and "GLOBAL" in message, message
    assert "\n" not in message and "\x1b" not in message and "weights_only" not in message, message


@pytest.mark.parametrize("version", ["2.4.0", "2.5.1+cu121", "2.6.0", "2.9.1"])
def test_a_torch_with_a_published_weights_only_bypass_reads_no_pickle(version):
    with pytest.raises(TraceFormatError, match=f"needs torch >= 2.10: torch {re.escape(version)} has published"):
        check_torch_for_pickles(version)


@pytest.mark.parametrize("version", ["2.10.0", "2.13.0+cpu", "3.0.0"])
def test_a_torch_without_a_known_bypass_reads_pickles(version):
    check_torch_for_pickles(version)
