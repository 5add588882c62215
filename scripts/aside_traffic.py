"""Does the two-slot rule hold on a generator written before it was chosen? The generator, kept aside until then.

It shares no code and no mechanism with `traces.synthetic`, `traces.request_traffic` or `bench_generalisation`'s
regime generator, so a rule chosen on those is judged here on traffic it could not have been fitted to:

- sessions: every token of a step belongs to a live session (one token a session a step, as in decode) that keeps
  one topic for a heavy-tailed lifetime (lognormal, median `median_life` steps); a finished session is replaced at
  once by one whose topic is drawn from the topics' prevalence then, each topic's prevalence a slow sine of its own
  period (200-2,000 steps) and phase;
- topics: each topic's log-preference per layer and expert is `sigma` * (0.6 shared + 0.8 own) standard normals;
- rank churn: per layer, about once every `churn_steps` steps an expert from the top quarter and a uniform one swap
  their shared log-preference for good (an abrupt, permanent change);
- hot spots: per layer `hot_rate` per 1,000 steps, on an expert drawn in proportion to its shared preference, for a
  Pareto(1.3) number of steps from 5 (at most 400), at a factor uniform in 2-6;
- picks: a topic's tokens make top-8 picks as one multinomial over probabilities capped at 1 / top-k (a token picks
  distinct experts), each expert's count at most that topic's tokens.

Run as a script it prints what one trace of it looks like: the hottest expert's share and how far the popularity moves
between the first and the last 50 steps, per layer, and the batch size.

Usage: python scripts/aside_traffic.py [--steps 300] [--layers 4] [--tokens-per-step 18432] [--sigma 1.2] [--seed 1]
"""

import sys

import numpy as np

from eplb.cli.bench_harness import generator_parser, trace_summary

TOP_K = 8


def aside_trace(steps: int, layers: int, experts: int, tokens: int, sigma: float, seed: int, topics: int = 10,
                median_life: float = 120.0, churn_steps: float = 250.0, hot_rate: float = 3.0) -> np.ndarray:
    """[steps, layers, experts] int64 counts of `tokens` tokens a step, top-8 (see the module docstring)."""
    rng = np.random.default_rng([seed, 104729])
    shared_LE = rng.standard_normal((layers, experts))
    own_KLE = rng.standard_normal((topics, layers, experts))
    period_K = rng.uniform(200, 2000, topics)
    phase_K = rng.uniform(0, 2 * np.pi, topics)

    def prevalence(step: int) -> np.ndarray:
        weight_K = np.exp(np.sin(2 * np.pi * step / period_K + phase_K))
        return weight_K / weight_K.sum()

    topic_N = rng.choice(topics, size=tokens, p=prevalence(0))
    # Sessions already running at step 0 are part-way through their lives.
    left_N = np.ceil(rng.lognormal(np.log(median_life), 1.0, tokens) * rng.random(tokens)).astype(np.int64)
    boost_TLE = np.ones((steps, layers, experts))
    for layer in range(layers):
        weight_E = np.exp(sigma * shared_LE[layer])
        for _ in range(rng.poisson(hot_rate * steps / 1000)):
            expert, start = rng.choice(experts, p=weight_E / weight_E.sum()), rng.integers(steps)
            length = min(400, int(5 * (1 + rng.pareto(1.3))))
            boost_TLE[start:start + length, layer, expert] *= rng.uniform(2, 6)
    churn_TL = rng.random((steps, layers)) < 1 / churn_steps
    counts_TLE = np.zeros((steps, layers, experts), dtype=np.int64)
    for step in range(steps):
        for layer in np.flatnonzero(churn_TL[step]):
            top = np.argsort(shared_LE[layer])[-experts // 4:]
            a, b = rng.choice(top), rng.integers(experts)
            shared_LE[layer, [a, b]] = shared_LE[layer, [b, a]]
        left_N -= 1
        ended = left_N <= 0
        topic_N[ended] = rng.choice(topics, size=int(ended.sum()), p=prevalence(step))
        left_N[ended] = np.ceil(rng.lognormal(np.log(median_life), 1.0, int(ended.sum()))).astype(np.int64)
        tokens_K = np.bincount(topic_N, minlength=topics)
        log_KLE = sigma * (0.6 * shared_LE[None] + 0.8 * own_KLE)
        for topic in np.flatnonzero(tokens_K):
            for layer in range(layers):
                p_E = _capped(np.exp(log_KLE[topic, layer]) * boost_TLE[step, layer])
                picks_E = rng.multinomial(tokens_K[topic] * TOP_K, p_E)
                counts_TLE[step, layer] += np.minimum(picks_E, tokens_K[topic])
    return counts_TLE


def _capped(weight_E: np.ndarray) -> np.ndarray:
    """Pick probabilities proportional to `weight_E`, none above 1 / top-k: the largest are fixed at the cap one at a
    time, in descending order, and the rest renormalised."""
    order = np.argsort(weight_E)[::-1]
    p_E = np.empty_like(weight_E, dtype=np.float64)
    remaining_mass, remaining_weight = 1.0, float(weight_E.sum())
    for rank, expert in enumerate(order):
        share = remaining_mass * weight_E[expert] / remaining_weight
        if share <= 1 / TOP_K:
            rest = order[rank:]
            p_E[rest] = remaining_mass * weight_E[rest] / remaining_weight
            break
        p_E[expert] = 1 / TOP_K
        remaining_mass -= 1 / TOP_K
        remaining_weight -= float(weight_E[expert])
    return p_E / p_E.sum()


def main(argv: list[str] | None = None) -> int:
    args = generator_parser(__doc__).parse_args(argv)
    print("\n".join(trace_summary(aside_trace(args.steps, args.layers, 256, args.tokens_per_step, args.sigma, args.seed),
                                   TOP_K)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
