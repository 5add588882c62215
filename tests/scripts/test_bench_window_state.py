"""The window-state bench (`scripts/bench_window_state.py`) on its quick settings: its figures are shares, the
window state is found more often the longer it lives, every returning prefix finds it when it never expires (the
synthetic sessions) or every one whose state was ever stored does (Mooncake), the synthetic sessions reach the
post's 98% at 180 s, the recompute design keeps no window state and no extra disk, the replay at arrival times agrees
with the simulation, and the lognormal family means what it says. No figure of a run is pinned; the Mooncake tests
skip where its trace is absent."""

import math
from statistics import NormalDist

import numpy as np
import pytest

from traces.request_trace import Request
from sim import SimConfig

NEVER_S = 3650 * 86400.0  # the config's largest window lifetime: nothing a run of at most a day stores expires


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench_window_state")


@pytest.fixture(scope="module")
def measured(bench) -> dict:
    return bench.measure(quick=True)


@pytest.fixture(scope="module")
def traffics(bench) -> dict:
    return bench.traffics(quick=True)


def _mooncake(traffics):
    if traffics["mooncake"] is None:
        pytest.skip("the Mooncake conversation trace is absent (../shared/data)")
    return traffics["mooncake"]


def test_every_hit_share_of_the_bench_lies_in_0_1(measured):
    for row in measured["designs"]:
        shares = [row["disk_hit_share"], row["recomputed_share"], row["flops_vs_full_recompute"],
                  row["window_found_lookups"], row["window_found_tokens"]]
        assert all(0.0 <= s <= 1.0 for s in shares if s is not None), row
    for view, sweep in measured["lifetimes"].items():
        assert all(0.0 <= p[key] <= 1.0 for p in sweep for key in ("lookups", "tokens")), view
    for view, figures in measured["families"].items():
        assert 0.0 <= figures["reachable"] <= 1.0, view
        never = figures["never_stored_inside_longer"] + figures["never_stored_on_partial"]
        assert never == round((1 - figures["reachable"]) * figures["lookups"]), view


def test_window_state_found_never_falls_as_its_lifetime_grows(bench, measured):
    assert list(bench.LIFETIMES_S) == sorted(bench.LIFETIMES_S)
    for view, sweep in measured["lifetimes"].items():
        for key in ("lookups", "tokens"):
            shares = [p[key] for p in sweep]
            assert shares == sorted(shares), (view, key, shares)


def test_the_synthetic_sessions_find_the_window_state_98_percent_of_the_time_at_180_s(bench, measured):
    at_180 = measured["lifetimes"]["synthetic"][bench.LIFETIMES_S.index(180.0)]
    assert at_180["lookups"] >= 0.98 and at_180["tokens"] >= 0.98
    memory = next(r for r in measured["designs"] if r["traffic"] == "synthetic" and r["design"] == "memory")
    assert memory["lifetime_s"] == 180.0
    assert memory["window_found_lookups"] >= 0.98 and memory["window_found_tokens"] >= 0.98


def test_with_a_lifetime_that_never_ends_the_synthetic_window_hit_equals_the_disk_hit(bench, traffics):
    row = bench.run_design(traffics["synthetic"], "memory", lifetime_s=NEVER_S)
    assert row["disk_hit_lookups"] > 0 and row["window_lookups"] == row["disk_hit_lookups"]
    assert row["window_found_lookups"] == 1.0 and row["window_found_tokens"] == 1.0
    gaps = bench.replay_gaps(traffics["synthetic"].gap_requests, traffics["synthetic"].config)
    assert bench.hit_shares(gaps, math.inf) == (1.0, 1.0)


def test_with_a_lifetime_that_never_ends_mooncake_finds_every_state_ever_stored(bench, measured, traffics):
    mooncake = _mooncake(traffics)
    row = bench.run_design(mooncake, "memory", lifetime_s=NEVER_S)
    at_180 = next(r for r in measured["designs"] if r["traffic"] == "mooncake" and r["design"] == "memory")
    assert row["window_found_lookups"] >= at_180["window_found_lookups"]
    assert row["window_found_tokens"] >= at_180["window_found_tokens"]
    gaps = bench.replay_gaps(bench.run_requests(mooncake.config), mooncake.config)
    ever_stored = float(np.isfinite(gaps.gap_s_N).mean())
    assert bench.hit_shares(gaps, math.inf)[0] == pytest.approx(ever_stored)
    assert row["window_found_lookups"] == pytest.approx(ever_stored, abs=0.01)  # replay at arrival times vs engine


@pytest.mark.parametrize("traffic", ["synthetic", "mooncake"], ids=["synthetic", "mooncake"])
def test_the_recompute_design_keeps_no_window_state_and_needs_no_extra_disk(measured, traffic):
    if traffic in measured["skipped"]:
        pytest.skip("the Mooncake conversation trace is absent (../shared/data)")
    rows = {r["design"]: r for r in measured["designs"] if r["traffic"] == traffic}
    recompute = rows["recompute"]
    assert recompute["window_lookups"] == 0 and recompute["window_found_lookups"] is None
    by_design = recompute["disk_bytes_needed_by_design"]
    assert by_design["recompute"] == by_design["memory"] < by_design["disk"]
    assert rows["disk"]["window_lookups"] == 0 and rows["disk"]["recomputed_share"] == 0.0
    assert rows["memory"]["window_lookups"] == rows["memory"]["disk_hit_lookups"]
    assert rows["disk"]["flops_vs_full_recompute"] <= rows["memory"]["flops_vs_full_recompute"]
    assert rows["memory"]["flops_vs_full_recompute"] <= recompute["flops_vs_full_recompute"] <= 1.0


def test_the_replay_at_arrival_times_agrees_with_the_simulated_window_hits_at_180_s(measured):
    for name, check in measured["check_at_180_s"].items():
        assert check["replayed"] == pytest.approx(check["simulated"], abs=0.02), name


def test_the_replay_measures_each_gap_from_the_last_store_of_the_lookups_last_hit_block(bench):
    # A stores its last full block 3 at 0 s; B hits blocks 1-3 at 100 s (gap 100 s); C hits block 1 only, which ended
    # no prompt (inside a longer one: never stored); E resends A, its hit ending on A's partial last block 10 (never
    # stored: the state is keyed by block 3); D, F, G hit nothing. Block 1 leads 4 of 7 requests: the shared head.
    requests = [Request(0.0, 3 * 512 + 10, 40, (1, 2, 3, 10)), Request(100.0, 4 * 512, 40, (1, 2, 3, 4)),
                Request(400.0, 2 * 512 + 276, 40, (1, 5, 6)), Request(500.0, 600, 40, (7, 8)),
                Request(600.0, 3 * 512 + 10, 40, (1, 2, 3, 10)), Request(700.0, 600, 40, (20, 21)),
                Request(800.0, 100, 40, (30,))]
    gaps = bench.replay_gaps(requests, SimConfig())
    assert gaps.head_blocks == 1
    assert gaps.gap_s_N.tolist() == [100.0, math.inf, math.inf]
    assert gaps.cached_N.tolist() == [3 * 512, 512, 3 * 512 + 9]  # a prompt's last token is always computed
    assert gaps.returning_N.tolist() == [True, False, True] and gaps.on_partial_N.tolist() == [False, False, True]
    assert gaps.reply_s_N[0] == pytest.approx(40 / 20.0)
    assert bench.hit_shares(gaps, 100.0) == (0.0, 0.0)  # alive while now < stored + lifetime
    assert bench.hit_shares(gaps, 180.0) == pytest.approx((1 / 3, 1536 / (1536 + 512 + 1545)))
    assert bench.hit_shares(gaps, math.inf, returning_only=True) == pytest.approx((1 / 2, 1536 / (1536 + 1545)))
    family = bench.family(gaps, returning_only=False)
    assert (family["never_stored_inside_longer"], family["never_stored_on_partial"]) == (1, 1)


@pytest.mark.parametrize("median_s", [10.0, 60.0, 150.0], ids=["10s", "60s", "150s"])
def test_the_lognormal_bound_puts_exactly_the_needed_share_of_gaps_under_the_lifetime(bench, median_s):
    for need in (0.9, 0.98):
        sigma = bench.max_sigma(median_s, need)
        under = NormalDist().cdf(math.log(bench.SEED_LIFETIME_S / median_s) / sigma)
        assert under == pytest.approx(need)
        assert bench.max_median(sigma, need) == pytest.approx(median_s)
    assert math.isnan(bench.max_sigma(median_s, bench.needed_share(0.95)))  # 98% of 95%: unreachable


def test_the_lognormal_fit_recovers_a_sampled_lognormal(bench):
    gap_s = np.random.default_rng(0).lognormal(math.log(40.0), 0.8, size=20_000)
    median, sigma = bench.lognormal_fit(gap_s)
    assert median == pytest.approx(40.0, rel=0.03) and sigma == pytest.approx(0.8, rel=0.05)


def test_the_mooncake_rows_are_skipped_when_its_trace_is_absent(bench, tmp_path, monkeypatch):
    config = tmp_path / "absent.yaml"
    config.write_text("duration_s: 3600\nworkload:\n  trace: no-such-trace.jsonl\n")
    monkeypatch.setattr(bench, "MOONCAKE", config)
    found = bench.traffics(quick=True)
    assert found["mooncake"] is None and found["synthetic"] is not None
