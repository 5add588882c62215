"""Speculative decoding on a decode unit: a draft proposes `k` tokens per step, the target verifies some of them.

Glossary:
  draft token      a token the draft model (DeepSeek's MTP module, or a DSpark-like head) proposes after the
                   target's own token; there are `k = draft_tokens` of them per sequence and step.
  acceptance       draft token j is accepted with probability q_j given that tokens 1..j-1 were (sequential: a
                   rejection discards everything after it). The target always yields one token of its own, so a
                   step gives 1 + accepted tokens per sequence.
  verified         draft tokens the target runs in its step; they share one read of the cache and the weights, so
                   the step costs `decode_step_seconds(..., tokens_per_sequence=1 + verified)`.
  predicted        the draft's own estimate of q_j (its confidence): what selective verification decides on.

Policies: "all" verifies the k draft tokens, "first_n" the first `verify_first_n`, "threshold" the leading ones
whose predicted cumulative acceptance (product of predicted q so far) exceeds `threshold` (the DSpark post's
selective verification: verify less where verification compute is what the step pays for).

Acceptance model: position j's mean conditional acceptance is p_j = first_acceptance x acceptance_decay^(j-1);
each sequence's q_j is drawn from a Beta with mean p_j and variance confidence_spread x p_j (1 - p_j); the draft
predicts sigmoid(logit(q_j) + noise), noise ~ N(0, predictor_noise^2). Expectations are Monte Carlo over sampled
sequences (the Bernoulli outcomes are summed out exactly given q), seeded by the caller.

Shapes: `R` sampled sequences (rows), `J` draft positions (j = 1..k).
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.calibration import fitted
from sim.cost_model import decode_step_seconds, draft_pass_fixed_seconds
from sim.hardware import HardwareProfile
from sim.model_profile import ModelProfile

POLICIES = ("all", "first_n", "threshold")
SAMPLED_SEQUENCES = 65_536  # rows of the Monte Carlo: its error on tokens per step is far below the policies' gaps
STREAM = 11  # this module's random stream under the run's seed (the workload uses 7)
_EDGE = 1e-9  # q and predictions are kept in [_EDGE, 1 - _EDGE] before a logit


class SpeculativeConfig(BaseModel):
    """Speculative decoding on the decode units: the draft, the acceptance model and the verification policy.

    Defaults and why (figures and sources: docs/simulator.md, 'Speculative decoding'):
    - first_acceptance 0.875: the middle of the range DeepSeek-V3's report gives for its MTP module's token; with
      draft_cost_share below, k = 1 turns it into the report's published speed-up.
    - acceptance_decay (fitted, sim/calibration.yaml): DeepSeek's MTP was trained to predict one token ahead and
      drifts when reused autoregressively for later positions; the decay is fitted to the tokens per step published
      for the original V3 MTP reused at k = 7.
    - confidence_spread 1/3: a Beta of concentration 2, uniform at p = 0.5 and skewed to certainty at p = 0.875
      (most tokens easy, a tail of hard ones), so a predictor has easy and hard tokens to tell apart.
    - predictor_noise 0.5 logits: EAGLE-2 finds the draft's confidence tracks the acceptance rate closely; 0.5
      keeps it informative without making it an oracle.
    - draft_cost_share (fitted, sim/calibration.yaml): one MTP module is one MLA + MoE layer, a projection and the
      shared output head, a few percent of a V3 token's work; the share is fitted so that DeepSeek's tokens per step
      give its published speed-up. Each drafted token also pays its own pass's fixed time: one layer's launches,
      synchronisation and all-to-all floors (`sim.cost_model.draft_pass_fixed_seconds`), whatever the batch. A
      DSpark-style parallel drafter costs less per token; lower the share for one.
    - threshold 0.4: the best fixed cut where verification has become a large part of what the step pays for
      (scripts/bench_speculative.py sweeps it); lower is better at smaller batches (the fixed time per layer makes
      verification nearly free), higher at larger ones.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    enabled: bool = Field(False, description="Decode with a draft model (off: one token per sequence and step).")
    draft_tokens: int = Field(5, ge=1, le=32, description="k: draft tokens proposed per sequence and step.")
    policy: Literal["all", "first_n", "threshold"] = Field(
        "threshold", description="Draft tokens verified: all k, the first verify_first_n, or the leading ones whose "
                                 "predicted cumulative acceptance exceeds threshold.")
    verify_first_n: int = Field(3, ge=1, le=32, description="Draft tokens verified under policy first_n (<= "
                                                            "draft_tokens).")
    threshold: float = Field(0.4, ge=0, le=1, description="Predicted cumulative acceptance below which a draft "
                                                          "token (and all after it) is not verified.")
    first_acceptance: float = Field(0.875, ge=0, le=1, description="Mean acceptance of the first draft token "
                                                                   "(default: DeepSeek-V3's MTP, as published).")
    acceptance_decay: float = Field(fitted("speculative.acceptance_decay"), ge=0, le=1,
                                    description="Each later position's mean conditional acceptance is the previous "
                                                "one's times this (fitted: sim/calibration.yaml).")
    confidence_spread: float = Field(1 / 3, ge=0, lt=1, description="Variance of a token's acceptance around its "
                                                                    "position's mean, as a share of p(1 - p).")
    predictor_noise: float = Field(0.5, ge=0, le=10, description="SD, in logits, of the draft's predicted acceptance "
                                                          "around the true one (0: a perfect predictor).")
    draft_cost_share: float = Field(fitted("speculative.draft_cost_share"), ge=0, le=10,
                                    description="Draft seconds per drafted token as a share of a target decode step "
                                                "of one token per sequence (fitted: sim/calibration.yaml).")

    @model_validator(mode="after")
    def _consistent(self) -> "SpeculativeConfig":
        if self.policy == "first_n" and self.verify_first_n > self.draft_tokens:
            raise ValueError(f"verify_first_n={self.verify_first_n} exceeds draft_tokens={self.draft_tokens}; "
                             f"verify at most the tokens drafted")
        return self


@dataclass(frozen=True)
class SpeculativeStep:
    """Per-sequence expectations of one step under one policy; they do not depend on the batch size."""

    policy: str
    tokens_per_step: float  # 1 + expected accepted draft tokens (the target's own token always counts)
    verified_per_step: float  # mean draft tokens the target verifies
    drafted_per_step: float  # mean draft tokens the draft model produces (it stops once the policy would not verify)


@dataclass(frozen=True)
class SpeculativeCost:
    """Seconds and throughput of one speculative decode step of a unit."""

    step: SpeculativeStep
    verify_s: float  # the target's pass over 1 + verified tokens per sequence
    draft_s: float  # the draft's passes
    tokens_per_s: float  # tokens the unit's batch gains per second
    verify_moe_s: float = 0.0  # the routed experts' seconds of the verification pass

    @property
    def total_s(self) -> float:
        """Seconds of the step: verification plus drafting."""
        return self.verify_s + self.draft_s

    @property
    def moe_share(self) -> float:
        """The target's routed experts' share of the step (the draft's own MoE layer is left out)."""
        return self.verify_moe_s / self.total_s if self.total_s > 0 else 0.0


def position_means(spec: SpeculativeConfig) -> np.ndarray:
    """[J] float, mean conditional acceptance of each draft position: first_acceptance x decay^(j-1)."""
    return spec.first_acceptance * spec.acceptance_decay ** np.arange(spec.draft_tokens, dtype=float)


def sample_acceptance(spec: SpeculativeConfig, rng: np.random.Generator,
                      sequences: int = SAMPLED_SEQUENCES) -> tuple[np.ndarray, np.ndarray]:
    """(true_RJ, predicted_RJ): [sequences, k] float in [0, 1], each sequence's true conditional acceptance of
    each draft position and the draft's prediction of it."""
    if sequences < 1:
        raise ValueError(f"sequences={sequences} must be >= 1")
    mean_J = position_means(spec)
    if spec.confidence_spread == 0:
        true_RJ = np.broadcast_to(mean_J, (sequences, spec.draft_tokens)).copy()
    else:
        # Beta(c p, c (1 - p)) has mean p and variance p (1 - p) / (c + 1) = spread x p (1 - p)
        concentration = 1.0 / spec.confidence_spread - 1.0
        inside_J = np.clip(mean_J, _EDGE, 1 - _EDGE)
        draws_RJ = rng.beta(concentration * inside_J, concentration * (1 - inside_J),
                            size=(sequences, spec.draft_tokens))
        certain_J = (mean_J <= 0) | (mean_J >= 1)  # a Beta cannot have mean 0 or 1: every token is that mean
        true_RJ = np.where(certain_J, mean_J, draws_RJ)
    clipped_RJ = np.clip(true_RJ, _EDGE, 1 - _EDGE)
    noise_RJ = rng.normal(0.0, spec.predictor_noise, size=true_RJ.shape) if spec.predictor_noise else 0.0
    predicted_RJ = 1.0 / (1.0 + np.exp(-(np.log(clipped_RJ / (1 - clipped_RJ)) + noise_RJ)))
    return true_RJ, predicted_RJ


def policy_step(spec: SpeculativeConfig, true_RJ: np.ndarray, predicted_RJ: np.ndarray,
                policy: str | None = None, threshold: float | None = None) -> SpeculativeStep:
    """Expected tokens, verified and drafted tokens per sequence and step under `policy` (default: the config's),
    from `sample_acceptance`'s draws; `threshold` overrides the config's for the threshold policy."""
    policy = spec.policy if policy is None else policy
    k = spec.draft_tokens
    # reach_RJ[r, j]: chance draft tokens 1..j+1 are all accepted (acceptance is sequential)
    reach_RJ = np.cumprod(true_RJ, axis=1)
    if policy == "all":
        verified_R = np.full(len(true_RJ), k)
        drafted_R = verified_R
    elif policy == "first_n":
        verified_R = np.full(len(true_RJ), min(spec.verify_first_n, k))
        drafted_R = verified_R
    elif policy == "threshold":
        cut = spec.threshold if threshold is None else threshold
        # predicted cumulative acceptance only falls along a row, so the tokens above the cut are a leading run
        verified_R = (np.cumprod(predicted_RJ, axis=1) > cut).sum(axis=1)
        drafted_R = np.minimum(verified_R + 1, k)  # the draft proposed the token that fell below the cut
    else:
        raise ValueError(f"policy={policy!r} is not one of {', '.join(POLICIES)}")
    verify_RJ = np.arange(k) < verified_R[:, None]
    accepted_R = (reach_RJ * verify_RJ).sum(axis=1)
    return SpeculativeStep(policy=policy, tokens_per_step=1.0 + float(accepted_R.mean()),
                           verified_per_step=float(verified_R.mean()), drafted_per_step=float(drafted_R.mean()))


@lru_cache(maxsize=32)
def expected_steps(spec: SpeculativeConfig, seed: int) -> MappingProxyType:
    """Each policy's step from one seeded sample, read-only {policy: SpeculativeStep} (cached: the engine asks once
    per unit and run, the report once more)."""
    true_RJ, predicted_RJ = sample_acceptance(spec, np.random.default_rng([seed, STREAM]))
    return MappingProxyType({policy: policy_step(spec, true_RJ, predicted_RJ, policy) for policy in POLICIES})


def expected_step(spec: SpeculativeConfig, seed: int) -> SpeculativeStep:
    """The configured policy's step (see `expected_steps`)."""
    return expected_steps(spec, seed)[spec.policy]


def draft_seconds(spec: SpeculativeConfig, step: SpeculativeStep, one_token_work_s: float,
                  pass_fixed_s: float = 0.0) -> float:
    """Seconds the draft takes: per drafted token, draft_cost_share x the work of a target step of one token per
    sequence (its seconds less the fixed time per layer) plus the draft pass's own fixed seconds (the batch drafts in
    lockstep; a pass is charged for the mean drafted tokens, not the longest sequence's)."""
    return step.drafted_per_step * (spec.draft_cost_share * one_token_work_s + pass_fixed_s)


def step_cost(spec: SpeculativeConfig, step: SpeculativeStep, model: ModelProfile, hardware: HardwareProfile,
              cards: int, batch_size: int, kv_tokens: float, *, moe_imbalance: float = 1.0,
              redundant_experts: int = 0) -> SpeculativeCost:
    """Cost of one speculative step of a unit of `cards` serving `batch_size` sequences with `kv_tokens` of
    context in all: the target verifies 1 + verified tokens per sequence, the draft proposes drafted ones."""
    base = dict(moe_imbalance=moe_imbalance, redundant_experts=redundant_experts)
    one = decode_step_seconds(model, hardware, cards, batch_size, kv_tokens, **base)
    verify = decode_step_seconds(model, hardware, cards, batch_size, kv_tokens,
                                 tokens_per_sequence=1.0 + step.verified_per_step, **base)
    draft = draft_seconds(spec, step, one.total_s - one.fixed_s, draft_pass_fixed_seconds(model, cards))
    rate = batch_size * step.tokens_per_step / (verify.total_s + draft) if batch_size else 0.0
    return SpeculativeCost(step=step, verify_s=verify.total_s, draft_s=draft, tokens_per_s=rate,
                           verify_moe_s=verify.moe_s)


def gain_table(spec: SpeculativeConfig, model: ModelProfile, hardware: HardwareProfile, cards: int,
               acceptances: list[float], batches_per_card: list[int], context_tokens: int, *,
               redundant_experts: int = 0, seed: int = 0,
               thresholds: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))) -> list[dict]:
    """One row per (first_acceptance, sequences per card): each policy's tokens per step, step seconds and tokens/s
    per card, no speculation's tokens/s per card, the threshold policy's gain over verify-all, and the best
    threshold of `thresholds` with its gain over verify-all. Sequences all hold `context_tokens` of context."""
    rows = []
    for acceptance in acceptances:
        at = spec.model_copy(update={"first_acceptance": float(acceptance)})
        true_RJ, predicted_RJ = sample_acceptance(at, np.random.default_rng([seed, STREAM]))
        steps = {policy: policy_step(at, true_RJ, predicted_RJ, policy) for policy in POLICIES}
        swept = {t: policy_step(at, true_RJ, predicted_RJ, "threshold", t) for t in thresholds}
        for per_card in batches_per_card:
            batch = per_card * cards
            kv = batch * context_tokens

            def cost(step: SpeculativeStep) -> SpeculativeCost:
                return step_cost(at, step, model, hardware, cards, batch, kv, redundant_experts=redundant_experts)

            plain = decode_step_seconds(model, hardware, cards, batch, kv, redundant_experts=redundant_experts)
            costs = {policy: cost(step) for policy, step in steps.items()}
            best_t, best = max(((t, cost(step)) for t, step in swept.items()), key=lambda pair: pair[1].tokens_per_s)
            all_rate = costs["all"].tokens_per_s
            rows.append({
                "first_acceptance": float(acceptance), "batch_per_card": per_card,
                "plain_tokens_per_s_per_card": per_card / plain.total_s,
                "policies": {policy: {"tokens_per_step": c.step.tokens_per_step,
                                      "verified_per_step": c.step.verified_per_step,
                                      "step_s": c.total_s, "tokens_per_s_per_card": c.tokens_per_s / cards}
                             for policy, c in costs.items()},
                "threshold_gain_vs_all": costs["threshold"].tokens_per_s / all_rate - 1,
                "best_threshold": best_t, "best_threshold_gain_vs_all": best.tokens_per_s / all_rate - 1,
            })
    return rows


def batch_for_gain(spec: SpeculativeConfig, model: ModelProfile, hardware: HardwareProfile, cards: int,
                   context_tokens: int, target: float, *, max_batch_per_card: float = 256.0,
                   per_card_step: float = 0.125, redundant_experts: int = 0, seed: int = 0) -> float | None:
    """Fewest sequences per card (on a grid of `per_card_step`) at which the configured threshold policy's tokens/s
    beats verify-all's by at least `target` (0.06: 6%); None if no batch up to `max_batch_per_card` does."""
    if per_card_step <= 0:
        raise ValueError(f"per_card_step={per_card_step} must be > 0")
    steps = expected_steps(spec, seed)
    per_card = per_card_step
    while per_card <= max_batch_per_card:
        batch = max(1, round(per_card * cards))
        all_rate, threshold_rate = (
            step_cost(spec, steps[policy], model, hardware, cards, batch, batch * context_tokens,
                      redundant_experts=redundant_experts).tokens_per_s for policy in ("all", "threshold"))
        if threshold_rate >= all_rate * (1 + target):
            return batch / cards
        per_card += per_card_step
    return None


def steps_to_finish(output_tokens: int, tokens_per_step: float) -> int:
    """Decode steps a sequence of `output_tokens` needs when each step yields `tokens_per_step` on average (its
    first token comes out of prefill)."""
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step={tokens_per_step} must be >= 1 (the target yields one token per step)")
    return math.ceil((output_tokens - 1) / tokens_per_step)
