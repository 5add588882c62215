"""A hash layer's loads follow from its token ids: counted exactly, expected from a token-count table, and drawn as
steps to fit on; bad tables and counts are refused naming the parameter."""

import numpy as np
import pytest

from placement import PlacementInfeasibleError
from placement.hash_routing import expected_load_E, hash_counts_TE, table_steps_TE


def random_table(vocab: int, experts: int, top_k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.random((vocab, experts)).argpartition(top_k, axis=1)[:, :top_k]


def test_hash_counts_equal_a_loop_over_the_tokens_and_skip_padding():
    table = random_table(50, 8, 3)
    tokens = np.random.default_rng(1).integers(-1, 50, (4, 20))
    expected = np.zeros((4, 8), dtype=int)
    for step, row in enumerate(tokens):
        for token in row[row >= 0]:
            expected[step, table[token]] += 1
    assert (hash_counts_TE(table, tokens, 8) == expected).all()


def test_steps_drawn_from_a_table_carry_its_expected_load():
    table = random_table(200, 16, 4)
    counts_V = np.arange(1, 201, dtype=float) ** -1.1  # Zipf
    counts_V[150:] = 0  # ids never seen are never drawn
    steps_TE = table_steps_TE(table, counts_V, 16, tokens_per_step=512, steps=400, seed=3)
    assert (steps_TE.sum(1) == 512 * 4).all()
    expected_E = expected_load_E(table, counts_V, 16) / counts_V.sum() * 512
    assert np.allclose(steps_TE.mean(0), expected_E, rtol=0.05)
    unseen = set(table[150:].reshape(-1)) - set(table[:150].reshape(-1))
    assert all(steps_TE[:, expert].sum() == 0 for expert in unseen)


def test_the_same_seed_draws_the_same_steps():
    table, counts_V = random_table(30, 6, 2), np.ones(30)
    assert (table_steps_TE(table, counts_V, 6, 64, 3, seed=7) == table_steps_TE(table, counts_V, 6, 64, 3, seed=7)).all()


@pytest.mark.parametrize("table, counts, message", [
    (np.zeros((5,), dtype=int), np.ones(5), "tid2eid_VK must be an integer table"),
    (np.full((5, 2), 9), np.ones(5), r"expert ids outside \[0, 8\)"),
    (np.zeros((5, 2), dtype=int), np.ones(4), r"token_counts_V must be \[5\] non-negative counts"),
    (np.zeros((5, 2), dtype=int), np.zeros(5), "not all zero"),
], ids=["not-2d", "expert-out-of-range", "counts-wrong-length", "counts-all-zero"])
def test_bad_tables_and_counts_are_refused_naming_the_parameter(table, counts, message):
    with pytest.raises(PlacementInfeasibleError, match=message):
        table_steps_TE(table, counts, 8, 16, 2)
