"""How often a returning prompt finds its sliding-window state, on the Mooncake conversation trace and on the
synthetic sessions, and the three sliding-window designs compared on both.

1. Designs: each traffic through the request-level simulator (`sim.run_simulation`, what `eplb sim` runs) once per
   `cache.window_design` (disk: the window stored with every prefix block; memory: kept in host memory for
   `cache.window_lifetime_s`, the last 128 tokens recomputed on a miss; recompute: never kept). Per run: the disk hit
   share of input tokens, the lookups that hit the disk and the share of them (and of their cached tokens) that find
   the window state, the tokens computed again, prefill decoder FLOPs against full recompute, and the disk needed.
2. Gaps: the same requests replayed through the engine's cache rules without the engine, at arrival times
   (`replay_gaps`). A prompt's window state is stored under its last full block when it is served; a later prompt
   whose disk hit ends at that block looks it up (`sim.engine.stages.Simulation._look_up_caches`). The gap of a
   lookup is the time since that key was last stored (infinite when no earlier prompt ended there); the state is
   found iff gap < lifetime, so the hit share at any lifetime is a count over the gaps, no simulation needed. Gaps
   are also given for the returning turns alone: lookups whose hit runs past the prefix most requests share (the
   Mooncake trace's first block, a system prompt), i.e. back into a conversation's own history.
3. The think-time family: the hit share at lifetime L is (share of lookups whose state was ever stored) x (share of
   their gaps under L). For >= 98% at 180 s, the share of gaps under 180 s must be at least 0.98 over the first;
   for lognormal gaps of median m and log-sd sigma that is sigma <= ln(180 / m) / z, z the normal quantile of it.

The decode placement policy is set to "none" in every run: prefill and the caches run before decode and never wait
on it, so no figure here depends on it, and the cpsat replay would add ~10 s a run.

Usage: python scripts/bench_window_state.py [--quick] [--json]
"""

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from eplb.cli.main import OneLineParser
from sim import SimConfig, load_sim_config, run_simulation
from sim.engine.kv_cache import PrefixCache
from sim.workload import TYPICAL_OUTPUT_TOKENS_PER_S, synthetic_requests, trace_requests
from traces.request_trace import Request

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "sim" / "configs" / "mooncake-conversation.yaml"
DESIGNS = ("disk", "memory", "recompute")
LIFETIMES_S = (60.0, 180.0, 300.0, 600.0, 1800.0, math.inf)
SEED_LIFETIME_S = 180.0  # the V4.1 post's window lifetime in host memory
SEED_HIT = 0.98  # the hit share the post reports at that lifetime
QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.98)
MEDIANS_S = (5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 150.0)  # the generic family's rows
# The synthetic sessions: the generator's default classes and think times (exponential, mean chat 20 s, agent 3 s),
# at a rate 4 prefill nodes serve without queueing, so the gaps are the workload's own.
SESSIONS = {"duration_s": 600.0, "workload": {"synthetic": {"sessions_per_s": 2.0}}, "cluster": {"prefill_nodes": 4}}
RUN_S = {"mooncake": (3600.0, 240.0), "synthetic": (600.0, 100.0)}  # simulated arrivals: full run, --quick
SYNTHETIC_GAP_S = (3600.0, 900.0)  # arrivals the gap analysis generates for the synthetic sessions: full, --quick


@dataclass(frozen=True)
class Traffic:
    """One traffic: the config its design runs use, and the requests of its gap analysis."""

    name: str
    config: SimConfig
    gap_requests: list[Request]


@dataclass(frozen=True)
class Gaps:
    """Every lookup that hit the persistent tier in a replay at arrival times. N: lookups."""

    gap_s_N: np.ndarray  # float: seconds since the window state of the lookup's last hit block was stored; inf: never
    cached_N: np.ndarray  # int: tokens the lookup found on disk
    returning_N: np.ndarray  # bool: the hit runs past the prefix most requests share (a conversation's own history)
    reply_s_N: np.ndarray  # float: the storing prompt's reply at TYPICAL_OUTPUT_TOKENS_PER_S; nan when never stored
    on_partial_N: np.ndarray  # bool: never stored, and the hit ends on a block no prompt held in full (the partial
    # last block of an earlier prompt: the same prompt sent again); never stored and False: it ends inside an earlier,
    # longer prompt (a branch of a conversation, or a shared document), where no window state was kept
    requests: int
    head_blocks: int  # leading blocks most requests share


def for_caches(config: SimConfig, **cache) -> SimConfig:
    """`config` with decode placement "none" (see the module docstring) and `cache` fields replaced."""
    return config.model_copy(update={"balance": config.balance.model_copy(update={"policy": "none"}),
                                     "cache": config.cache.model_copy(update=cache)})


def traffics(quick: bool) -> dict[str, Traffic | None]:
    """The two traffics; "mooncake" is None when its trace file is absent."""
    synthetic = for_caches(SimConfig.model_validate(SESSIONS).model_copy(
        update={"duration_s": RUN_S["synthetic"][quick]}))
    workload = synthetic.workload.synthetic
    out: dict[str, Traffic | None] = {"synthetic": Traffic("synthetic", synthetic, synthetic_requests(
        workload, SYNTHETIC_GAP_S[quick], synthetic.cache.block_tokens, synthetic.seed))}
    mooncake = load_sim_config(MOONCAKE)
    out["mooncake"] = None
    if Path(mooncake.workload.trace).is_file():
        run = for_caches(mooncake.model_copy(update={"duration_s": RUN_S["mooncake"][quick]}))
        out["mooncake"] = Traffic("mooncake", run, trace_requests(mooncake))
    return out


def run_requests(config: SimConfig) -> list[Request]:
    """The requests a run of `config` serves, as `sim.engine.run.run_simulation` builds them."""
    from_trace = trace_requests(config)
    if from_trace is not None:
        return from_trace
    return synthetic_requests(config.workload.synthetic, config.duration_s, config.cache.block_tokens, config.seed)


# ----- 1. the three designs, simulated -----

def run_design(traffic: Traffic, design: str, lifetime_s: float | None = None) -> dict:
    """One simulation of `traffic` under `design` (and `lifetime_s`, default the config's): the figures of a row."""
    cache = {"window_design": design}
    if lifetime_s is not None:
        cache["window_lifetime_s"] = lifetime_s
    config = for_caches(traffic.config, **cache)
    result, report = run_simulation(config)
    records = [r for r in result.records if r.cached_tokens > 0]  # the lookups that hit the disk
    cached = sum(r.cached_tokens for r in records)
    if design == "memory":
        found_lookups = sum(r.window_hit for r in records) / max(len(records), 1)
        found_tokens = sum(r.cached_tokens for r in records if r.window_hit) / max(cached, 1)
    elif design == "disk":  # the window is read with the blocks: found whenever they are
        found_lookups = found_tokens = 1.0
    else:  # never kept
        found_lookups = found_tokens = None
    input_tokens = sum(r.request.input_tokens for r in result.records)
    figures = report["window_designs"][design]
    return {"traffic": traffic.name, "design": design, "lifetime_s": config.cache.window_lifetime_s,
            "requests": report["requests"], "disk_hit_share": report["disk_cache_hit_rate"],
            "disk_hit_lookups": len(records), "window_lookups": result.window_cache.hits + result.window_cache.misses,
            "window_found_lookups": found_lookups, "window_found_tokens": found_tokens,
            "recomputed_share": sum(r.recomputed_tokens for r in result.records) / max(input_tokens, 1),
            "flops_vs_full_recompute": figures["flops_vs_full_recompute"],
            "disk_bytes_needed": figures["disk_bytes_needed"],
            "disk_bytes_needed_by_design": {d: f["disk_bytes_needed"] for d, f in report["window_designs"].items()}}


# ----- 2. gaps, replayed -----

def shared_head_blocks(requests: list[Request]) -> int:
    """Leading block positions at which more than half of all the requests hold one and the same block id."""
    head, group = 0, requests
    while group:
        ids = [r.block_hashes[head] for r in group if len(r.block_hashes) > head]
        if not ids:
            return head
        values, counts = np.unique(ids, return_counts=True)
        if counts.max() * 2 <= len(requests):
            return head
        common = values[counts.argmax()]
        group = [r for r in group if len(r.block_hashes) > head and r.block_hashes[head] == common]
        head += 1
    return head


def replay_gaps(requests: list[Request], config: SimConfig) -> Gaps:
    """Replay `requests` (in arrival order) through the engine's cache rules at their arrival times: the persistent
    tier with the config's retention and no capacity bound, the window keyed by a prompt's last full block."""
    block = config.cache.block_tokens
    disk = PrefixCache(math.inf, 1.0, config.retention_s, block_tokens=block)
    stored: dict[int, tuple[float, int]] = {}  # window key -> (time last stored, output tokens of that prompt)
    head = shared_head_blocks(requests)
    full_blocks: set[int] = set()  # blocks some prompt held in full
    gaps, cached_tokens, returning, reply, on_partial = [], [], [], [], []
    for r in requests:
        blocks = disk.lookup(r.arrival_s, r.block_hashes, r.traffic_class, input_tokens=r.input_tokens)
        cached = min(blocks * block, r.input_tokens - 1)  # as Simulation._look_up_caches
        if cached > 0:
            when, output = stored.get(r.block_hashes[blocks - 1], (math.nan, 0))
            gaps.append(r.arrival_s - when if math.isfinite(when) else math.inf)
            reply.append(output / TYPICAL_OUTPUT_TOKENS_PER_S if math.isfinite(when) else math.nan)
            cached_tokens.append(cached)
            on_partial.append(not math.isfinite(when) and r.block_hashes[blocks - 1] not in full_blocks)
            returning.append(blocks > head)
        disk.insert(r.arrival_s, r.block_hashes, r.traffic_class)
        full = r.input_tokens // block
        full_blocks.update(r.block_hashes[:full])
        if full:
            stored[r.block_hashes[full - 1]] = (r.arrival_s, r.output_tokens)
    return Gaps(np.array(gaps, dtype=float), np.array(cached_tokens, dtype=np.int64),
                np.array(returning, dtype=bool), np.array(reply, dtype=float), np.array(on_partial, dtype=bool),
                len(requests), head)


def hit_shares(gaps: Gaps, lifetime_s: float, returning_only: bool = False) -> tuple[float, float]:
    """(share of lookups, share of their cached tokens) that find the window state at `lifetime_s`."""
    mask = gaps.returning_N if returning_only else np.ones(len(gaps.gap_s_N), dtype=bool)
    found = mask & (gaps.gap_s_N < lifetime_s)
    return (float(found.sum() / max(mask.sum(), 1)),
            float(gaps.cached_N[found].sum() / max(gaps.cached_N[mask].sum(), 1)))


# ----- 3. the think-time family -----

def lognormal_fit(gap_s: np.ndarray) -> tuple[float, float]:
    """(median, sigma) of a lognormal matching the positive finite gaps' median and quartiles (nan when < 2)."""
    gap_s = gap_s[np.isfinite(gap_s) & (gap_s > 0)]
    if len(gap_s) < 2:
        return math.nan, math.nan
    q25, q50, q75 = np.quantile(gap_s, (0.25, 0.5, 0.75))
    return float(q50), float(math.log(q75 / q25) / (2 * NormalDist().inv_cdf(0.75)))


def needed_share(reachable: float, target: float = SEED_HIT) -> float:
    """Share of gaps (of the lookups whose state was ever stored) under the lifetime that `target` needs; > 1 means
    unreachable at any lifetime."""
    return target / reachable if reachable > 0 else math.inf


def max_sigma(median_s: float, need: float, lifetime_s: float = SEED_LIFETIME_S) -> float:
    """Largest sigma of lognormal gaps of `median_s` with a share `need` under `lifetime_s` (nan: none)."""
    if need >= 1 or median_s >= lifetime_s:
        return math.nan
    return math.log(lifetime_s / median_s) / NormalDist().inv_cdf(need) if need > 0.5 else math.inf


def max_median(sigma: float, need: float, lifetime_s: float = SEED_LIFETIME_S) -> float:
    """Largest median of lognormal gaps of log-sd `sigma` with a share `need` under `lifetime_s` (nan: none)."""
    return lifetime_s * math.exp(-NormalDist().inv_cdf(need) * sigma) if need < 1 else math.nan


def family(gaps: Gaps, returning_only: bool) -> dict:
    """What >= SEED_HIT of lookups at SEED_LIFETIME_S asks of this traffic's gaps. Think times and the lognormal fit
    are nan over all the lookups of a traffic with a shared head: many of those gaps run between different
    conversations that share the head."""
    mask = gaps.returning_N if returning_only else np.ones(len(gaps.gap_s_N), dtype=bool)
    gap_s = gaps.gap_s_N[mask]
    stored = np.isfinite(gap_s)
    finite = gap_s[stored]
    reachable = float(stored.mean()) if len(gap_s) else math.nan
    need = needed_share(reachable)
    sessions = returning_only or gaps.head_blocks == 0
    median, sigma = lognormal_fit(gap_s) if sessions else (math.nan, math.nan)
    think_s = (gap_s - gaps.reply_s_N[mask])[stored]

    def quantiles(values: np.ndarray, shown: bool = True) -> dict[str, float]:
        return {f"p{round(q * 100)}": float(np.quantile(values, q)) if len(values) and shown else math.nan
                for q in QUANTILES}

    return {"lookups": int(mask.sum()), "reachable": reachable, "needed_share_under_lifetime": need,
            "never_stored_on_partial": int((mask & gaps.on_partial_N).sum()),
            "never_stored_inside_longer": int((~stored).sum() - (mask & gaps.on_partial_N).sum()),
            "share_under_lifetime": float((finite < SEED_LIFETIME_S).mean()) if len(finite) else math.nan,
            "gap_quantiles_s": quantiles(finite), "think_quantiles_s": quantiles(think_s, sessions),
            "lognormal_median_s": median, "lognormal_sigma": sigma,
            "max_sigma_at_median_all_stored": max_sigma(median, SEED_HIT),
            "max_median_at_sigma_all_stored_s": max_median(sigma, SEED_HIT),
            "lifetime_needed_s": float(np.quantile(finite, need)) if need <= 1 and len(finite) else math.inf}


# ----- printing -----

def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:,.{digits}f}")


def print_designs(rows: list[dict], skipped: list[str]) -> None:
    print("\n| traffic | design | requests | disk hit (input tokens) | lookups with a disk hit | window state found: "
          "lookups | window state found: cached tokens | tokens computed again (share of input) | prefill decoder "
          "FLOPs vs full recompute | disk needed TB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['traffic']} | {r['design']} | {r['requests']:,} | {_pct(r['disk_hit_share'])} | "
              f"{r['disk_hit_lookups']:,} | {_pct(r['window_found_lookups'])} | {_pct(r['window_found_tokens'])} | "
              f"{_pct(r['recomputed_share'])} | {_pct(r['flops_vs_full_recompute'])} | "
              f"{r['disk_bytes_needed'] / 1e12:.2f} |")
    for name in skipped:
        print(f"| {name} | skipped: trace absent | | | | | | | | |")


def print_lifetimes(sweep: dict[str, list[dict]]) -> None:
    print("\nwindow state found, by lifetime (replay at arrival times; lookups / cached tokens):\n")
    names = list(sweep)
    print("| lifetime s | " + " | ".join(f"{n}: lookups | {n}: tokens" for n in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for i, lifetime in enumerate(LIFETIMES_S):
        cells = " | ".join(f"{_pct(sweep[n][i]['lookups'])} | {_pct(sweep[n][i]['tokens'])}" for n in names)
        print(f"| {_num(lifetime, 0)} | {cells} |")


def print_gaps(families: dict[str, dict]) -> None:
    quantiles = " | ".join(f"p{round(q * 100)}" for q in QUANTILES)
    print(f"\ngaps between a stored window state and its lookup (s; the lookups whose state was ever stored), and "
          f"think time (the gap less the stored prompt's reply at {TYPICAL_OUTPUT_TOKENS_PER_S:g} tok/s):\n")
    print(f"| lookups | count | state ever stored | what | {quantiles} | under {SEED_LIFETIME_S:g} s |")
    print("|---|---|---|---|" + "---|" * len(QUANTILES) + "---|")
    for name, f in families.items():
        for what, key in (("gap", "gap_quantiles_s"), ("think time", "think_quantiles_s")):
            values = " | ".join(_num(v, 0) for v in f[key].values())
            under = _pct(f["share_under_lifetime"]) if what == "gap" else ""
            print(f"| {name} | {f['lookups']:,} | {_pct(f['reachable'])} | {what} | {values} | {under} |")
    for name, f in families.items():
        print(f"\n{name}: of the lookups whose state was never stored, {f['never_stored_inside_longer']:,} end inside "
              f"an earlier, longer prompt (a branch, or a shared document: no state kept there) and "
              f"{f['never_stored_on_partial']:,} on an earlier prompt's partial last block (the same prompt sent "
              f"again; the engine keys the state by the last full block, so these miss at any lifetime)")


def print_family(families: dict[str, dict]) -> None:
    print(f"\nwhat >= {SEED_HIT:.0%} of lookups at {SEED_LIFETIME_S:g} s asks of the gaps (needed share = "
          f"{SEED_HIT:.0%} / state ever stored; lognormal fitted to the median and quartiles; 'if every state were "
          f"stored' drops the lookups whose state never was):\n")
    print(f"| lookups | state ever stored | gaps under {SEED_LIFETIME_S:g} s needed | measured | lifetime needed s | "
          f"lognormal median s | sigma | if every state were stored: max sigma at that median | max median s at "
          f"that sigma |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, f in families.items():
        need = f["needed_share_under_lifetime"]
        print(f"| {name} | {_pct(f['reachable'])} | {_pct(need) if need <= 1 else 'unreachable'} | "
              f"{_pct(f['share_under_lifetime'])} | {_num(f['lifetime_needed_s'], 0)} | "
              f"{_num(f['lognormal_median_s'], 0)} | {_num(f['lognormal_sigma'])} | "
              f"{_num(f['max_sigma_at_median_all_stored'])} | {_num(f['max_median_at_sigma_all_stored_s'], 0)} |")
    print(f"\nlognormal gaps, every lookup's state stored (as in the synthetic sessions): {SEED_HIT:.0%} under "
          f"{SEED_LIFETIME_S:g} s needs sigma <= ln({SEED_LIFETIME_S:g} / median) / "
          f"{NormalDist().inv_cdf(SEED_HIT):.3f}:\n")
    print("| median s | " + " | ".join(_num(m, 0) for m in MEDIANS_S) + " |")
    print("|---|" + "---|" * len(MEDIANS_S))
    print("| max sigma | " + " | ".join(_num(max_sigma(m, SEED_HIT)) for m in MEDIANS_S) + " |")


def measure(quick: bool) -> dict:
    """Every figure of the bench (see the module docstring); a traffic whose trace is absent is listed under
    "skipped" instead."""
    out: dict = {"designs": [], "skipped": [], "lifetimes": {}, "families": {}, "check_at_180_s": {}}
    for name, traffic in traffics(quick).items():
        if traffic is None:
            out["skipped"].append(name)
            continue
        rows = [run_design(traffic, design) for design in DESIGNS]
        out["designs"] += rows
        gaps = replay_gaps(traffic.gap_requests, traffic.config)
        same = replay_gaps(run_requests(traffic.config), traffic.config)
        memory = rows[DESIGNS.index("memory")]
        out["check_at_180_s"][name] = {"simulated": [memory["window_found_lookups"], memory["window_found_tokens"]],
                                       "replayed": list(hit_shares(same, SEED_LIFETIME_S))}
        views = [(name, False)] + ([(f"{name}, returning turns", True)] if gaps.head_blocks else [])
        for label, returning in views:
            out["lifetimes"][label] = [dict(zip(("lookups", "tokens"), hit_shares(gaps, lifetime, returning)))
                                       for lifetime in LIFETIMES_S]
            out["families"][label] = family(gaps, returning)
            out["families"][label]["shared_head_blocks"] = gaps.head_blocks
            out["families"][label]["requests"] = gaps.requests
    return out


def _plain(value):
    """`value` with every non-finite float as a string ("inf", "nan"), so the JSON is strict."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short simulations and a short synthetic gap horizon")
    parser.add_argument("--json", action="store_true", help="also print every figure as one JSON object, last")
    args = parser.parse_args(argv)
    out = measure(args.quick)
    print_designs(out["designs"], out["skipped"])
    for name, check in out["check_at_180_s"].items():
        print(f"\n{name}: window state found at {SEED_LIFETIME_S:g} s, simulated (memory design) "
              f"{_pct(check['simulated'][0])} of lookups / {_pct(check['simulated'][1])} of cached tokens; replayed "
              f"at arrival times over the same requests {_pct(check['replayed'][0])} / {_pct(check['replayed'][1])}")
    print_lifetimes(out["lifetimes"])
    print_gaps(out["families"])
    print_family(out["families"])
    if args.json:
        print(json.dumps(_plain(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
