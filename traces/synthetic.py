"""Seeded synthetic MoE decode routing traffic: skewed, domain-mixed, drifting and bursty expert loads.

Legend: T steps, L MoE layers, E logical experts, K top-k, N tokens per step, Z traffic domains, R rows (flattened
step x layer pairs). Bursts are arrays of one entry per burst, named `burst_...`.

The model, in the order `generate_trace` builds it:

1. Popularity. Each expert of each layer has a standard-normal base score; domain z's score is
   `overlap * base + sqrt(1 - overlap**2) * own_z`, so `domain_overlap` is the correlation between domains.
   A score becomes a weight by `exp(skew * score)` (lognormal) or `rank ** -zipf_exponent` (Zipf, rank 1 =
   highest score). Scores are random per layer, so which expert is hot is a random permutation per layer.
2. Drift. Domain z's share of the traffic at step t is a softmax over domains of
   `drift_strength * sin(2 pi t / period_z + phase_z)`, with period_z drawn in [0.5, 1.5] x `drift_period_steps`.
3. Bursts. Each layer gets Poisson(`burst_rate` * T / 1000) bursts; a burst picks one expert uniformly and
   multiplies its weight by `burst_factor` for about `burst_length_steps` steps (exponentially distributed).
4. Sampling. Each step splits its N tokens over domains by a multinomial over the mix; the pick probability
   p_e of expert e in a (step, layer) is the token-weighted mean of the domains' popularities, times any burst
   boost, normalised; the N * K picks are drawn from a multinomial over p.

Example: the default shape, 61 layers x 256 experts x 2000 steps x 8192 tokens x top-8, gives counts_TLE of
shape [2000, 61, 256] whose rows each sum to 8192 * 8 = 65536.
"""

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.routing_trace import MAX_READ_VALUES, RoutingTrace

# Float64 values of one [steps, L, E] chunk while sampling: 2**21 values = 16 MiB per temporary array.
_CHUNK_VALUES = 1 << 21
# Largest trace generated at once: what a reader takes back (2**28 int64 counts, 2 GiB; the default shape is 31 M).
MAX_TRACE_VALUES = MAX_READ_VALUES


class SyntheticConfig(BaseModel):
    """Shape, seed and traffic character of a synthetic routing trace."""

    model_config = ConfigDict(extra="forbid")

    num_steps: int = Field(2000, ge=1, description="T: decode steps to generate.")
    num_layers: int = Field(61, ge=1, description="L: MoE layers.")
    num_experts: int = Field(256, ge=1, description="E: logical experts per layer.")
    top_k: int = Field(8, ge=1, description="K: distinct experts each token picks; at most num_experts.")
    tokens_per_step: int = Field(8192, ge=1, description="N: tokens in one decode step of the EP group.")
    seed: int = Field(0, ge=0, description="Seed of numpy.random.default_rng; same seed, same trace.")
    sample_seed: int | None = Field(
        None, ge=0, description="Seed of the sampling stream alone (None: drawn from seed). Two traces with the same "
        "seed and different sample_seed share every popularity, domain mix and burst and differ only in sampling "
        "noise: a twin whose fit knows the popularity a trace is drawn from (a forecast oracle)."
    )
    popularity: Literal["lognormal", "zipf"] = Field(
        "lognormal", description="Shape of expert popularity: lognormal weights or Zipf over a random ranking."
    )
    skew: float = Field(
        0.8, ge=0, description="Sigma of the lognormal popularity (0.8: busiest expert ~4-6x the mean); 0 = uniform."
    )
    zipf_exponent: float = Field(1.0, ge=0, description="Exponent s of Zipf popularity rank**-s; 0 = uniform.")
    num_domains: int = Field(
        4, ge=1, description="Z: traffic domains (e.g. code, chat, math), each with its own popularity."
    )
    domain_overlap: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Correlation of each domain's popularity scores with the shared base; 1 = identical domains.",
    )
    drift_period_steps: float = Field(
        1000.0, gt=0, description="Typical period, in steps, of each domain's sinusoidal share of the traffic."
    )
    drift_strength: float = Field(
        1.0, ge=0, description="Amplitude of the domain-mix logits; 0 = a constant, equal mix (no drift)."
    )
    burst_rate: float = Field(2.0, ge=0, description="Expected bursts per layer per 1000 steps; 0 = no bursts.")
    burst_length_steps: float = Field(50.0, ge=1, description="Mean length of a burst in steps.")
    burst_factor: float = Field(4.0, ge=1, description="Factor on a bursting expert's popularity weight.")

    def _largest_factor(self) -> str:
        """The size (num_steps, num_layers or num_experts) that most exceeds a plain trace's."""
        sizes = {"num_steps": self.num_steps / 1000, "num_layers": self.num_layers / 61,
                 "num_experts": self.num_experts / 256}
        return max(sizes, key=sizes.get)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "SyntheticConfig":
        values = self.num_steps * self.num_layers * self.num_experts
        if values > MAX_TRACE_VALUES:
            raise ValueError(
                f"num_steps x num_layers x num_experts = {values:,} counts exceeds the limit of {MAX_TRACE_VALUES:,} "
                f"({MAX_TRACE_VALUES * 8 // 2**30} GiB as int64); lower {self._largest_factor()}"
            )
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}: a token picks top_k distinct experts; "
                f"lower top_k or raise num_experts"
            )
        return self


def generate_trace(config: SyntheticConfig) -> RoutingTrace:
    """Generate a synthetic routing trace (see the module docstring for the model).

    Returns a trace whose counts_TLE is [T, L, E] int64, tokens per logical expert per step and layer; every
    (step, layer) row sums to exactly N * K and no entry exceeds N. The same config gives the same trace.

    Top-k approximation: a token picks K *distinct* experts, so it picks expert e with probability K * p_e,
    which cannot exceed 1. Pick probabilities are therefore capped at 1/K and the excess is handed to the
    uncapped experts in proportion, repeating until none exceeds the cap; a capped ("saturated") expert gets
    exactly N tokens. The remaining picks are drawn with replacement from one multinomial: right in expectation,
    a little too noisy for experts with large K * p_e, and now and then above N, in which case the overflow is
    clipped and dealt, without replacement, to the free capacity N - count of the other experts of that row.
    """
    c = config
    T, L, E, K, N = c.num_steps, c.num_layers, c.num_experts, c.top_k, c.tokens_per_step
    # Separate streams, so that e.g. changing num_steps does not reshuffle which experts are popular.
    popularity_rng, mix_rng, burst_rng, sample_rng = _streams(c)
    if c.sample_seed is not None:
        sample_rng = np.random.default_rng([c.sample_seed, c.seed])
    p_ZLE = _domain_popularity_ZLE(c, popularity_rng)
    mix_TZ = domain_mix_TZ(c, mix_rng)
    bursts = _draw_bursts(c, burst_rng)
    # Step 1: split each step's tokens over domains.
    tokens_TZ = sample_rng.multinomial(N, mix_TZ)
    counts_TLE = np.empty((T, L, E), dtype=np.int64)
    chunk = max(1, _CHUNK_VALUES // (L * E))
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        # Step 2: pick weights of this chunk's steps, the token-weighted mix of domain popularities.
        w_TLE = ((tokens_TZ[t0:t1] / N) @ p_ZLE.reshape(c.num_domains, L * E)).reshape(t1 - t0, L, E)
        _apply_bursts(w_TLE, bursts, t0, c.burst_factor)
        # Step 3: sample N * K picks per (step, layer).
        counts_TLE[t0:t1] = _sample_counts_RE(w_TLE.reshape(-1, E), N, K, sample_rng).reshape(t1 - t0, L, E)
    source = f"traces.synthetic.generate_trace seed={c.seed} config={c.model_dump_json()}"
    return RoutingTrace.from_counts(counts_TLE, top_k=K, tokens_per_step=N, source=source)


def expected_counts_TLE(config: SyntheticConfig) -> np.ndarray:
    """[T, L, E] float64: the expected counts of `generate_trace(config)`, step by step: the domain mix's expected
    share (not the step's sampled split of tokens over domains), the bursts, the cap at 1 / K; the same draws as the
    trace, none of its sampling. What the yardsticks' expectation oracle fits on (`placement.yardsticks`)."""
    c = config
    popularity_rng, mix_rng, burst_rng, _ = _streams(c)
    p_ZLE = _domain_popularity_ZLE(c, popularity_rng)
    mix_TZ = domain_mix_TZ(c, mix_rng)
    bursts = _draw_bursts(c, burst_rng)
    expected_TLE = np.empty((c.num_steps, c.num_layers, c.num_experts))
    chunk = max(1, _CHUNK_VALUES // (c.num_layers * c.num_experts))
    for t0 in range(0, c.num_steps, chunk):
        t1 = min(c.num_steps, t0 + chunk)
        w_TLE = (mix_TZ[t0:t1] @ p_ZLE.reshape(c.num_domains, -1)).reshape(t1 - t0, c.num_layers, c.num_experts)
        _apply_bursts(w_TLE, bursts, t0, c.burst_factor)
        expected_TLE[t0:t1] = expected_counts_RE(w_TLE.reshape(-1, c.num_experts), c.tokens_per_step,
                                                 c.top_k).reshape(w_TLE.shape)
    return expected_TLE


def active_bursts_TL(config: SyntheticConfig) -> np.ndarray:
    """[T, L] int64: how many bursts are active at each step and layer of `generate_trace(config)` (the same draws,
    so a benchmark can tell the steps a burst touched from the calm ones)."""
    burst_start, burst_stop, burst_layer, _ = _draw_bursts(config, _streams(config)[2])
    active_TL = np.zeros((config.num_steps + 1, config.num_layers), dtype=np.int64)
    np.add.at(active_TL, (burst_start, burst_layer), 1)
    np.add.at(active_TL, (np.minimum(burst_stop, config.num_steps), burst_layer), -1)
    return np.cumsum(active_TL, axis=0)[:-1]


def _streams(c: SyntheticConfig) -> list[np.random.Generator]:
    """The trace's random streams, in this order: popularity, domain mix, bursts, sampling (before `sample_seed`)."""
    return np.random.default_rng(c.seed).spawn(4)


def _domain_popularity_ZLE(c: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """[Z, L, E] float64: each domain's pick probability per expert and layer; sums to 1 over E."""
    base_LE = rng.standard_normal((c.num_layers, c.num_experts))
    own_ZLE = rng.standard_normal((c.num_domains, c.num_layers, c.num_experts))
    score_ZLE = c.domain_overlap * base_LE + math.sqrt(1.0 - c.domain_overlap**2) * own_ZLE
    if c.popularity == "lognormal":
        scaled_ZLE = c.skew * score_ZLE
        with np.errstate(over="ignore"):
            w_ZLE = np.exp(scaled_ZLE)
        if not np.isfinite(w_ZLE).all():  # a skew so large that exp overflows: shifted by each row's largest
            w_ZLE = np.exp(scaled_ZLE - scaled_ZLE.max(axis=-1, keepdims=True))
    else:
        rank_ZLE = np.argsort(np.argsort(-score_ZLE, axis=-1), axis=-1) + 1  # 1 = highest score
        w_ZLE = rank_ZLE.astype(np.float64) ** -c.zipf_exponent
    return w_ZLE / w_ZLE.sum(axis=-1, keepdims=True)


def domain_mix_TZ(c: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """[T, Z] float64: each domain's share of the traffic per step; sums to 1 over Z and varies smoothly in t.

    `c` needs `num_steps`, `num_domains`, `drift_period_steps` and `drift_strength` (a `SyntheticConfig`, or the
    token stream's `TokenStreamConfig`, which drifts the same way)."""
    period_Z = c.drift_period_steps * rng.uniform(0.5, 1.5, size=c.num_domains)
    phase_Z = rng.uniform(0.0, 2 * math.pi, size=c.num_domains)
    t_T = np.arange(c.num_steps, dtype=np.float64)
    logit_TZ = c.drift_strength * np.sin(2 * math.pi * t_T[:, None] / period_Z + phase_Z)
    mix_TZ = np.exp(logit_TZ - logit_TZ.max(axis=-1, keepdims=True))
    return mix_TZ / mix_TZ.sum(axis=-1, keepdims=True)


def _draw_bursts(c: SyntheticConfig, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Bursts as (burst_start, burst_stop, burst_layer, burst_expert), int64 arrays of one entry per burst:
    burst_expert[b] of burst_layer[b] is hot in steps [burst_start[b], burst_stop[b])."""
    per_layer_L = rng.poisson(c.burst_rate * c.num_steps / 1000.0, size=c.num_layers)
    burst_layer = np.repeat(np.arange(c.num_layers), per_layer_L)
    burst_start = rng.integers(0, c.num_steps, size=burst_layer.size)
    burst_length = np.maximum(1, np.rint(rng.exponential(c.burst_length_steps, size=burst_layer.size))).astype(np.int64)
    burst_expert = rng.integers(0, c.num_experts, size=burst_layer.size)
    return burst_start, burst_start + burst_length, burst_layer, burst_expert


def _apply_bursts(w_TLE: np.ndarray, bursts: tuple[np.ndarray, ...], t0: int, factor: float) -> None:
    """Multiply, in place, the weights w_TLE [T, L, E] of bursting experts in the chunk of steps [t0, t0 + T) by
    `factor`."""
    burst_start, burst_stop, burst_layer, burst_expert = bursts
    num_t = w_TLE.shape[0]
    # Per burst, its first step in the chunk and its number of steps there.
    burst_lo = np.clip(burst_start - t0, 0, num_t)
    burst_len = np.clip(burst_stop - t0, 0, num_t) - burst_lo
    # One entry per (burst, covered step): the step is burst_lo plus its offset within the burst.
    offset = np.arange(burst_len.sum()) - np.repeat(np.cumsum(burst_len) - burst_len, burst_len)
    t_idx = np.repeat(burst_lo, burst_len) + offset
    np.multiply.at(w_TLE, (t_idx, np.repeat(burst_layer, burst_len), np.repeat(burst_expert, burst_len)), factor)


def _cap_pick_probs_RE(w_RE: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Cap pick probabilities at 1/K, iterating because renormalising can push others over the cap.

    Args:
        w_RE: [R, E] float64, positive pick weights per row.
    Returns:
        p_RE: [R, E] float64, pick probabilities of the unsaturated experts, normalised over them (0 elsewhere).
        saturated_RE: [R, E] bool, experts every token picks (at most K per row).
    """
    saturated_RE = np.zeros(w_RE.shape, dtype=bool)
    while True:
        free_RE = np.where(saturated_RE, 0.0, w_RE)
        total_R1 = free_RE.sum(axis=-1, keepdims=True)
        total_R1[total_R1 == 0] = 1.0  # every expert saturated (K == E): nothing left to pick
        budget_R1 = (top_k - saturated_RE.sum(axis=-1, keepdims=True)) / top_k  # probability mass not capped
        newly_RE = free_RE * (budget_R1 / total_R1) > 1.0 / top_k
        if not newly_RE.any():
            return free_RE / total_R1, saturated_RE
        saturated_RE |= newly_RE


def expected_counts_RE(w_RE: np.ndarray, n_tokens: int, top_k: int) -> np.ndarray:
    """[R, E] float64: the expectation of `_sample_counts_RE` for [R, E] pick weights (N * K picks a row over the
    capped pick probabilities, a saturated expert exactly N; the rare clipping above N left out)."""
    p_RE, saturated_RE = _cap_pick_probs_RE(w_RE, top_k)
    picks_R1 = n_tokens * (top_k - saturated_RE.sum(axis=-1, keepdims=True))
    return picks_R1 * p_RE + n_tokens * saturated_RE


def _sample_counts_RE(w_RE: np.ndarray, n_tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """[R, E] int64 token counts from [R, E] pick weights: rows sum to N * K, no entry exceeds N."""
    p_RE, saturated_RE = _cap_pick_probs_RE(w_RE, top_k)
    picks_R = n_tokens * (top_k - saturated_RE.sum(axis=-1))
    counts_RE = rng.multinomial(picks_R, p_RE) + n_tokens * saturated_RE
    # Rare: a multinomial draw above N. Clip it and deal the excess over the others' free capacity.
    for r in np.flatnonzero((counts_RE > n_tokens).any(axis=-1)):
        excess = int(np.maximum(counts_RE[r] - n_tokens, 0).sum())
        np.minimum(counts_RE[r], n_tokens, out=counts_RE[r])
        counts_RE[r] += rng.multivariate_hypergeometric(n_tokens - counts_RE[r], excess)
    return counts_RE
