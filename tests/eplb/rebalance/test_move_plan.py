"""Planning weight moves: host copies cover every expert one rank alone holds, fills copy locally when they can
and spread the sends, the rounds keep every rank within the byte budget while moving every row once (and are the
plain first fit's), a rebalance's plan covers every changed slot (the layers asked for first in the first rounds),
and a plan survives its int64 encoding whole or as one rank's part."""

import itertools

import numpy as np
import pytest

from eplb.rebalance.move_plan import (Chunk, Fill, TransferShape, _walked_copies, backup_wanted, decode_fills,
                                 decode_for_rank, decode_rounds, encode_fills, encode_rounds, plan_fills,
                                 plan_rebalance, schedule_chunks)
from eplb.rebalance.attempt import last_rounds
from placement import ClusterSpec, fit_placement, plan_migration


def test_with_one_failure_tolerated_a_lone_expert_is_copied_to_its_ranks_successor():
    experts_GS = np.array([[0, 1], [2, 0], [3, 4]])
    assert backup_wanted(experts_GS, 1) == [(0, 3), (0, 4), (1, 1), (2, 2)]
    assert backup_wanted(np.array([[0, 1]]), 1) == []


@pytest.mark.parametrize("num_gpus,slots,tolerated", [(4, 6, 1), (4, 6, 2), (8, 5, 2), (16, 3, 3), (3, 8, 5)],
                         ids=["4x6-f1", "4x6-f2", "8x5-f2", "16x3-f3", "3x8-f5-capped"])
def test_any_tolerated_set_of_dead_ranks_leaves_a_copy_of_every_expert(num_gpus, slots, tolerated):
    rng = np.random.default_rng(num_gpus * slots + tolerated)
    num_experts = 16
    for _ in range(5):
        flat = np.concatenate([rng.permutation(num_experts), rng.integers(0, num_experts, num_gpus * slots - 16)])
        experts_GS = rng.permutation(flat).reshape(num_gpus, slots)
        wanted = backup_wanted(experts_GS, tolerated)
        held = [set(row.tolist()) for row in experts_GS]
        for gpu, expert in wanted:
            assert expert not in held[gpu]  # a host copy only of an expert its rank serves nowhere
            held[gpu].add(expert)
        assert len(wanted) == len(set(wanted))
        for dead in itertools.combinations(range(num_gpus), min(tolerated, num_gpus - 1)):
            alive = set().union(*(held[g] for g in range(num_gpus) if g not in dead))
            assert alive == set(range(num_experts)), f"ranks {dead} dead"
        per_rank = np.bincount([gpu for gpu, _ in wanted], minlength=num_gpus)
        assert per_rank.max() <= -(-len(wanted) // num_gpus) + 1  # no rank's host memory far above the mean


def test_a_placement_one_slot_away_wants_nearly_the_same_host_copies():
    # A burst patch moves a slot or two per layer; the host copies must not be re-planned wholesale with it.
    rng = np.random.default_rng(4)
    num_gpus, slots, num_experts = 16, 5, 64
    new_copies, copies = [], []
    for _ in range(40):
        flat = np.concatenate([rng.permutation(num_experts), rng.integers(0, num_experts, num_gpus * slots - 64)])
        old_GS = rng.permutation(flat).reshape(num_gpus, slots)
        new_GS = old_GS.copy()
        spare = [(g, s) for g, s in np.argwhere(old_GS >= 0) if (old_GS == old_GS[g, s]).sum() >= 2]
        gpu, slot = spare[rng.integers(len(spare))]
        new_GS[gpu, slot] = rng.integers(num_experts)  # a spare replica's slot given to another expert
        old, new = set(backup_wanted(old_GS, 2)), set(backup_wanted(new_GS, 2))
        new_copies.append(len(new - old))
        copies.append(len(new))
    assert np.mean(new_copies) <= 3 and np.mean(copies) >= 60


@pytest.mark.parametrize("num_gpus,slots,num_experts,tolerated",
                         [(8, 3, 16, 1), (8, 3, 16, 3), (16, 2, 24, 2), (5, 4, 12, 4), (32, 3, 64, 2)])
def test_host_copies_placed_all_at_once_are_the_ones_the_walk_in_order_places(num_gpus, slots, num_experts,
                                                                              tolerated):
    # The vectorised placement must give exactly the expert-by-expert walk, including where ranks fill to the cap
    # (few slots, many lone experts) and the walk is taken instead.
    rng = np.random.default_rng(num_gpus * 100 + tolerated)
    for _ in range(60):
        flat = np.concatenate([rng.permutation(num_experts),
                               rng.integers(0, num_experts, num_gpus * slots - num_experts)])
        experts_GS = rng.permutation(flat).reshape(num_gpus, slots)
        holds_EG = np.zeros((num_experts, num_gpus), dtype=bool)
        holds_EG[experts_GS, np.arange(num_gpus)[:, None]] = True
        holders_E = holds_EG.sum(1)
        need_E = np.maximum(tolerated + 1 - holders_E, 0)
        cap = -(-int(need_E.sum()) // num_gpus) + 1
        walked = _walked_copies(holds_EG, need_E, holds_EG.argmax(1), cap)
        assert backup_wanted(experts_GS, tolerated) == walked


def test_two_failures_tolerated_cover_an_expert_whose_replicas_are_on_two_non_neighbours():
    experts_GS = np.array([[0, 1], [2, 3], [0, 4], [5, 6]])  # expert 0 on ranks 0 and 2
    assert all(expert != 0 for _, expert in backup_wanted(experts_GS, 1))  # two copies: one rank may die
    copies_of_0 = [gpu for gpu, expert in backup_wanted(experts_GS, 2) if expert == 0]
    assert len(copies_of_0) == 1 and copies_of_0[0] in (1, 3)  # ranks 0 and 2 may now die at once


def test_fills_copy_locally_first_then_from_the_least_busy_holder():
    holders = {0: {5: ("slot", 1)}, 1: {5: ("slot", 0), 6: ("backup", 6)}, 2: {5: ("slot", 2)}}
    wanted = [(0, "slot", 0, 5), (3, "slot", 0, 5), (3, "slot", 1, 5), (3, "backup", 6, 6)]
    fills = plan_fills(7, wanted, holders)
    assert fills[0] == Fill(7, 5, 0, "slot", 0, 0, "slot", 1)  # local
    assert [f.src_rank for f in fills[1:3]] == [0, 1]  # spread over holders
    assert fills[3] == Fill(7, 6, 3, "backup", 6, 1, "backup", 6)
    with pytest.raises(LookupError, match="expert 9 of layer 7"):
        plan_fills(7, [(0, "slot", 0, 9)], holders)


@pytest.mark.parametrize("budget", [64, 100, 1000, 10**6])
def test_rounds_keep_every_rank_within_the_budget_and_move_every_row_once(budget):
    hidden, inner, size = 4, 6, 4
    fills = [Fill(0, e, dst, "slot", e, src, "slot", e) for e, (src, dst) in enumerate([(0, 1), (0, 2), (1, 1),
                                                                                        (2, 0), (1, 0)])]
    rounds = schedule_chunks(fills, hidden, inner, size, budget)
    covered = {}
    for chunks in rounds:
        sent, received = {}, {}
        for chunk in chunks:
            fill = fills[chunk.fill]
            for row in range(chunk.row_start, chunk.row_end):
                key = (chunk.fill, chunk.matrix, row)
                assert key not in covered
                covered[key] = True
            if not fill.is_local:
                sent[fill.src_rank] = sent.get(fill.src_rank, 0) + chunk.nbytes
                received[fill.dst_rank] = received.get(fill.dst_rank, 0) + chunk.nbytes
        assert max(sent.values(), default=0) <= budget and max(received.values(), default=0) <= budget
    rows = {0: hidden, 1: hidden, 2: inner}
    assert len(covered) == len(fills) * sum(rows.values())
    assert all(not fills[c.fill].is_local for chunks in rounds[1:] for c in chunks)  # local copies come first


def plain_first_fit(fills, hidden, inner, size, budget):
    """The schedule without the skip pointers: each matrix's rows, in order, to the first round from round 0
    with room for a row at both ends, as many as fit there, then on."""
    row_bytes, rows = {0: inner * size, 1: inner * size, 2: hidden * size}, {0: hidden, 1: hidden, 2: inner}
    rounds = [[Chunk(i, m, 0, rows[m], 0) for i, f in enumerate(fills) if f.is_local for m in range(3)]]
    sent, received = [{}], [{}]
    for index, fill in enumerate(fills):
        if fill.is_local:
            continue
        for matrix in range(3):
            start = 0
            while start < rows[matrix]:
                free = [budget - max(sent[r].get(fill.src_rank, 0), received[r].get(fill.dst_rank, 0))
                        for r in range(len(rounds))]
                slot = next((r for r in range(len(rounds)) if free[r] >= row_bytes[matrix]), None)
                if slot is None:
                    rounds.append([]), sent.append({}), received.append({})
                    slot, free = len(rounds) - 1, free + [budget]
                end = min(rows[matrix], start + free[slot] // row_bytes[matrix])
                nbytes = (end - start) * row_bytes[matrix]
                rounds[slot].append(Chunk(index, matrix, start, end, nbytes))
                sent[slot][fill.src_rank] = sent[slot].get(fill.src_rank, 0) + nbytes
                received[slot][fill.dst_rank] = received[slot].get(fill.dst_rank, 0) + nbytes
                start = end
    return [chunks for chunks in rounds if chunks] or [[]]


@pytest.mark.parametrize("seed", range(4))
def test_the_rounds_are_the_plain_first_fits(seed):
    rng = np.random.default_rng(seed)
    fills = [Fill(0, e, int(dst), "slot", e, int(src), "slot", e) for e, (src, dst) in
             enumerate(rng.integers(0, 5, size=(40, 2)))]
    for budget in (96, 200, 1000):
        assert schedule_chunks(fills, 4, 6, 4, budget) == plain_first_fit(fills, 4, 6, 4, budget)


def test_a_round_is_filled_to_its_last_row_so_the_rounds_are_the_bytes_over_the_budget():
    # Six of DeepSeek-V3's experts (FP8, 44 MB each) into one rank from six: 264 MB at 64 MiB a round is 4 rounds;
    # whole matrices (four to a round, 14.7 MB each) would take 5.
    hidden, inner, budget = 7168, 2048, 64 << 20
    fills = [Fill(0, e, 6, "slot", e, e, "slot", e) for e in range(6)]
    rounds = schedule_chunks(fills, hidden, inner, 1, budget)
    assert len(rounds) == -(-6 * 3 * hidden * inner // budget) == 4
    assert all(sum(c.nbytes for c in chunks) > budget - hidden for chunks in rounds[:-1])


@pytest.fixture(scope="module")
def two_placements():
    rng = np.random.default_rng(3)
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=5, gpus_per_node=4)
    counts = rng.poisson(np.linspace(60, 2, 16), size=(10, 3, 16))
    current = fit_placement("deepseek", counts, cluster)
    target = plan_migration(current, fit_placement("deepseek", counts[..., rng.permutation(16)], cluster)).realised
    return current, target


def test_a_rebalance_plan_fills_every_changed_slot_and_new_host_copy(two_placements):
    current, target = two_placements
    shape = TransferShape(hidden_size=4, intermediate_size=6, element_size=4, max_bytes_per_round=64,
                          failures_tolerated=1)
    fills, rounds = plan_rebalance(current, target, shape)
    grid = (4, 5)
    for layer in range(current.num_layers):
        old, new = current.phy2log_LP[layer].reshape(grid), target.phy2log_LP[layer].reshape(grid)
        slots = {(f.dst_rank, f.dst_index) for f in fills if f.layer == layer and f.dst_kind == "slot"}
        assert slots == {(int(g), int(s)) for g, s in np.argwhere(old != new)}
        for f in fills:
            if f.layer == layer and f.dst_kind == "slot":
                assert new[f.dst_rank, f.dst_index] == f.expert
        copies = {(f.dst_rank, f.expert) for f in fills if f.layer == layer and f.dst_kind == "backup"}
        assert copies == set(backup_wanted(new, 1)) - set(backup_wanted(old, 1))
    assert rounds == schedule_chunks(fills, 4, 6, 4, 64)


def test_a_plan_survives_its_encoding_whole_and_as_one_ranks_part(two_placements):
    current, target = two_placements
    fills, rounds = plan_rebalance(current, target, TransferShape(4, 6, 4, 64, failures_tolerated=1))
    fills_U8, chunks_C6 = encode_fills(fills), encode_rounds(rounds)
    assert fills_U8.dtype == chunks_C6.dtype == np.int64
    assert decode_fills(fills_U8) == fills and decode_rounds(chunks_C6) == rounds
    for rank in range(4):
        mine, my_rounds = decode_for_rank(fills_U8, chunks_C6, rank)
        assert mine == {i: f for i, f in enumerate(fills) if rank in (f.src_rank, f.dst_rank)}
        assert len(my_rounds) == len(rounds)  # every rank steps through every round
        assert my_rounds == [[c for c in chunks if c.fill in mine] for chunks in rounds]
    assert decode_rounds(encode_rounds([[]])) == [[]]


def test_the_layers_planned_first_take_the_first_rounds_and_each_layer_s_last_round_is_known(two_placements):
    current, target = two_placements
    shape = TransferShape(4, 6, 4, 64, failures_tolerated=1)
    fills, rounds = plan_rebalance(current, target, shape, first_layers=[2])
    assert [f.layer for f in fills] == sorted((f.layer for f in fills), key=lambda layer: (layer != 2, layer))
    ends = lambda plan: sorted((f.layer, f.expert, f.dst_rank, f.dst_kind, f.dst_index) for f in plan)
    assert ends(fills) == ends(plan_rebalance(current, target, shape)[0])  # the same fills (sources may differ)
    last = last_rounds(encode_fills(fills), encode_rounds(rounds))
    expected = {}
    for index, chunks in enumerate(rounds):
        for chunk in chunks:
            expected[fills[chunk.fill].layer] = index
    assert last == expected and set(last) == {f.layer for f in fills}
    assert last[2] <= min(last[0], last[1])  # planned first, it lands no later than the others
    assert last_rounds(np.zeros((0, 8), dtype=np.int64), np.zeros((0, 6), dtype=np.int64)) == {}


def test_a_budget_below_one_row_is_refused():
    with pytest.raises(ValueError, match="below one row"):
        schedule_chunks([Fill(0, 0, 1, "slot", 0, 0, "slot", 0)], 4, 6, 4, 10)


def test_rebalance_config_names_a_wrong_field_and_checks_the_heartbeat():
    from pydantic import ValidationError

    from eplb.rebalance.config import RebalanceConfig

    with pytest.raises(ValidationError, match="intervall"):
        RebalanceConfig(intervall=5)
    with pytest.raises(ValidationError, match="heartbeat_timeout_s"):
        RebalanceConfig(heartbeat_interval_s=1.0, heartbeat_timeout_s=2.0)
    assert RebalanceConfig.model_validate_json('{"interval": 50, "policy": "deepseek"}').interval == 50
    with pytest.raises(ValidationError, match="solve_in='process'"):
        RebalanceConfig(solve_cpu_share=0.5, solve_in="thread")
    with pytest.raises(ValidationError, match="solve_cpu_share"):
        RebalanceConfig(solve_cpu_share=0.0)
