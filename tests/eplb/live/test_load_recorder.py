"""The load recorder counts every pick of every step, keeps the last `window` steps in order, writes a dump that
`eplb` reads, and its per-step update compiles as one graph (no host synchronisation)."""

import numpy as np
import pytest
import torch

from eplb.live import LoadRecorder, count_picks_E
from eplb.live.load_recorder import add_to_row_
from traces import load_trace


def random_ids(seed: int, tokens: int = 9, top_k: int = 3, experts: int = 6) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
    ids[0, 0] = -1  # a padded pick
    return ids


def test_count_picks_matches_bincount_and_skips_padding():
    ids = random_ids(0)
    expected = np.bincount(ids[ids >= 0].numpy(), minlength=6)
    assert count_picks_E(ids, 6).tolist() == expected.tolist()
    assert count_picks_E(ids[:0], 6).tolist() == [0] * 6


@pytest.mark.parametrize("steps", [2, 5, 11], ids=["part-of-window", "full-window", "wrapped-twice"])
def test_recorder_keeps_the_last_window_steps_oldest_first(steps):
    recorder = LoadRecorder(window=5, num_layers=2, num_experts=6)
    expected = []
    for step in range(steps):
        rows = []
        for layer in range(2):
            ids = random_ids(step * 2 + layer)
            recorder.record(layer, ids)
            rows.append(np.bincount(ids[ids >= 0].numpy(), minlength=6))
        expected.append(rows)
        recorder.next_step()
    kept = np.array(expected[-5:])
    assert recorder.counts_TLE().numpy().tolist() == kept.tolist()
    assert recorder.window_load_LE().numpy().tolist() == kept.sum(0).tolist()
    assert recorder.counts_TLE(last=3).numpy().tolist() == kept[-3:].tolist()  # a burst patch's recent steps


def test_sglang_dump_reads_back_through_load_trace(tmp_path):
    recorder = LoadRecorder(window=4, num_layers=2, num_experts=6)
    for step in range(3):
        for layer in range(2):
            recorder.record(layer, random_ids(step + 10 * layer))
        recorder.next_step()
    recorder.save_sglang_dump(tmp_path / "dump.pt")
    assert load_trace(tmp_path / "dump.pt").counts_TLE.tolist() == recorder.counts_TLE().tolist()


@pytest.mark.parametrize(("args", "message"), [((0, 2, 6), "window"), ((4, 2, 6.5), "num_experts"),
                                               ((4, 2, 6, "cpu", "node"), "scope")],
                         ids=["zero-window", "fractional-experts", "unknown-scope"])
def test_bad_shapes_are_refused_naming_the_parameter(args, message):
    with pytest.raises(ValueError, match=message):
        LoadRecorder(*args)


def test_the_per_step_update_compiles_as_one_graph():
    def update(buffer_TE, row, topk_ids_NK):
        add_to_row_(buffer_TE, row, count_picks_E(topk_ids_NK, buffer_TE.shape[1]))
        return buffer_TE

    compiled = torch.compile(update, fullgraph=True, dynamic=False)
    buffer, eager = torch.zeros(4, 6, dtype=torch.int64), torch.zeros(4, 6, dtype=torch.int64)
    for step in range(3):
        row = torch.tensor(step % 4)
        compiled(buffer, row, random_ids(step))
        update(eager, row, random_ids(step))
    assert torch.equal(buffer, eager)
