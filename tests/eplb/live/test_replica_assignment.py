"""Replica choice inside the group: quotas sum to each expert's tokens, every replica gets exactly its quota from
the ranks' picks, the rows-sent matrix is what the picks do, and the per-step functions compile as one graph."""

import numpy as np
import pytest
import torch

from eplb.live.load_recorder import count_picks_E
from eplb.live.replica_assignment import ReplicaTables, assign_slots_NK, rows_sent_GP, slot_quotas_EX
from placement import ClusterSpec, fit_placement

WORLD, SLOTS, EXPERTS, TOP_K = 4, 3, 10, 3


def placement(policy: str):
    counts = np.random.default_rng(2).poisson(np.geomspace(60, 2, EXPERTS), size=(12, 1, EXPERTS))
    return fit_placement(policy, counts, ClusterSpec(num_gpus=WORLD, slots_per_gpu=SLOTS))


def rank_picks(seed: int, tokens_per_rank=(5, 0, 9, 4)) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    popularity = torch.linspace(3, 0.2, EXPERTS)
    return [torch.multinomial(popularity.expand(n, -1), TOP_K, generator=generator) if n else
            torch.zeros(0, TOP_K, dtype=torch.int64) for n in tokens_per_rank]


@pytest.mark.parametrize("mode", ["static", "dynamic", "oblivious"])
@pytest.mark.parametrize("policy", ["deepseek", "trivial"])
def test_every_replica_gets_exactly_its_quota_and_rows_sent_match_the_picks(mode, policy):
    tables = ReplicaTables.build(placement(policy), 0)
    picks = rank_picks(7)
    counts_GE = torch.stack([count_picks_E(ids, EXPERTS) for ids in picks])
    quota_EX = slot_quotas_EX(counts_GE.sum(0), tables, mode)
    assert torch.equal(quota_EX.sum(1), counts_GE.sum(0))
    assert (quota_EX[~tables.valid_EX] == 0).all() and (quota_EX >= 0).all()
    sent_GP = rows_sent_GP(counts_GE, quota_EX, tables)
    got = torch.zeros(WORLD, WORLD * SLOTS, dtype=torch.int64)
    for rank, ids in enumerate(picks):
        slots = assign_slots_NK(ids, counts_GE, rank, quota_EX, tables)
        assert (torch.as_tensor(placement(policy).phy2log_LP[0])[slots] == ids).all(), "a pick left its expert"
        got[rank] = torch.bincount(slots.reshape(-1), minlength=WORLD * SLOTS)
    assert torch.equal(got, sent_GP)
    quota_P = torch.zeros(WORLD * SLOTS + 1, dtype=torch.int64).scatter_add_(
        0, tables.log2phy_EX.reshape(-1), quota_EX.reshape(-1))[:-1]
    assert torch.equal(got.sum(0), quota_P)


def test_oblivious_splits_equally_and_static_follows_the_weights():
    tables = ReplicaTables.build(placement("deepseek"), 0)
    counts = torch.tensor([100, 7, 0, 3, 1, 1, 1, 1, 1, 1])
    equal = slot_quotas_EX(counts, tables, "oblivious")
    replicas = tables.valid_EX.sum(1)
    assert ((equal.max(1).values - torch.where(tables.valid_EX, equal, equal.max()).min(1).values) <= 1).all()
    static = slot_quotas_EX(counts, tables, "static")
    expected = tables.weights_EX * counts[:, None]
    assert ((static - expected).abs() < 1.0 + 1e-6).all()
    assert replicas[0] > 1


def test_assignment_and_quotas_compile_as_one_graph():
    tables = ReplicaTables.build(placement("deepseek"), 0)

    def per_step(ids_NK, counts_GE):
        quota = slot_quotas_EX(counts_GE.sum(0), tables, "static")
        return assign_slots_NK(ids_NK, counts_GE, 2, quota, tables), rows_sent_GP(counts_GE, quota, tables)

    compiled = torch.compile(per_step, fullgraph=True, dynamic=False)
    picks = rank_picks(3)
    counts_GE = torch.stack([count_picks_E(ids, EXPERTS) for ids in picks])
    for got, want in zip(compiled(picks[2], counts_GE), per_step(picks[2], counts_GE)):
        assert torch.equal(got, want)
