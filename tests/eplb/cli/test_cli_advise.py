"""`eplb advise` on a small shape (32 experts, 4 layers, EP8 and EP16): the recommended row is the best of the rows
it evaluated, every row's memory adds up to the card's, a row is what `eplb sim --capacity` reports for the same
layout and its imbalance what `eplb replay` gives on the same traffic (by hand, through the CLI), a layout whose
weights overflow the card is a row marked so, the recommendation's SGLang and TensorRT-LLM files are what those
engines load, and bad input is one line with exit 2."""

import json

import numpy as np
import pytest
import yaml

from sim.advice import AdviceSettings, POLICIES, advise, candidate_config, candidates, evaluate
from sim.config import SimConfig
from sim.engine.decode_balance import read_routing_trace
from sim.engine.load_imbalance import curve_loads, load_imbalance, trace_at_loads
from traces.synthetic import SyntheticConfig, generate_trace

EXPERTS, TOP_K, LAYERS = 32, 4, 4


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("advice") / "trace.npz"
    trace = generate_trace(SyntheticConfig(num_steps=160, num_layers=LAYERS, num_experts=EXPERTS, top_k=TOP_K,
                                           tokens_per_step=2048, seed=5))
    np.savez(path, counts=trace.counts_TLE)
    return path


def _settings(trace_path, **changes) -> AdviceSettings:
    base = SimConfig()
    model = base.model.model_copy(update={"num_routed_experts": EXPERTS, "top_k": TOP_K, "sliding_window_share": 0.0,
                                          **changes.pop("model", {})})
    balance = base.balance.model_copy(update={"routing_trace": str(trace_path), "trace_layers": LAYERS,
                                              "refit_every": 20, "window": 20, "work_limit": 0.5})
    base = base.model_copy(update={"model": model, "balance": balance})
    return AdviceSettings(base=base, ep_sizes=(8, 16), slots_per_card=(2, 4, 5), max_redundant=16, **changes)


@pytest.fixture(scope="module")
def advice(trace_path):
    settings = _settings(trace_path, load_tokens_per_s=1e6, price_per_card_hour=2.0)
    calls = []
    return settings, advise(settings, lambda done, total: calls.append((done, total))), calls


def test_the_candidates_hold_every_expert_and_at_most_the_redundancy_allowed(trace_path):
    assert candidates(_settings(trace_path)) == [(8, 4), (8, 5), (16, 2)]
    assert candidates(_settings(trace_path, redundant=(8,))) == [(8, 5)]


def test_the_recommended_row_is_the_best_it_evaluated_and_every_row_adds_up(advice):
    settings, result, calls = advice
    rows = result["rows"]
    assert calls == [(1, 3), (2, 3), (3, 3)] and len(rows) == 3
    rates = [row["cpsat"]["tokens_per_s_per_card"] for row in rows]
    assert result["recommended"] is rows[0] and rates == sorted(rates, reverse=True) and rates[0] > 0
    hbm = 80.0  # the H800's
    for row in rows:
        memory = row["memory_gb"]
        assert memory["hbm"] == hbm
        assert memory["replicated"] + memory["experts"] + memory["kv"] + memory["reserved"] + memory["free"] == \
            pytest.approx(hbm, rel=1e-12)
        assert memory["free"] >= -1e-9 and memory["experts"] == pytest.approx(
            row["slots_per_card"] * settings.base.model.expert_weight_bytes() / 1e9)
        assert row["redundant_experts"] == row["cards"] * row["slots_per_card"] - EXPERTS
        chosen = row["cpsat"]
        assert chosen["bound_by"] in ("TPOT", "memory", "batch cap")
        assert chosen["tpot_ms"] <= settings.base.capacity.tpot_slo_ms + 1e-9
        per_hour = chosen["tokens_per_s_per_card"] * 3600
        assert row["usd_per_million_tokens"] == pytest.approx(2.0 * 1e6 / per_hour)
        assert row["cards_needed"] % row["cards"] == 0 and row["cards_needed"] * chosen["tokens_per_s_per_card"] >= 1e6
    # the redundant slots buy balance: at EP8 a spare slot a card lowers cpsat's imbalance
    by_shape = {(row["cards"], row["slots_per_card"]): row for row in rows}
    assert by_shape[(8, 5)]["cpsat"]["imbalance"] < by_shape[(8, 4)]["cpsat"]["imbalance"]


def test_a_row_is_what_sim_capacity_and_replay_report_by_hand(advice, tmp_path, run_eplb_here):
    settings, result, _ = advice
    best = result["recommended"]
    cards, slots = best["cards"], best["slots_per_card"]
    config = candidate_config(settings, cards, slots, POLICIES[0])
    config_path = tmp_path / "candidate.yaml"
    config_path.write_text(yaml.safe_dump(json.loads(config.model_dump_json())))
    capacity = run_eplb_here("sim", "--config", str(config_path), "--capacity", "--json")
    assert capacity.returncode == 0, capacity.stderr
    decode = json.loads(capacity.stdout)["decode"]
    assert decode["tokens_per_s_per_card"] == pytest.approx(best["cpsat"]["tokens_per_s_per_card"], rel=1e-9)
    assert decode["imbalance"] == pytest.approx(best["cpsat"]["imbalance"], rel=1e-9)
    # the imbalance at the top load: the trace pooled to it, replayed by `eplb replay` with the same refits
    top = trace_at_loads(read_routing_trace(config), cards, curve_loads(config, "decode"), TOP_K, config.seed)[0]
    trace_file = tmp_path / "top.npz"
    np.savez(trace_file, counts=top)
    balance = config.balance
    window = min(balance.window, top.shape[0] // 2)
    replay = run_eplb_here("replay", "--trace", str(trace_file), "--gpus", str(cards), "--slots-per-gpu", str(slots),
                           "--gpus-per-node", str(cards if cards % 8 else 8), "--policy", "cpsat", "--routing",
                           "live", "--every", str(balance.refit_every), "--window", str(window), "--work-limit",
                           str(balance.work_limit), "--forecast", "none", "--patch-every", "0", "--json")
    assert replay.returncode == 0, replay.stderr
    curve = load_imbalance(config, cards, slots, "decode")
    assert json.loads(replay.stdout)["imbalance_mean"] == pytest.approx(curve.measured[-1], rel=1e-9)  # held-out


def test_a_layout_whose_weights_overflow_the_card_is_a_row_marked_so(trace_path):
    settings = _settings(trace_path, model={"weight_bytes": 8.0})  # every weight 8 bytes: far over 80 GB a card
    row = evaluate(settings, 8, 4)
    assert row["cpsat"]["tokens_per_s_per_card"] == 0 and row["cpsat"]["bound_by"] == "weights"
    assert row["memory_gb"]["free"] < 0 and row["usd_per_million_tokens"] is None


def test_the_recommendation_is_written_for_sglang_and_tensorrt_llm(trace_path, tmp_path, run_eplb_here,
                                                                      tensorrt_llm_accepts):
    model = tmp_path / "model.yaml"
    model.write_text(f"model: {{num_routed_experts: {EXPERTS}, top_k: {TOP_K}, sliding_window_share: 0.0}}\n")
    sglang, trtllm = tmp_path / "sglang.json", tmp_path / "moe_load_balancer.yaml"
    result = run_eplb_here("advise", "--trace", str(trace_path), "--model", str(model), "--ep-sizes", "8",
                           "--slots-per-gpu", "4,5", "--layers", str(LAYERS), "--refit-every", "20", "--window", "20",
                           "--sglang-out", str(sglang), "--sglang-num-layers", str(LAYERS + 1),
                           "--sglang-first-moe-layer", "1", "--trtllm-out", str(trtllm), "--trtllm-layers",
                           f"1-{LAYERS}", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    slots = report["recommended"]["cards"] * report["recommended"]["slots_per_card"]
    rows = json.loads(sglang.read_text())["physical_to_logical_map"]
    assert report["sglang_rows"] == len(rows) == LAYERS + 1 and all(len(row) == slots for row in rows)
    assert all(sorted(set(row)) == list(range(EXPERTS)) for row in rows)  # every expert placed in every layer
    ranks = tensorrt_llm_accepts(yaml.safe_load(trtllm.read_text()), report["recommended"]["cards"], EXPERTS,
                                 range(1, LAYERS + 1))
    assert sorted(ranks) == list(range(1, LAYERS + 1)) and report["trtllm_out"] == str(trtllm)
    refused = run_eplb_here("advise", "--trace", str(trace_path), "--model", str(model), "--ep-sizes", "8",
                            "--sglang-out", str(sglang), "--sglang-num-layers", "61", "--sglang-first-moe-layer", "3")
    assert refused.returncode == 2 and "--sglang-first-moe-layer" in refused.stderr


@pytest.mark.parametrize("argv, message", [
    (["--ep-sizes", "0"], "argument --ep-sizes"),
    (["--slots-per-gpu", "2,x"], "argument --slots-per-gpu"),
    (["--card", "B300"], "--card B300 is not a hardware profile"),
    (["--tokens-per-user", "20", "--tpot-ms", "50"], "not allowed with argument"),
    (["--ep-sizes", "8", "--slots-per-gpu", "2"], "holds the model's 256 experts"),
    (["--trace", "missing.npz"], "missing.npz"),
], ids=["ep-size-0", "slots-not-a-number", "unknown-card", "two-targets", "no-candidate", "missing-trace"])
def test_bad_input_is_one_line_and_exit_2(run_eplb_here, argv, message):
    result = run_eplb_here("advise", *argv)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
