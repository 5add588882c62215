"""Request-level routing traffic and the concentration estimator. Legend: T steps, L layers, E experts, K top-k,
N tokens a step, S sequences."""

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from placement import ClusterSpec, fit_placement
from placement.scoring import score_placement
from traces.request_concentration import estimate_concentration, sequence_counts
from traces.request_traffic import (ESFT_CONCENTRATION, RequestTrafficConfig, generate_request_traffic,
                                    request_traffic_TLE, request_traffic_with_expectation)

ESFT = Path(__file__).resolve().parents[3] / "shared" / "data" / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"
REQUESTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "requests"
SMALL = dict(num_steps=60, num_layers=3, num_experts=32, top_k=4, tokens_per_step=512)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_rows_hold_n_times_k_picks_none_above_n_and_the_same_config_gives_the_same_trace(mode):
    config = RequestTrafficConfig(mode=mode, prompt_tokens=100, prompt_spread=1.0, output_tokens=20, **SMALL)
    trace = generate_request_traffic(config)
    counts_TLE = trace.counts_TLE
    assert counts_TLE.shape == (60, 3, 32) and counts_TLE.dtype == np.int64
    assert (counts_TLE.sum(axis=-1) == 512 * 4).all() and counts_TLE.max() <= 512
    assert np.array_equal(counts_TLE, request_traffic_TLE(config))
    assert "traces.request_traffic" in trace.header.source and trace.header.tokens_per_step == 512


def _excess(config: RequestTrafficConfig, gpus: int, slots: int) -> float:
    """Mean (step, layer) imbalance - 1 of the traffic under the greedy fitted on its own total, equal split."""
    counts_TLE = request_traffic_TLE(config)
    cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=gpus)
    placement = fit_placement("deepseek", counts_TLE.sum(axis=0, keepdims=True), cluster)
    return float(score_placement(placement, counts_TLE, "static").imbalance_TL.mean()) - 1.0


def test_requests_that_keep_their_own_experts_unbalance_a_batch_more_than_independent_tokens():
    # The structure the issue measured on ESFT: whole prompts in a batch leave more imbalance than the same tokens
    # shuffled; fewer, longer prompts a batch leave more than many short ones.
    base = dict(mode="prefill", num_steps=80, num_layers=4, num_experts=64, top_k=6, tokens_per_step=2048,
                burst_rate=0.0, drift_strength=0.0, skew=0.6)
    concentrated = _excess(RequestTrafficConfig(**base, concentration=50.0, prompt_tokens=512), 16, 5)
    independent = _excess(RequestTrafficConfig(**base, concentration=1e8, prompt_tokens=512), 16, 5)
    many_short = _excess(RequestTrafficConfig(**base, concentration=50.0, prompt_tokens=32), 16, 5)
    assert concentrated > 1.5 * independent
    assert concentrated > 1.3 * many_short


def test_prefill_batches_are_whole_prompts_chunked_at_the_budget():
    # One expert per request (concentration tiny, top-1): a batch's picks land on as many experts as it holds
    # prompts or chunks of prompts; prompts of 300 tokens in batches of 1,000 are 4 pieces a batch (300, 300, 300
    # and 100; then the 200 left, 300, 300, 200; ...).
    config = RequestTrafficConfig(mode="prefill", num_steps=30, num_layers=1, num_experts=1000, top_k=1,
                                  tokens_per_step=1000, prompt_tokens=300, concentration=1e-3, skew=0.0,
                                  burst_rate=0.0, drift_strength=0.0)
    counts_TE = request_traffic_TLE(config)[:, 0]
    pieces_T = (counts_TE > 0).sum(axis=-1)
    assert set(pieces_T.tolist()) == {4}
    # A prompt cut at a batch's end goes on in the next batch with the same expert; a batch that ends on a prompt's
    # end shares none with the next.
    for step in range(29):
        shared = set(np.flatnonzero(counts_TE[step])) & set(np.flatnonzero(counts_TE[step + 1]))
        assert len(shared) == (1 if (step + 1) * 1000 % 300 else 0)


def test_decode_keeps_a_request_for_its_output_then_replaces_it():
    # One expert per request: a batch of 8 requests with outputs of exactly 40 tokens (16 a step: 3 steps each)
    # keeps its experts for 3 steps and replaces each request that leaves.
    config = RequestTrafficConfig(mode="decode", num_steps=40, num_layers=1, num_experts=4000, top_k=1,
                                  tokens_per_step=128, tokens_per_request=16, output_tokens=40, output_spread=0.0,
                                  concentration=1e-3, skew=0.0, burst_rate=0.0, drift_strength=0.0)
    counts_TE = request_traffic_TLE(config)[:, 0]
    assert ((counts_TE > 0).sum(axis=-1) == 8).all()
    experts = [set(np.flatnonzero(row)) for row in counts_TE]
    kept = [len(a & b) for a, b in zip(experts, experts[1:])]
    assert 0 < np.mean(kept) < 8  # some stay from step to step, some leave
    lifetimes = {}
    for step, row in enumerate(experts):
        for expert in row:
            lifetimes.setdefault(expert, []).append(step)
    full = [steps for steps in lifetimes.values() if steps[0] > 0 and steps[-1] < 39]
    assert full and all(len(steps) == 3 and steps == list(range(steps[0], steps[0] + 3)) for steps in full)


def test_a_rerun_serves_the_same_requests_with_fresh_sampling():
    config = RequestTrafficConfig(mode="decode", **SMALL)
    first = request_traffic_TLE(config)
    rerun = request_traffic_TLE(config.model_copy(update={"sample_seed": 7}))
    other = request_traffic_TLE(config.model_copy(update={"seed": 1}))
    assert not np.array_equal(first, rerun)
    # The same requests: the rerun's per-step loads follow the run's far more closely than another run's.
    assert np.abs(first - rerun).sum() < 0.75 * np.abs(first - other).sum()


def test_request_lengths_come_from_a_request_trace_in_order():
    trace = REQUESTS / "mooncake_conversation_trace.jsonl"
    if not trace.is_file():
        pytest.skip("../shared/data/requests is absent")
    config = RequestTrafficConfig(mode="prefill", request_trace=str(trace), **SMALL)
    assert (request_traffic_TLE(config).sum(axis=-1) == 512 * 4).all()


@pytest.mark.parametrize("bad, names", [
    (dict(mode="decode", tokens_per_step=10, tokens_per_request=3), "tokens_per_request"),
    (dict(top_k=32), "top_k"),
    (dict(concentration=0.0), "concentration"),
    (dict(mode="decode", tokens_per_step=1 << 20, num_layers=61, num_experts=256), "tokens_per_step"),
])
def test_bad_settings_are_refused_naming_the_parameter(bad, names):
    with pytest.raises(ValidationError, match=names):
        RequestTrafficConfig(**{**SMALL, **bad})


def test_the_estimator_recovers_the_concentration_it_is_given():
    # Sequences drawn from the model itself (Dirichlet preferences, K distinct picks per token).
    rng = np.random.default_rng(0)
    layers, experts, top_k, alpha = 4, 64, 6, 120.0
    popularity_LE = rng.dirichlet(np.full(experts, 2.0), size=layers)
    tokens_S = rng.integers(50, 600, size=300)
    counts_SLE = np.zeros((tokens_S.size, layers, experts), dtype=np.int64)
    for s, tokens in enumerate(tokens_S):
        for layer in range(layers):
            q = rng.dirichlet(alpha * popularity_LE[layer])
            keys = np.log(rng.random((tokens, experts))) / np.maximum(q, 1e-300)  # K distinct, weighted (Efraimidis)
            picks = np.argpartition(-keys, top_k, axis=1)[:, :top_k]
            counts_SLE[s, layer] = np.bincount(picks.ravel(), minlength=experts)
    estimate = estimate_concentration(counts_SLE, tokens_S, top_k)
    assert estimate.alpha == pytest.approx(alpha, rel=0.2)
    # Independent tokens (no per-sequence preference): no excess, a concentration far above any real one.
    shuffled = np.zeros_like(counts_SLE)
    for layer in range(layers):
        keys = np.log(rng.random((tokens_S.sum(), experts))) / popularity_LE[layer]
        picks = np.argpartition(-keys, top_k, axis=1)[:, :top_k]
        for s, (a, b) in enumerate(zip(np.r_[0, np.cumsum(tokens_S)[:-1]], np.cumsum(tokens_S))):
            shuffled[s, layer] = np.bincount(picks[a:b].ravel(), minlength=experts)
    assert estimate_concentration(shuffled, tokens_S, top_k).alpha > 20 * alpha


def test_the_default_concentration_is_the_estimate_on_the_four_esft_tasks():
    if not ESFT.is_file():
        pytest.skip("../shared/data/esft-dsv2lite is absent")
    counts_SLE, tokens_S, top_k = sequence_counts(ESFT)
    assert counts_SLE.shape[0] == 213 and top_k == 6
    assert estimate_concentration(counts_SLE, tokens_S, top_k).alpha == pytest.approx(ESFT_CONCENTRATION, rel=0.01)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_the_expectation_holds_the_counts_picks_and_their_mean_over_steps(mode):
    config = RequestTrafficConfig(mode=mode, prompt_tokens=100, output_tokens=20, **{**SMALL, "num_steps": 400})
    counts_TLE, expected_TLE = request_traffic_with_expectation(config)
    np.testing.assert_array_equal(counts_TLE, request_traffic_TLE(config))
    np.testing.assert_allclose(expected_TLE.sum(axis=-1), 512 * 4)
    assert (expected_TLE <= 512 + 1e-9).all(), "no expert expects more than every token"
    # The sampling noise of 400 steps' mean is about 1% of an expert's load: the expectation is the counts' mean.
    busy = expected_TLE.mean(axis=0) > 64
    np.testing.assert_allclose(counts_TLE.mean(axis=0)[busy], expected_TLE.mean(axis=0)[busy], rtol=0.05)
