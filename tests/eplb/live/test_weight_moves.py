"""Planning weight moves: host copies cover every expert one rank alone holds, fills copy locally when they can
and spread the sends, and the rounds keep every rank within the byte budget while moving every row once."""

import numpy as np
import pytest

from eplb.live.weight_moves import Fill, backup_wanted, plan_fills, schedule_chunks


def test_each_rank_keeps_the_experts_only_its_predecessor_holds():
    experts_GS = np.array([[0, 1], [2, 0], [3, 4]])
    assert backup_wanted(experts_GS) == [(0, 3), (0, 4), (1, 1), (2, 2)]
    assert backup_wanted(np.array([[0, 1]])) == []


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


def test_a_budget_below_one_row_is_refused():
    with pytest.raises(ValueError, match="below one row"):
        schedule_chunks([Fill(0, 0, 1, "slot", 0, 0, "slot", 0)], 4, 6, 4, 10)


def test_rebalance_config_names_a_wrong_field_and_checks_the_heartbeat():
    from pydantic import ValidationError

    from eplb.live.rebalance_config import RebalanceConfig

    with pytest.raises(ValidationError, match="intervall"):
        RebalanceConfig(intervall=5)
    with pytest.raises(ValidationError, match="heartbeat_timeout_s"):
        RebalanceConfig(heartbeat_interval_s=1.0, heartbeat_timeout_s=2.0)
    assert RebalanceConfig.model_validate_json('{"interval": 50, "policy": "deepseek"}').interval == 50
