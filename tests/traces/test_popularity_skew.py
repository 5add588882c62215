"""The popularity's spread measured on real routing and the generator's skew that matches it."""

from pathlib import Path

import numpy as np
import pytest

from traces.popularity_skew import (ESFT_POOLED_SPREAD, OLMOE_POOLED_SPREAD, generator_pooled_spread,
                                    generator_skew_for, log_load_spread)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ESFT = DATA / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"
OLMOE = DATA / "olmoe-counts" / "olmoe_mixtral_routing_counts.npz"
OLMOE_DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")


def test_the_spread_of_a_lognormal_load_is_its_sigma():
    rng = np.random.default_rng(0)
    assert log_load_spread(rng.lognormal(0.0, 0.7, size=(8, 4096))) == pytest.approx(0.7, abs=0.02)
    with pytest.raises(ValueError, match=r"\[L, E\]"):
        log_load_spread(np.ones(5))


def test_the_generator_s_pooled_mix_is_less_spread_than_its_skew_and_the_bisection_inverts_it():
    assert generator_pooled_spread(1.0) < 0.85, "four drifting domains mixed: less spread than one"
    skew = generator_skew_for(0.5)
    assert generator_pooled_spread(skew) == pytest.approx(0.5, abs=0.003)


def test_the_production_mix_skews_in_sim_scenarios_are_the_generator_s_for_the_measured_spreads():
    from sim.scenarios import SKEWS

    assert SKEWS["production-mix"][0] == pytest.approx(generator_skew_for(ESFT_POOLED_SPREAD), abs=0.002)
    assert SKEWS["production-mix-olmoe"][0] == pytest.approx(generator_skew_for(OLMOE_POOLED_SPREAD), abs=0.002)


@pytest.mark.skipif(not ESFT.is_file(), reason="../shared/data/esft-dsv2lite is absent")
def test_esft_s_four_tasks_pooled_have_the_stated_spread():
    with np.load(ESFT) as data:
        tasks = [name[:-len("_topk_ids")] for name in data.files if name.endswith("_topk_ids")]
        load = 0
        for task in tasks:
            ids = data[f"{task}_topk_ids"].astype(np.int64)
            layers = ids.shape[0]
            flat = (np.arange(layers)[:, None] * 64 + ids.reshape(layers, -1)).ravel()
            load = load + np.bincount(flat, minlength=layers * 64).reshape(layers, 64)
    assert len(tasks) == 4 and log_load_spread(load) == pytest.approx(ESFT_POOLED_SPREAD, abs=0.001)


@pytest.mark.skipif(not OLMOE.is_file(), reason="../shared/data/olmoe-counts is absent")
def test_olmoe_s_five_domains_pooled_have_the_stated_spread():
    with np.load(OLMOE) as data:
        load = sum(data[f"olmoe__expert_counts__{domain}"] for domain in OLMOE_DOMAINS)
    assert log_load_spread(load) == pytest.approx(OLMOE_POOLED_SPREAD, abs=0.001)
