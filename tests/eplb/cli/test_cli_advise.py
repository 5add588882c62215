"""`eplb advise` on a small shape (32 experts in 8 groups, 4 layers, EP8 and EP16): the recommended row is the best of
the rows it evaluated, every row's memory adds up to the card's, a row (with node limits too) is what `eplb sim
--capacity` reports for the same layout and its imbalance what `eplb replay` gives on the same traffic (by hand,
through the CLI), prefill rows likewise, a layout whose weights overflow the card is a row marked so, each engine is
told the row's node limits (vLLM's line the best layout vLLM can run), the recommendation's SGLang and TensorRT-LLM
files are what those engines load (a node-limited one every group on one node), and bad input is one line with
exit 2."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.advice import (AdviceSettings, POLICIES, advise, advise_prefill, best_for_vllm, candidate_config, candidates,
                        engine_settings, evaluate, prefill_config)
from sim.advice_range import ties
from sim.capacity import decode_capacity
from sim.scenarios import cases
from sim.config import SimConfig
from sim.engine.decode_balance import read_routing_trace
from sim.engine.load_imbalance import curve_loads, load_imbalance, trace_at_loads
from traces.synthetic import SyntheticConfig, generate_trace

EXPERTS, TOP_K, LAYERS = 32, 4, 4
V2_LITE = Path(__file__).resolve().parents[3] / "sim" / "configs" / "deepseek-v2-lite.yaml"
ESFT = Path(__file__).resolve().parents[4] / "shared" / "data" / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"


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
    search = {"ep_sizes": (8, 16), "slots_per_card": (2, 4, 5), "max_redundant": 16, **changes}
    return AdviceSettings(base=base, **search)


@pytest.fixture(scope="module")
def advice(trace_path):
    settings = _settings(trace_path, load_tokens_per_s=1e6, price_per_card_hour=2.0)
    calls = []
    return settings, advise(settings, lambda done, total: calls.append((done, total))), calls


def test_the_candidates_hold_every_expert_and_at_most_the_redundancy_allowed(trace_path):
    # node limits only where they mean something: EP16 is two nodes of 8 (8 groups: 4 a node); EP8 is one node
    assert candidates(_settings(trace_path)) == [(8, 4, False), (8, 5, False), (16, 2, False), (16, 2, True)]
    assert candidates(_settings(trace_path, redundant=(8,))) == [(8, 5, False)]
    assert candidates(_settings(trace_path, node_limits=(True,))) == [(16, 2, True)]
    assert candidates(_settings(trace_path, node_limits=(True,), model={"expert_groups": 1})) == []  # 1 % 2 nodes


def test_the_recommended_row_is_the_best_it_evaluated_and_every_row_adds_up(advice):
    settings, result, calls = advice
    rows = result["rows"]
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)] and len(rows) == 4
    readings = result["recommended"]["metrics"]  # the pick's imbalance read every way at its load, from the trace
    assert {"card_step", "node_step", "card_window_10", "group_step"} <= set(readings)
    assert readings["card_step"]["noise_floor"] == pytest.approx(result["recommended"]["cpsat"]["noise_floor"], rel=0.05)
    rates = [row["cpsat"]["tokens_per_s_per_card"] for row in rows]
    assert result["recommended"] is rows[0] and rates == sorted(rates, reverse=True) and rates[0] > 0
    # vLLM's pick: the best row whose node limits are vLLM's at its size (EP16 is two nodes: limited; EP8 one: none)
    runnable = [row for row in rows if row["node_limits"] == (row["cards"] == 16)]
    assert result["vllm_recommended"] is runnable[0]
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
    by_shape = {(row["cards"], row["slots_per_card"], row["node_limits"]): row for row in rows}
    assert by_shape[(8, 5, False)]["cpsat"]["imbalance"] < by_shape[(8, 4, False)]["cpsat"]["imbalance"]


@pytest.mark.parametrize("which", ["recommended", "node-limited"])
def test_a_row_is_what_sim_capacity_and_replay_report_by_hand(advice, tmp_path, run_eplb_here, which):
    settings, result, _ = advice
    best = result["recommended"] if which == "recommended" else \
        next(row for row in result["rows"] if row["node_limits"])
    cards, slots, limited = best["cards"], best["slots_per_card"], best["node_limits"]
    config = candidate_config(settings, cards, slots, POLICIES[0], limited)
    config_path = tmp_path / "candidate.yaml"
    config_path.write_text(yaml.safe_dump(json.loads(config.model_dump_json())))
    capacity = run_eplb_here("sim", "--config", str(config_path), "--capacity", "--scenarios", "none",
                             "--json")
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
                           str(balance.work_limit), "--forecast", "none", "--patch-every", "0", "--json",
                           *(["--groups", "8", "--nodes-per-group", "1"] if limited else []))
    assert replay.returncode == 0, replay.stderr
    curve = load_imbalance(config, cards, slots, "decode")
    assert json.loads(replay.stdout)["imbalance_mean"] == pytest.approx(curve.measured[-1], rel=1e-9)  # held-out


def test_prefill_instances_are_ranked_with_node_limits_where_they_limit_and_a_row_is_sim_capacitys(
        trace_path, tmp_path, run_eplb_here):
    settings = _settings(trace_path, prefill_nodes=(1, 2), prefill_redundant=(0,))
    settings = dataclasses.replace(settings, base=settings.base.model_copy(update={
        "capacity": settings.base.capacity.model_copy(update={"ttft_slo_s": 0.5, "prompt_tokens": 2048})}))
    calls = []
    rows = advise_prefill(settings, lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    assert sorted((row["nodes"], row["node_limits"]) for row in rows) == [(1, False), (2, False), (2, True)]
    rates = [row["tokens_per_s_per_card"] for row in rows]
    assert rates == sorted(rates, reverse=True) and rates[-1] > 0
    limited = next(row for row in rows if row["node_limits"])
    config = prefill_config(settings, 2, 0, True)
    config_path = tmp_path / "prefill.yaml"
    config_path.write_text(yaml.safe_dump(json.loads(config.model_dump_json())))
    capacity = run_eplb_here("sim", "--config", str(config_path), "--capacity", "--scenarios", "none",
                             "--json")
    assert capacity.returncode == 0, capacity.stderr
    prefill = json.loads(capacity.stdout)["prefill"]
    assert prefill["tokens_per_s_per_card"] == pytest.approx(limited["tokens_per_s_per_card"], rel=1e-9)
    assert prefill["imbalance"] == pytest.approx(limited["imbalance"], rel=1e-9)


def test_each_engine_is_told_the_node_limits_of_the_row():
    layout = {"cards": 64, "slots_per_card": 5, "redundant_experts": 64}
    limited = engine_settings({**layout, "node_limits": True}, 256, 8, 8)
    assert "--eplb-algorithm deepseek_hierarchical" in limited["sglang"]
    assert "--groups 8 --nodes-per-group 1" in limited["tensorrt_llm"] and "groups on one node" not in limited["vllm"]
    free = engine_settings({**layout, "node_limits": False}, 256, 8, 8)
    assert "--eplb-algorithm deepseek " in free["sglang"] and "--groups" not in free["tensorrt_llm"]
    assert "keeps each of the 8 expert groups on one node at 8 nodes" in free["vllm"]  # vLLM's own rule there
    far = {"cards": 72, "slots_per_card": 5, "redundant_experts": 104, "node_limits": False,
           "cpsat": {"tokens_per_s_per_card": 2240.0}}
    assert "keeps each" not in engine_settings(far, 256, 8, 8)["vllm"]  # 8 groups, 9 nodes: vLLM's global policy
    # the best row runs in vLLM only as its node-limited row, which loses: vLLM's line is for the best it can run
    rows = [{**layout, "node_limits": False, "cpsat": {"tokens_per_s_per_card": 2259.0}}, far,
            {**layout, "node_limits": True, "cpsat": {"tokens_per_s_per_card": 1945.0}}]
    assert best_for_vllm(rows, 8, 8) is far and best_for_vllm(rows[:1], 8, 8) is None
    vllm = engine_settings(rows[0], 256, 8, 8, far)["vllm"]
    assert vllm.startswith("EPLB_VLLM_POLICY=cpsat vllm serve MODEL --data-parallel-size 72 ")
    assert "vLLM's best is 72 GPUs x 5 slots, 2,240 tokens/s per GPU" in vllm


def test_a_node_limited_recommendation_is_written_with_every_group_on_one_node(trace_path, tmp_path, run_eplb_here):
    model = tmp_path / "model.yaml"
    model.write_text(f"model: {{num_routed_experts: {EXPERTS}, top_k: {TOP_K}, sliding_window_share: 0.0}}\n")
    sglang = tmp_path / "sglang.json"
    result = run_eplb_here("advise", "--trace", str(trace_path), "--model", str(model), "--ep-sizes", "16",
                           "--slots-per-gpu", "3", "--node-limits", "groups", "--layers", str(LAYERS),
                           "--refit-every", "20", "--window", "20", "--sglang-out", str(sglang),
                           "--sglang-num-layers", str(LAYERS + 1), "--sglang-first-moe-layer", "1", "--scenarios",
                           "none", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [row["node_limits"] for row in report["rows"]] == [True] and report["recommended"]["node_limits"]
    assert "deepseek_hierarchical" in report["engines"]["sglang"]
    group_size, slots_a_node = EXPERTS // 8, 8 * 3
    for row in json.loads(sglang.read_text())["physical_to_logical_map"][1:]:  # the MoE layers
        node_of_group = {}
        for slot, expert in enumerate(row):
            assert node_of_group.setdefault(expert // group_size, slot // slots_a_node) == slot // slots_a_node


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
                           f"1-{LAYERS}", "--trtllm-mtp-layers", str(LAYERS + 1), "--scenarios", "none", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    slots = report["recommended"]["cards"] * report["recommended"]["slots_per_card"]
    rows = json.loads(sglang.read_text())["physical_to_logical_map"]
    assert report["sglang_rows"] == len(rows) == LAYERS + 1 and all(len(row) == slots for row in rows)
    assert all(sorted(set(row)) == list(range(EXPERTS)) for row in rows)  # every expert placed in every layer
    ranks = tensorrt_llm_accepts(yaml.safe_load(trtllm.read_text()), report["recommended"]["cards"], EXPERTS,
                                 range(1, LAYERS + 2))
    assert sorted(ranks) == list(range(1, LAYERS + 2)) and report["trtllm_out"] == str(trtllm)
    assert report["trtllm_mtp_stand_ins"] == {str(LAYERS + 1): LAYERS}, "the MTP layer holds the last layer's rows"
    refused = run_eplb_here("advise", "--trace", str(trace_path), "--model", str(model), "--ep-sizes", "8",
                            "--sglang-out", str(sglang), "--sglang-num-layers", "61", "--sglang-first-moe-layer", "3")
    assert refused.returncode == 2 and "--sglang-first-moe-layer" in refused.stderr


def test_a_row_says_what_its_replay_rests_on_and_one_that_scored_too_few_steps_is_left_out(tmp_path):
    path = tmp_path / "short.npz"
    np.savez(path, counts=generate_trace(SyntheticConfig(num_steps=100, num_layers=LAYERS, num_experts=EXPERTS,
                                                         top_k=TOP_K, tokens_per_step=2048, seed=5)).counts_TLE)
    settings = _settings(path, ep_sizes=(8, 16), slots_per_card=(2, 4), node_limits=(False,))
    result = advise(settings)
    by_cards = {row["cards"]: row for row in result["rows"]}
    # EP8 reads the trace's steps as they are (2,048 tokens: 256 a GPU); EP16 pools two into one
    assert by_cards[8]["cpsat"]["basis"] == {"steps": 100, "window": 20, "refits": 4, "scored_steps": 80}
    assert by_cards[16]["cpsat"]["basis"] == {"steps": 50, "window": 20, "refits": 2, "scored_steps": 30}
    assert by_cards[8]["answerable"] and not by_cards[16]["answerable"], "30 scored steps are under 2 windows of 20"
    assert "fewer than 40" in by_cards[16]["why"]
    assert result["recommended"] is by_cards[8] and result["min_scored_steps"] == 40
    assert result["unanswered"] == [{"cards": 16, "slots_per_card": 2, "node_limits": False,
                                     "why": by_cards[16]["why"], "scored_steps": 30}]


def test_a_layout_ties_the_pick_when_it_matches_it_in_any_case():
    def row(cards: int, rate: float) -> dict:
        return {"cards": cards, "slots_per_card": 4, "node_limits": False, "cpsat": {"tokens_per_s_per_card": rate}}

    pick, close, behind = row(8, 100.0), row(16, 99.0), row(32, 97.0)
    # central: the pick leads both; case 2: the close layout beats it; the one behind never comes within 0.2%
    found = ties([pick, close, behind], [[100.0, 90.0], [99.0, 91.0], [97.0, 89.0]], "cpsat")
    assert found == [{"cards": 16, "slots_per_card": 4, "node_limits": False, "wins_in": 1, "cases": 3}]
    assert ties([pick, row(16, 99.9)], [[100.0], [98.0]], "cpsat")[0]["wins_in"] == 1, "within 0.2%: a match"


def test_the_current_layout_gets_its_row_the_pick_s_gain_as_a_range_and_the_break_even(trace_path):
    cases_run = cases(("production-mix",), ("off",), 1)
    settings = _settings(trace_path, ep_sizes=(8,), slots_per_card=(4, 5), node_limits=(False,), current=(16, 2, False),
                         cases=tuple(cases_run))
    result = advise(settings)
    best, current = result["recommended"], result["current"]
    assert (current["cards"], current["slots_per_card"]) == (16, 2) and current not in result["rows"]
    pick_rate, current_rate = best["cpsat"]["tokens_per_s_per_card"], current["cpsat"]["tokens_per_s_per_card"]
    gain = result["gain_over_current"]
    assert gain["central"] == pytest.approx(pick_rate / current_rate - 1)
    pick_case = best["range"]["cases"][0]["tokens_per_s_per_card"]
    current_case = current["range"]["cases"][0]["tokens_per_s_per_card"]
    assert (gain["min"], gain["max"]) == tuple(sorted((gain["central"], pick_case / current_case - 1)))
    assert best["range"]["cases"][0]["case"] == "production-mix, bursts off, seed 0"
    even = result["break_even_imbalance"]
    if even is not None:  # the current layout at that imbalance serves what the pick does
        config = candidate_config(settings, 16, 2, POLICIES[0], False)
        assert 1.0 <= even <= current["cpsat"]["imbalance"]
        assert decode_capacity(config, even)["tokens_per_s_per_card"] == pytest.approx(pick_rate, rel=0.02)
    else:
        config = candidate_config(settings, 16, 2, POLICIES[0], False)
        assert decode_capacity(config, 1.0)["tokens_per_s_per_card"] < pick_rate, "not even balanced"


@pytest.mark.skipif(not ESFT.is_file(), reason="../shared/data/esft-dsv2lite is absent")
def test_esft_s_top_k_log_with_deepseek_v2_lite_is_answered_or_says_which_rows_it_cannot(run_eplb_here):
    result = run_eplb_here("advise", "--trace", str(ESFT), "--tokens-per-step", "256", "--model",
                           str(V2_LITE), "--ep-sizes", "8,16", "--slots-per-gpu", "8,9,5",
                           "--layers", "2", "--window", "8", "--refit-every", "8", "--scenarios", "none", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "tasks intent, law, summary, translation interleaved" in report["settings"]["trace_mix"]
    assert report["settings"]["trace_layers"] == 2
    for row in report["rows"]:
        assert row["answerable"] == (row["cpsat"]["basis"]["scored_steps"] >= 16)
    answered = [row for row in report["rows"] if row["answerable"]]
    assert report["recommended"] == (answered[0] if answered else None)
    assert len(report["unanswered"]) == len(report["rows"]) - len(answered)
    text = run_eplb_here("advise", "--trace", str(ESFT), "--tokens-per-step", "256", "--model",
                         str(V2_LITE), "--ep-sizes", "8,16", "--slots-per-gpu", "8,9,5",
                         "--layers", "2", "--window", "8", "--refit-every", "8", "--scenarios", "none").stdout
    if report["unanswered"]:
        assert text.count("not answered, left out of the pick") == 1


def test_a_search_that_serves_nothing_writes_no_engine_file_and_says_why(trace_path, tmp_path, run_eplb_here):
    model = tmp_path / "model.yaml"
    model.write_text(f"model: {{num_routed_experts: {EXPERTS}, top_k: {TOP_K}, sliding_window_share: 0.0}}\n")
    sglang = tmp_path / "sglang.json"
    result = run_eplb_here("advise", "--trace", str(trace_path), "--model", str(model), "--ep-sizes", "8",
                           "--slots-per-gpu", "4", "--layers", "2", "--window", "20", "--refit-every", "20",
                           "--tpot-ms", "0.001", "--scenarios", "none", "--sglang-out", str(sglang),
                           "--sglang-num-layers", str(LAYERS), "--sglang-first-moe-layer", "0")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and not sglang.exists()
    assert "within the TPOT target" in result.stderr and "no --sglang-out or --trtllm-out file was written" in \
        result.stderr


@pytest.mark.parametrize("argv, message", [
    (["--ep-sizes", "0"], "argument --ep-sizes"),
    (["--slots-per-gpu", "2,x"], "argument --slots-per-gpu"),
    (["--card", "B300"], "--card B300 is not a hardware profile"),
    (["--tokens-per-user", "20", "--tpot-ms", "50"], "not allowed with argument"),
    (["--ep-sizes", "8", "--slots-per-gpu", "2"], "holds the model's 256 experts"),
    (["--trace", "missing.npz"], "missing.npz"),
    (["--node-limits", "none,nodes"], "argument --node-limits: expected one of none, groups, got nodes"),
    (["--ep-sizes", "8", "--slots-per-gpu", "32", "--node-limits", "groups"], "and takes node limits"),
    (["--current", "4x2"], "--current 4x2 holds 8 expert slots, fewer than the model's 256"),
    (["--current", "144"], "argument --current: expected GPUsxSLOTS"),
    (["--ep-sizes", ",".join(map(str, range(1, 257))), "--slots-per-gpu", ",".join(map(str, range(1, 101))),
      "--max-redundant", "100000"], "layouts to replay, more than 400"),
    (["--scenarios", "busy-day"], "unknown traffic scenario 'busy-day'"),
    (["--tokens-per-step", "256"], "read top-k id logs"),
    (["--refit-every", "1", "--window", "1"], "traffic cases, a refit every 1 steps, takes about"),
    (["--ttft-s", "2", "--prefill-nodes", "128"], "argument --prefill-nodes"),
], ids=["ep-size-0", "slots-not-a-number", "unknown-card", "two-targets", "no-candidate", "missing-trace",
        "node-limits-unknown", "node-limits-on-one-node", "current-too-small", "current-not-a-layout",
        "too-many-layouts", "unknown-scenario", "top-k-flag-on-counts", "case-reruns-over-budget",
        "prefill-instance-too-large"])
def test_bad_input_is_one_line_and_exit_2(run_eplb_here, argv, message):
    result = run_eplb_here("advise", *argv)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
