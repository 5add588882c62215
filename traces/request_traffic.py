"""Request-level routing traffic: batches made of requests that keep their own experts for their whole life.

Legend: T steps (prefill batches or decode steps), L layers, E experts, K top-k, N tokens a step, B live requests.

A request has a prompt length, an output length (from a request trace, `traces.request_trace`, read in order and
cycled, or from lognormal distributions) and, per layer, its own pick probabilities

    q_r ~ Dirichlet(concentration * p(t_r))

around the layer's popularity p at the step t_r it joins, capped at 1 / K as a token picks K distinct experts. Every
token of the request picks from q_r. The popularity is `traces.synthetic`'s (lognormal skew, domains whose mix
drifts), and its bursts multiply a bursting expert's weight in every batch they cover: today's drift and bursts stay
on top of the requests.

- **Prefill** (`mode="prefill"`): requests queue in order; a batch takes whole prompts until it holds N tokens, and
  the prompt that does not fit is chunked, its rest opening the next batch (chunked prefill, as SGLang and vLLM do).
- **Decode** (`mode="decode"`): continuous batching with B = N / tokens_per_request live requests; each adds
  tokens_per_request tokens a step (1, or 1 + accepted drafts) until its output is done, then leaves and a new
  request takes its place. The first batch is the steady state: requests drawn in proportion to their output length,
  each part way through it.

A batch's picks are drawn from one multinomial over the token-weighted sum of its requests' q_r. Given the q_r that
is the exact mean; its variance exceeds the sum of per-request draws by at most the fraction 1 / (concentration + 1)
(the spread of the q_r themselves), a fraction of a percent at the concentration measured on real routing.

The concentration's default and the rule that carries it across expert counts are assumptions, measured and stated
in docs/traffic.md: it is the estimate on the four ESFT tasks pooled (`traces.request_concentration`,
DeepSeek-V2-Lite, 64 experts), and it is kept unchanged at any number of experts. A Dirichlet's marginals aggregate
(the summed share of any group of experts is Dirichlet with the same concentration), so this keeps a request's
preference for any fixed fraction of the expert pool, a GPU's experts say, the same whether the pool is cut into 64
experts or 256.

Output: a `RoutingTrace` with `counts` [T, L, E], every row summing to N * K, so `eplb place`, `eplb replay`, the
simulator and the live demo take it unchanged.
"""

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.request_trace import load_request_trace
from traces.routing_trace import RoutingTrace
from traces.synthetic import (
    SyntheticConfig,
    _apply_bursts,
    _cap_pick_probs_RE,
    _domain_popularity_ZLE,
    _draw_bursts,
    _sample_counts_RE,
    _streams,
    domain_mix_TZ,
    expected_counts_RE,
)

# The pooled estimate on the four ESFT tasks (traces.request_concentration; docs/traffic.md, checked by
# tests/traces/test_request_traffic.py where the data is present).
ESFT_CONCENTRATION = 158.0
# Largest live set a decode trace keeps (requests x layers x experts float32 values: 1 GiB).
MAX_LIVE_VALUES = 1 << 28
# Requests whose preferences one step draws in one go: bounds a temporary [R, L, E] float64 array to about 64 MiB.
_DRAW_VALUES = 1 << 23


class RequestTrafficConfig(BaseModel):
    """Shape, seed and character of request-level routing traffic."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["prefill", "decode"] = Field("decode", description="Prefill batches of whole prompts, or decode "
                                                                      "steps under continuous batching.")
    num_steps: int = Field(200, ge=1, description="T: batches (prefill) or steps (decode).")
    num_layers: int = Field(61, ge=1, description="L: MoE layers.")
    num_experts: int = Field(256, ge=2, description="E: logical experts per layer.")
    top_k: int = Field(8, ge=1, description="K: distinct experts a token picks; below num_experts.")
    tokens_per_step: int = Field(8192, ge=1, description="N: tokens of one batch or step of the EP group (prefill: "
                                                         "the per-GPU budget times the GPUs).")
    tokens_per_request: int = Field(1, ge=1, le=64, description="Decode: tokens a request adds a step (1 + accepted "
                                                                "drafts); divides tokens_per_step.")
    seed: int = Field(0, ge=0, description="Seed of the requests, popularity, drift and bursts.")
    sample_seed: int | None = Field(None, ge=0, description="Seed of the token sampling alone (None: from seed): "
                                    "a twin with another sample_seed serves the same requests with fresh noise.")
    skew: float = Field(0.8, ge=0, le=20, description="Sigma of the lognormal popularity of a layer's experts.")
    concentration: float = Field(ESFT_CONCENTRATION, gt=0, le=1e9, description="Dirichlet concentration of a "
                                 "request's pick probabilities around the popularity; smaller: requests keep more to "
                                 "their own experts.")
    request_trace: str | None = Field(None, description="Mooncake .jsonl or Azure .csv trace whose prompt and output "
                                      "lengths the requests take, in order and cycled (None: the distributions below).")
    prompt_tokens: float = Field(4096.0, ge=1, le=1e7, description="Mean prompt length (lognormal).")
    prompt_spread: float = Field(0.0, ge=0, le=5, description="Sigma of log prompt length; 0: every prompt the mean.")
    output_tokens: float = Field(512.0, ge=1, le=1e7, description="Mean output length (lognormal).")
    output_spread: float = Field(1.0, ge=0, le=5, description="Sigma of log output length; 0: every output the mean.")
    num_domains: int = Field(4, ge=1, le=64, description="Domains of the popularity, as in traces.synthetic.")
    domain_overlap: float = Field(0.7, ge=0, le=1, description="Correlation of the domains' popularity scores.")
    drift_period_steps: float = Field(1000.0, gt=0, description="Typical period of a domain's share, in steps.")
    drift_strength: float = Field(1.0, ge=0, description="Amplitude of the domain-mix logits; 0: no drift.")
    burst_rate: float = Field(2.0, ge=0, description="Bursts per layer per 1000 steps; 0: none.")
    burst_length_steps: float = Field(50.0, ge=1, description="Mean burst length in steps.")
    burst_factor: float = Field(4.0, ge=1, description="Factor on a bursting expert's weight.")

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "RequestTrafficConfig":
        if self.top_k >= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be below num_experts={self.num_experts}; lower top_k")
        if self.mode == "decode" and self.tokens_per_step % self.tokens_per_request:
            raise ValueError(f"tokens_per_step={self.tokens_per_step} is not a whole number of live requests of "
                             f"tokens_per_request={self.tokens_per_request}; use a multiple")
        live_values = self.tokens_per_step // self.tokens_per_request * self.num_layers * self.num_experts
        if self.mode == "decode" and live_values > MAX_LIVE_VALUES:
            raise ValueError(f"decode keeps every live request's preferences: {live_values:,} values exceed the limit "
                             f"of {MAX_LIVE_VALUES:,} ({MAX_LIVE_VALUES * 4 // 2**30} GiB as float32); lower "
                             f"tokens_per_step or num_layers")
        self.synthetic()  # the shape limits of a synthetic trace hold here too
        return self

    def synthetic(self) -> SyntheticConfig:
        """The `traces.synthetic` settings whose popularity, drift and bursts this traffic shares."""
        return SyntheticConfig(
            num_steps=self.num_steps, num_layers=self.num_layers, num_experts=self.num_experts, top_k=self.top_k,
            tokens_per_step=self.tokens_per_step, seed=self.seed, popularity="lognormal", skew=self.skew,
            num_domains=self.num_domains, domain_overlap=self.domain_overlap,
            drift_period_steps=self.drift_period_steps, drift_strength=self.drift_strength,
            burst_rate=self.burst_rate, burst_length_steps=self.burst_length_steps, burst_factor=self.burst_factor)


def generate_request_traffic(config: RequestTrafficConfig) -> RoutingTrace:
    """Request-level routing traffic (see the module docstring): [T, L, E] int64 counts, each row N * K picks."""
    return RoutingTrace.from_counts(request_traffic_TLE(config), top_k=config.top_k,
                                    tokens_per_step=config.tokens_per_step,
                                    source=f"traces.request_traffic config={config.model_dump_json()}")


def request_traffic_TLE(config: RequestTrafficConfig, popularity_LE: np.ndarray | None = None,
                        prompts: np.ndarray | None = None) -> np.ndarray:
    """[T, L, E] int64 counts of `generate_request_traffic` (the array alone).

    `popularity_LE` [L, E] (positive weights) replaces the drawn popularity and its drift by a fixed one, and
    `prompts` [S] (tokens >= 1) the prompt lengths, taken in order and cycled: to model a measured log's own
    popularity and sequences (docs/traffic.md, the ESFT check)."""
    return request_traffic_with_expectation(config, popularity_LE, prompts)[0]


def request_traffic_with_expectation(config: RequestTrafficConfig, popularity_LE: np.ndarray | None = None,
                                     prompts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """([T, L, E] int64 counts, [T, L, E] float64 expected counts) of `request_traffic_TLE` (same arguments): the
    expectation is each batch's mean given its requests' pick probabilities and the bursts, before the token
    sampling (N * K * the capped pick probability; a saturated expert N): what the yardsticks' expectation oracle
    fits on (`placement.yardsticks`)."""
    synthetic = config.synthetic()
    popularity_rng, mix_rng, burst_rng, sample_rng = _streams(synthetic)
    if config.sample_seed is not None:
        sample_rng = np.random.default_rng([config.sample_seed, config.seed, 1])
    popularity_ZLE, mix_TZ = _domain_popularity_ZLE(synthetic, popularity_rng), domain_mix_TZ(synthetic, mix_rng)
    if popularity_LE is not None:
        weights = np.asarray(popularity_LE, dtype=np.float64)
        if weights.shape != (config.num_layers, config.num_experts) or not (weights >= 0).all() or \
                not (weights.sum(axis=-1) > 0).all():
            raise ValueError(f"popularity_LE must be [{config.num_layers}, {config.num_experts}] non-negative weights "
                             f"with a positive sum per layer; got shape {weights.shape}")
        popularity_ZLE = (weights / weights.sum(axis=-1, keepdims=True))[None]
        mix_TZ = np.ones((config.num_steps, 1))
    requests = _Requests(config, popularity_ZLE, mix_TZ)
    if prompts is not None:
        if config.mode != "prefill":
            raise ValueError("prompts sets prefill prompt lengths; mode must be 'prefill'")
        lengths = np.asarray(prompts, dtype=np.int64)
        if lengths.ndim != 1 or lengths.size == 0 or (lengths < 1).any():
            raise ValueError("prompts must be a non-empty 1-D array of prompt lengths >= 1")
        requests.trace = (lengths, np.ones_like(lengths))
    bursts = _draw_bursts(synthetic, burst_rng)
    batches = _prefill_batches if config.mode == "prefill" else _decode_steps
    shape = (config.num_steps, config.num_layers, config.num_experts)
    counts_TLE, expected_TLE = np.empty(shape, dtype=np.int64), np.empty(shape)
    for step, weight_LE in enumerate(batches(config, requests)):
        weight_1LE = weight_LE[None].copy()
        _apply_bursts(weight_1LE, bursts, step, config.burst_factor)
        counts_TLE[step] = _sample_counts_RE(weight_1LE[0], config.tokens_per_step, config.top_k, sample_rng)
        expected_TLE[step] = expected_counts_RE(weight_1LE[0], config.tokens_per_step, config.top_k)
    return counts_TLE, expected_TLE


class _Requests:
    """The requests in arrival order: lengths and, drawn on demand and reproducibly, per-layer pick probabilities."""

    def __init__(self, config: RequestTrafficConfig, popularity_ZLE: np.ndarray, mix_TZ: np.ndarray):
        self.config = config
        self.popularity_ZLE = popularity_ZLE
        self.mix_TZ = mix_TZ
        self.trace = None
        if config.request_trace is not None:
            trace = load_request_trace(config.request_trace)
            self.trace = (np.array([r.input_tokens for r in trace]), np.array([r.output_tokens for r in trace]))
        # Drawn lengths, grown as requests come: request i has the i-th draw of each stream whatever the growth.
        self._streams = np.random.default_rng([config.seed, 2]).spawn(2)
        self._drawn = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.preference_rng = np.random.default_rng([config.seed, 3])

    def lengths(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """([count] prompt, [count] output) tokens of requests first .. first + count - 1 (in order; >= 1)."""
        if self.trace is not None:
            index = np.arange(first, first + count) % self.trace[0].size
            return self.trace[0][index], self.trace[1][index]
        c = self.config
        have = self._drawn[0].size
        if first + count > have:
            more = max(first + count, 2 * have) - have
            self._drawn = (
                np.concatenate([self._drawn[0], _lognormal(self._streams[0], c.prompt_tokens, c.prompt_spread, more)]),
                np.concatenate([self._drawn[1], _lognormal(self._streams[1], c.output_tokens, c.output_spread, more)]))
        return self._drawn[0][first:first + count], self._drawn[1][first:first + count]

    def preferences(self, count: int, step: int) -> np.ndarray:
        """[count, L, E] float32 pick probabilities of the next `count` requests, joining at `step` (capped at 1 / K;
        rows sum to 1), drawn in order from the traffic's own stream (the same config draws the same)."""
        c = self.config
        center_LE = np.tensordot(self.mix_TZ[min(step, c.num_steps - 1)], self.popularity_ZLE, axes=1)
        shape_LE = np.maximum(c.concentration * center_LE, 1e-300)  # an expert of no popularity: never picked
        out = np.empty((count, c.num_layers, c.num_experts), dtype=np.float32)
        chunk = max(1, _DRAW_VALUES // (c.num_layers * c.num_experts))
        for start in range(0, count, chunk):
            stop = min(count, start + chunk)
            size = (stop - start, *shape_LE.shape)
            # Gamma(a) = Gamma(a + 1) * U ** (1 / a), in logs: no underflow to an all-zero draw at tiny shapes.
            log_gamma = np.log(self.preference_rng.gamma(shape_LE + 1.0, size=size)) + \
                np.log(self.preference_rng.random(size)) / shape_LE
            out[start:stop] = _capped(np.exp(log_gamma - log_gamma.max(axis=-1, keepdims=True)), c.top_k)
        return out


def _capped(gamma_RLE: np.ndarray, top_k: int) -> np.ndarray:
    """Normalise positive draws (the largest of each row 1) to pick probabilities and cap them at 1 / K (a token
    picks K distinct experts)."""
    rows = gamma_RLE.reshape(-1, gamma_RLE.shape[-1])
    free, saturated = _cap_pick_probs_RE(rows, top_k)
    free_share = (top_k - saturated.sum(axis=-1, keepdims=True)) / top_k
    return (free * free_share + saturated / top_k).reshape(gamma_RLE.shape)


def _lognormal(rng: np.random.Generator, mean: float, spread: float, count: int) -> np.ndarray:
    """[count] int64 lengths >= 1 with the given mean, lognormal with sigma `spread` (0: all the mean)."""
    if spread == 0:
        return np.full(count, max(1, round(mean)), dtype=np.int64)
    draws = rng.lognormal(math.log(mean) - spread**2 / 2, spread, size=count)
    return np.maximum(1, np.rint(draws)).astype(np.int64)


def _prefill_batches(config: RequestTrafficConfig, requests: _Requests):
    """Yield each batch's [L, E] pick weights: whole prompts in order up to N tokens, the last one chunked."""
    budget = config.tokens_per_step
    next_id, carried = 0, None  # carried: (preferences [L, E], tokens left) of a prompt chunked into the next batch
    for step in range(config.num_steps):
        weight_LE = np.zeros((config.num_layers, config.num_experts))
        room = budget
        if carried is not None:
            taken = min(room, carried[1])
            weight_LE += taken * carried[0]
            room -= taken
            carried = (carried[0], carried[1] - taken) if carried[1] > taken else None
        while room > 0:
            # Enough prompts for the room left, drawn together (at least one, at most a draw's memory).
            prompts, _ = requests.lengths(next_id, 1)
            count = max(1, min(_DRAW_VALUES // (config.num_layers * config.num_experts),
                               -(-room // max(1, int(prompts[0])))))
            prompts, _ = requests.lengths(next_id, count)
            through = np.cumsum(prompts)
            fits = int(np.searchsorted(through, room, side="right"))  # whole prompts that fit
            used = min(count, fits + 1)
            q_RLE = requests.preferences(used, step)
            taken = np.minimum(prompts[:used], np.maximum(0, room - np.concatenate([[0], through[:used - 1]])))
            weight_LE += np.tensordot(taken.astype(np.float64), q_RLE, axes=1)
            if taken[-1] < prompts[used - 1]:
                carried = (q_RLE[-1], int(prompts[used - 1] - taken[-1]))
            room -= int(taken.sum())
            next_id += used
        yield weight_LE


def _decode_steps(config: RequestTrafficConfig, requests: _Requests):
    """Yield each step's [L, E] pick weights: B live requests, each adding tokens_per_request tokens a step."""
    live = config.tokens_per_step // config.tokens_per_request
    per_step = config.tokens_per_request
    # The steady state: output lengths drawn in proportion to their length, each request part way through.
    pool = max(4 * live, 1024)
    _, outputs = requests.lengths(0, pool)
    life = np.ceil(outputs / per_step).astype(np.int64)
    pick_rng = np.random.default_rng([config.seed, 4])
    chosen = pick_rng.choice(pool, size=live, replace=True, p=life / life.sum())
    left = pick_rng.integers(1, life[chosen] + 1)  # steps still to run, this one included
    next_id = pool
    q_BLE = requests.preferences(live, 0)  # the live requests' pick probabilities, one row per batch place
    weight_LE = q_BLE.sum(axis=0, dtype=np.float64) * per_step
    for step in range(config.num_steps):
        yield weight_LE
        left -= 1
        done = np.flatnonzero(left == 0)
        if done.size == 0 or step + 1 == config.num_steps:
            continue
        weight_LE -= q_BLE[done].sum(axis=0, dtype=np.float64) * per_step
        _, new_outputs = requests.lengths(next_id, done.size)
        next_id += done.size
        q_BLE[done] = requests.preferences(done.size, step + 1)
        left[done] = np.ceil(new_outputs / per_step).astype(np.int64)
        weight_LE += q_BLE[done].sum(axis=0, dtype=np.float64) * per_step
        np.maximum(weight_LE, 0.0, out=weight_LE)  # rounding of the running sum
