"""The synthetic token stream: seeded, in the vocabulary, Zipf-distributed, and drifting between domains that rank
all but their shared top ids differently."""

import numpy as np

from traces.token_stream import TokenStreamConfig, generate_tokens_TN


def test_the_stream_is_seeded_and_in_the_vocabulary():
    config = TokenStreamConfig(vocab_size=300, num_steps=5, tokens_per_step=64, seed=4)
    tokens = generate_tokens_TN(config)
    assert tokens.shape == (5, 64) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < 300
    assert (generate_tokens_TN(config) == tokens).all()
    assert not (generate_tokens_TN(config.model_copy(update={"seed": 5})) == tokens).all()


def test_one_domain_draws_ids_at_zipf_frequencies():
    config = TokenStreamConfig(vocab_size=1000, num_steps=200, tokens_per_step=1000, num_domains=1,
                               shared_top=1000, zipf_exponent=1.0)
    frequency_V = np.bincount(generate_tokens_TN(config).reshape(-1), minlength=1000) / 200_000
    expected_V = 1 / np.arange(1, 1001) / (1 / np.arange(1, 1001)).sum()
    assert np.allclose(frequency_V[:5], expected_V[:5], rtol=0.05)


def test_domains_share_their_top_ids_and_rank_the_rest_apart():
    config = TokenStreamConfig(vocab_size=5000, num_steps=300, tokens_per_step=512, num_domains=2, shared_top=10,
                               drift_period_steps=200, drift_strength=4.0)
    tokens = generate_tokens_TN(config)
    assert np.isin(np.arange(10), tokens).all()  # the shared top ids appear throughout
    # The mix drifts: the ids outside the shared top that one period's steps use most differ from another's.
    first, later = (np.bincount(tokens[block].reshape(-1), minlength=5000)[10:] for block in
                    (slice(0, 50), slice(100, 150)))
    assert set(np.argsort(first)[-20:]) != set(np.argsort(later)[-20:])
