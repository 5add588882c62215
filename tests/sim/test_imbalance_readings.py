"""Every reading of a decode unit's imbalance at one load, and an open anchor's definitions side by side."""

import numpy as np
import pytest
import yaml

import sim.anchor_cases
from sim.anchor_cases import open_definitions
from sim.config import SimConfig
from sim.engine.decode_balance import (group_cluster, served_scores, synthetic_counts,
                                       synthetic_counts_with_expectation)
from placement.yardsticks import expectation_oracle, granularity_bound
from sim.imbalance_readings import ORACLE_EVERY, decode_readings, read_decode_unit
from sim.validation import load_anchors
from traces.synthetic import SyntheticConfig, generate_trace

SMALL = {"model": {"sliding_window_share": 0.0},
         "cluster": {"decode_cards": 16},
         "balance": {"policy": "deepseek", "layers": 2, "steps": 40, "refit_every": 20, "window": 20}}


def test_the_readings_are_the_named_metrics_of_the_served_steps_at_that_load():
    config = SimConfig.model_validate(SMALL)
    readings = decode_readings(config, 32, steps=120)
    served = config.model_copy(update={"balance": config.balance.model_copy(update={"steps": 140})})
    counts = synthetic_counts(served, 16, 32)
    scores = served_scores(served, 16, config.decode_slots_per_card, counts)[0]
    assert scores.imbalance_TL.shape[0] == 120
    assert readings["card_step"]["value"] == pytest.approx(scores.imbalance_TL.mean())
    assert readings["card_step"]["rows"] == 120 * 2
    assert readings["card_window_100"]["rows"] == 2 and readings["card_window_1000"]["value"] is None
    assert readings["node_step"]["value"] <= readings["card_step"]["value"], "two nodes of 8 cards"
    assert readings["group_step"]["definition"].endswith("8 contiguous groups)")


def test_the_yardsticks_beside_the_readings_are_the_served_steps_own():
    config = SimConfig.model_validate(SMALL)
    found = read_decode_unit(config, 32, steps=120).yardsticks
    served = config.model_copy(update={"balance": config.balance.model_copy(update={"steps": 140})})
    counts, expected = synthetic_counts_with_expectation(served, 16, 32)
    cluster = group_cluster(config, 16, config.decode_slots_per_card)
    scores = served_scores(served, 16, config.decode_slots_per_card, counts)[0]
    assert found["in_batch_bound"] == pytest.approx(scores.lower_bound_TL.mean())
    assert found["granularity_from"] == "expected load"
    assert found["granularity_bound"] == pytest.approx(granularity_bound(expected[20:].reshape(-1, 256), cluster))
    oracle = expectation_oracle(counts[20:], expected[20:], cluster, "deepseek", "live", ORACLE_EVERY, {})
    assert found["expectation_oracle"] == pytest.approx(oracle.imbalance_TL.mean())


def test_with_a_routing_trace_the_readings_are_its_own_steps_at_that_load(tmp_path):
    trace = generate_trace(SyntheticConfig(num_steps=60, num_layers=2, num_experts=256, top_k=8,
                                           tokens_per_step=16 * 32, seed=1)).counts_TLE
    np.save(tmp_path / "r.npy", trace)
    balance = {**SMALL["balance"], "routing_trace": str(tmp_path / "r.npy")}
    config = SimConfig.model_validate({**SMALL, "balance": balance})
    found = read_decode_unit(config, 32)
    readings = found.metrics
    assert readings["card_step"]["rows"] == (60 - 20) * 2, "the trace's own 60 steps, a first window of 20 fitted"
    assert readings["card_window_100"]["value"] is None and "40 steps scored" in readings["card_window_100"]["why"]
    assert found.yardsticks["expectation_oracle"] is None and "no expected load" in found.yardsticks["oracle_why"]
    assert "blocks of 100 steps" in found.yardsticks["granularity_from"]


def test_an_open_anchor_reads_every_definition_with_its_range(tmp_path, monkeypatch):
    monkeypatch.setattr(sim.anchor_cases, "ANCHOR_SEEDS", 1)
    small = {**SMALL, "balance": {**SMALL["balance"], "reading_steps": 100}}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    anchor = {"name": "open-row", "role": "open", "metric": "unstated", "published": 1.09, "unit": "max / mean",
              "source": "a post", "conditions": "none named", "config": "small.yaml",
              "measure": {"kind": "decode_imbalance", "scenarios": ["production-mix"]}}
    path = tmp_path / "anchors.yaml"
    path.write_text(yaml.safe_dump({"anchors": [anchor]}))
    found = open_definitions(load_anchors(path)[0], path)
    assert found["cases"] == 2, "production-mix, bursts on and off, one seed"
    definitions = found["definitions"]
    assert {"card_step", "node_step", "card_window_10", "card_window_100", "group_step"} <= set(definitions)
    for reading in definitions.values():
        assert reading["min"] <= reading["central"] <= reading["max"] and reading["noise_floor"] >= 1.0
