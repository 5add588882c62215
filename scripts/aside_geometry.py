"""Does a two-slot rule hold on a second generator written before the rule was chosen? The generator, kept aside.

Written (2026-12-07) after `scripts/aside_traffic.py` had judged three rules, so a rule chosen since is judged on
traffic it could not have been fitted to. It shares no code and no mechanism with `traces.synthetic`,
`traces.request_traffic`, `bench_generalisation`'s regime generator or `aside_traffic`:

- router geometry: each layer's experts have a bias (`sigma` standard normals: the popularity spread) and an embedding
  (DIMENSIONS standard normals); a topic is a point in the same space, and its pick probabilities are the softmax of
  bias + ALIGNMENT * (topic . embedding) / sqrt(DIMENSIONS), capped at 1 / top-k by water-filling;
- drift of meaning: every topic's point walks (a Gaussian step of `walk` per step in each dimension), so what a topic
  asks of the experts changes while its traffic stays;
- self-exciting arrivals: sessions of a topic arrive as a Hawkes process (base rates a Dirichlet(0.5) split; each
  arrival raises its topic's rate by `excitation` of itself, decaying with a time constant of `decay_steps`): a
  popular prompt or an agent's fan-out brings many sessions of one topic at once;
- geometric lifetimes (mean `mean_life` steps) and a batch that follows the sessions alive: a step serves every live
  session's token up to `tokens`, thinned at random beyond it, so its size moves with the arrivals.

Run as a script it prints what one trace of it looks like: the hottest expert's share, how far the popularity moves
between the first and the last 50 steps, per layer, and the batch size.

Usage: python scripts/aside_geometry.py [--steps 300] [--layers 4] [--tokens-per-step 18432] [--sigma 1.2] [--seed 1]
"""

import sys

import numpy as np

from eplb.cli.bench_harness import generator_parser, trace_summary

TOP_K = 8
DIMENSIONS = 8
ALIGNMENT = 1.5


def geometry_trace(steps: int, layers: int, experts: int, tokens: int, sigma: float, seed: int, topics: int = 32,
                   walk: float = 0.03, excitation: float = 0.6, decay_steps: float = 25.0,
                   mean_life: float = 150.0) -> np.ndarray:
    """[steps, layers, experts] int64 counts of at most `tokens` tokens a step, top-8 (see the module docstring)."""
    rng = np.random.default_rng([seed, 65537])
    bias_LE = sigma * rng.standard_normal((layers, experts))
    embedding_LED = rng.standard_normal((layers, experts, DIMENSIONS))
    point_KD = rng.standard_normal((topics, DIMENSIONS))
    # Base arrivals so that the sessions alive average `tokens` (each arrival brings 1 / (1 - excitation) in all).
    base_K = rng.dirichlet(np.full(topics, 0.5)) * tokens / mean_life * (1 - excitation)
    alive_K = rng.poisson(base_K * mean_life / (1 - excitation))
    excited_K = np.zeros(topics)
    counts_TLE = np.zeros((steps, layers, experts), dtype=np.int64)
    for step in range(steps):
        arrivals_K = rng.poisson(base_K + excited_K)
        excited_K = (excited_K + excitation / decay_steps * arrivals_K) * np.exp(-1 / decay_steps)
        alive_K = alive_K - rng.binomial(alive_K, 1 / mean_life) + arrivals_K
        point_KD += walk * rng.standard_normal(point_KD.shape)
        served_K = _thinned(alive_K, tokens, rng)
        for topic in np.flatnonzero(served_K):
            logits_LE = bias_LE + ALIGNMENT * (embedding_LED @ point_KD[topic]) / np.sqrt(DIMENSIONS)
            for layer in range(layers):
                picks_E = rng.multinomial(served_K[topic] * TOP_K, _water_filled(logits_LE[layer]))
                counts_TLE[step, layer] += np.minimum(picks_E, served_K[topic])
    return counts_TLE


def _thinned(alive_K: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """The sessions a step serves per topic: all of them, or `tokens` of them drawn without replacement."""
    if alive_K.sum() <= tokens:
        return alive_K
    return rng.multivariate_hypergeometric(alive_K, tokens)


def _water_filled(logits_E: np.ndarray) -> np.ndarray:
    """softmax(`logits_E`) with no probability above 1 / top-k: the mass above the cap is poured over the experts
    below it in proportion to their probabilities, until none exceeds it."""
    p_E = np.exp(logits_E - logits_E.max())
    p_E /= p_E.sum()
    cap = 1 / TOP_K
    for _ in range(TOP_K):
        over = p_E > cap
        if not over.any():
            break
        excess = float((p_E[over] - cap).sum())
        p_E[over] = cap
        under = p_E < cap
        p_E[under] += excess * p_E[under] / p_E[under].sum()
    return p_E / p_E.sum()


def main(argv: list[str] | None = None) -> int:
    args = generator_parser(__doc__).parse_args(argv)
    print("\n".join(trace_summary(geometry_trace(args.steps, args.layers, 256, args.tokens_per_step, args.sigma, args.seed),
                                   TOP_K)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
