"""The request-level engine with speculative decoding: every request finishes, decode tokens per card rise, each
sequence gets exactly the tokens it needs, and the report carries the configured policy's expected step."""

import json

import pytest

from sim import SimConfig, run_simulation
from sim.speculative import expected_step

SMALL = {
    "duration_s": 8.0,
    "workload": {"synthetic": {"sessions_per_s": 2.0, "images_per_request": 0.3}},
    "cluster": {"prefill_nodes": 2, "decode_cards": 16, "vision_cards": 1},
    "balance": {"policy": "none", "layers": 2, "steps": 60},
}


def _small(**speculative) -> SimConfig:
    data = json.loads(json.dumps(SMALL))
    data["speculative"] = speculative
    return SimConfig.model_validate(data)


def test_engine_with_speculation_finishes_every_request_and_raises_decode_tokens_per_card():
    plain_result, plain = run_simulation(_small())
    result, report = run_simulation(_small(enabled=True))
    assert report["requests"] == plain["requests"] >= 5 and report["requests_lost"] == 0
    assert report["decode_tokens_per_s_per_card"] > 1.2 * plain["decode_tokens_per_s_per_card"]
    assert report["decode_steps"] < plain["decode_steps"]
    needed = sum(r.request.output_tokens - 1 for r in result.records if r.request.output_tokens > 1)
    assert abs(result.decode.tokens - needed) <= 1 and plain_result.decode.tokens == needed
    assert result.timeline["output_tokens"].sum() == pytest.approx(needed + len(result.records))
    step = expected_step(result.config.speculative, result.config.seed)
    assert report["speculative"] == {"policy": "threshold", "draft_tokens": 5, "tokens_per_step": step.tokens_per_step,
                                     "verified_per_step": step.verified_per_step,
                                     "drafted_per_step": step.drafted_per_step}
    assert plain["speculative"] is None
