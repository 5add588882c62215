"""The simulator end to end on small configs: every request finishes, the run is reproducible from its seed, the
prefix cache saves prefill work on multi-turn traffic, and balancing the decode unit's experts shows in its
imbalance and throughput; the config names a wrong field, and synthetic sessions resend their history."""

import json
import math

import pytest

from sim import SimConfig, SimConfigError, load_sim_config, run_simulation
from sim.workload import synthetic_requests

SMALL = {
    "duration_s": 8.0,
    "workload": {"synthetic": {"sessions_per_s": 2.0, "images_per_request": 0.3}},
    "cluster": {"prefill_nodes": 2, "decode_cards": 16, "vision_cards": 1},
    "balance": {"policy": "deepseek", "layers": 2, "steps": 60, "refit_every": 20, "window": 20},
}
CONTRACT_KEYS = {
    "requests", "requests_lost", "input_tokens_per_s", "output_tokens_per_s", "prefill_tokens_per_s_per_card",
    "decode_tokens_per_s_per_card", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "disk_cache_hit_rate",
    "window_cache_hit_rate", "prefill_decoder_flops_saved", "decode_imbalance_mean", "cards",
    "sim_seconds_per_wall_second",
}


def small(**changes) -> SimConfig:
    data = json.loads(json.dumps(SMALL))
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split("__")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return SimConfig.model_validate(data)


def test_every_request_finishes_and_the_report_holds_the_contract_keys():
    result, report = run_simulation(small())
    assert CONTRACT_KEYS <= report.keys()
    assert report["requests"] >= 5 and report["requests_lost"] == 0
    assert all(math.isfinite(r.finish_s) and r.finish_s >= r.first_token_s >= r.request.arrival_s
               for r in result.records)
    assert report["ttft_p99_s"] >= report["ttft_p50_s"] > 0 and report["tpot_p50_s"] > 0
    assert report["cards"] == {"vision": 1, "prefill": 16, "decode": 16}
    assert report["decode_imbalance_mean"] >= 1.0


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    first = run_simulation(small())[1]
    again = run_simulation(small())[1]
    other = run_simulation(small(seed=5))[1]
    keys = CONTRACT_KEYS - {"sim_seconds_per_wall_second"}
    assert {k: first[k] for k in keys} == {k: again[k] for k in keys}
    assert first["requests"] != other["requests"] or first["ttft_p50_s"] != other["ttft_p50_s"]


def test_returning_turns_hit_the_prefix_cache_and_save_prefill_work():
    quick_turns = {"sessions_per_s": 1.0, "think_time_s": {"chat": 1.0, "agent": 1.0},
                   "output_tokens": {"chat": 60.0, "agent": 60.0}}
    report = run_simulation(small(duration_s=40.0, workload__synthetic=quick_turns))[1]
    assert report["disk_cache_hit_rate"] > 0.2
    assert report["prefill_decoder_flops_saved"] > 0.2
    designs = report["window_designs"]
    assert designs["disk"]["flops_vs_full_recompute"] <= designs["memory"]["flops_vs_full_recompute"] \
        <= designs["recompute"]["flops_vs_full_recompute"] <= 1.0
    assert designs["disk"]["disk_bytes_needed"] >= designs["memory"]["disk_bytes_needed"]


def test_balancing_the_decode_experts_lowers_imbalance():
    none = run_simulation(small(balance__policy="none"))[1]
    balanced = run_simulation(small(balance__policy="cpsat", balance__work_limit=0.5))[1]
    assert balanced["decode_imbalance_mean"] < none["decode_imbalance_mean"]


def test_a_prefill_instance_over_two_nodes_pays_the_placement_codes_imbalance():
    alone = run_simulation(small())[1]
    spread = run_simulation(small(cluster__prefill_instance_nodes=2))[1]
    assert alone["prefill_imbalance_mean"] == 1.0  # a node alone is taken as balanced
    assert spread["prefill_imbalance_mean"] > 1.0 and spread["requests_lost"] == 0
    assert spread["requests"] == alone["requests"]
    with pytest.raises(ValueError, match="prefill_instance_nodes=2"):
        small(cluster__prefill_nodes=3, cluster__prefill_instance_nodes=2)


def test_synthetic_sessions_resend_their_history_with_stable_prefix_blocks():
    config = SimConfig().workload.synthetic
    requests = synthetic_requests(config, 120.0, 512, seed=1)
    assert requests == synthetic_requests(config, 120.0, 512, seed=1)
    assert all(0 <= r.arrival_s < 120 for r in requests)
    by_session = {}
    for request in requests:
        by_session.setdefault(request.session, []).append(request)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for before, after in zip(turns, turns[1:]):
            assert after.input_tokens > before.input_tokens + before.output_tokens - 1
            full = before.input_tokens // 512
            assert after.block_hashes[:full] == before.block_hashes[:full]


def test_a_config_file_with_a_wrong_field_names_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  decode_card: 64\n")
    with pytest.raises(SimConfigError, match=r"cluster\.decode_card: unknown field"):
        load_sim_config(bad)
    wrong_card = tmp_path / "card.json"
    wrong_card.write_text('{"hardware": {"decode": "B300"}}')
    with pytest.raises(SimConfigError, match="hardware.*B300"):
        load_sim_config(wrong_card)
    good = tmp_path / "good.yaml"
    good.write_text("duration_s: 30\nworkload:\n  trace: traces/t.jsonl\n")
    config = load_sim_config(good)
    assert config.duration_s == 30 and config.workload.trace == str(tmp_path / "traces" / "t.jsonl")
