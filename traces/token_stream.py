"""A seeded synthetic token stream: Zipf-distributed token ids from drifting domains, the input of hash-routed layers.

Legend: V vocabulary, T steps, N tokens per step, Z domains.

Natural-language token frequencies follow Zipf's law (rank ** -s, s near 1). Each domain (code, chat, math...)
ranks the vocabulary its own way, except for the `shared_top` most frequent ids (punctuation, function words),
which every domain ranks alike; the rest of a domain's ranking is a random permutation. Domain z's share of step
t's tokens is a softmax over domains of `drift_strength * sin(2 pi t / period_z + phase_z)`
(`traces.synthetic.domain_mix_TZ`), so the stream drifts the way the synthetic routing traces do; each step splits
its N tokens over the domains by a multinomial over that mix, and each domain's tokens are drawn from its own Zipf
ranking.
"""

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from traces.synthetic import domain_mix_TZ


class TokenStreamConfig(BaseModel):
    """Shape, seed and character of a synthetic token stream."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(129280, ge=2, description="V: token ids are in [0, V) (DeepSeek-V4's vocabulary).")
    num_steps: int = Field(600, ge=1, description="T: steps to generate.")
    tokens_per_step: int = Field(8192, ge=1, description="N: tokens in one step of the EP group.")
    zipf_exponent: float = Field(1.07, ge=0, description="s of rank ** -s, the frequency of a domain's rank-th token.")
    num_domains: int = Field(4, ge=1, description="Z: traffic domains, each with its own ranking of the vocabulary.")
    shared_top: int = Field(1000, ge=0, description="The most frequent ids, ranked alike by every domain.")
    drift_period_steps: float = Field(1000.0, gt=0, description="Typical period of a domain's share, in steps.")
    drift_strength: float = Field(1.0, ge=0, description="Amplitude of the domain-mix logits; 0: a constant mix.")
    seed: int = Field(0, ge=0, description="Seed of numpy.random.default_rng; same seed, same stream.")


def generate_tokens_TN(config: TokenStreamConfig) -> np.ndarray:
    """[T, N] int64 token ids of the stream `config` describes."""
    c = config
    ranking_rng, mix_rng, sample_rng = np.random.default_rng(c.seed).spawn(3)
    shared = min(c.shared_top, c.vocab_size)
    rankings_ZV = np.stack([np.concatenate([np.arange(shared), shared + ranking_rng.permutation(c.vocab_size - shared)])
                            for _ in range(c.num_domains)])
    weights_V = np.arange(1, c.vocab_size + 1, dtype=float) ** -c.zipf_exponent
    cumulative_V = np.cumsum(weights_V / weights_V.sum())
    tokens_TZ = sample_rng.multinomial(c.tokens_per_step, domain_mix_TZ(c, mix_rng))
    tokens_TN = np.empty((c.num_steps, c.tokens_per_step), dtype=np.int64)
    for step in range(c.num_steps):
        ranks = np.searchsorted(cumulative_V, sample_rng.random(c.tokens_per_step), side="right").clip(
            max=c.vocab_size - 1)
        domain_N = np.repeat(np.arange(c.num_domains), tokens_TZ[step])
        tokens_TN[step] = rankings_ZV[domain_N, ranks]
    return tokens_TN
