"""How much of the held-out imbalance is forecast error: placements fitted on the last window (rolling, with a lag)
against the same policy fitted on a twin of the very steps it serves (popularity known, fresh sampling noise only).

Issue 25's yardstick. Each traffic is a synthetic trace (`traces.synthetic`: domains, drift, bursts) and its twin
(same seed, another `sample_seed`: the same popularity, domain mix and bursts, other samples). Rows per shape and
traffic, all scored on the same steps [window + largest lag, T) under the live router (`placement/routing`, what a
decode worker runs):

- rolling, lag L: refit every `--every` steps on the last `--window`, each placement serving L steps after its window
  ended (`placement.replay.rolling_replay`, what `eplb replay --lag` runs);
- rolling + forecast, lag L: the same, each fit on its window moved along each expert's trend to the period it
  serves (`placement.forecast`, `eplb replay --forecast trend`);
- with --patch-lag P (or --live-pace), rolling + forecast + patches, lag L: the forecast rows with the serving
  placement patched between refits by the live rebalancer's planner (`placement.patch_planner`, `eplb replay
  --patch-lag`), each patch serving P steps after the steps it saw; with --live-pace at the pace a live group keeps at
  each shape on this machine, measured first (`scripts/bench_patch.py`'s `live_pace`);
- oracle: each served segment's placement fitted on the twin's counts of that segment;
- oracle, bursts unknown: the same fitted on a twin without the bursts (same domain mix): what a perfect forecast of
  the mix alone can serve, the bursts still to come unforeseen.

The forecast gap of a row is its imbalance less the oracle's; a better fit reports the share of the gap it closed.

With ../shared/data present (not with --quick), also real routing: ESFT's four tasks at 12 x 6 and 512 tokens a
step, each fitted on the first half of its steps and scored on the rest and on the other tasks, and the same on
independent draws from each task's mean (how much of the gap a perfect forecast would close: `esft_rows`); and
rolling replays at windows of 4, 8, 16 and 64 steps at 12 x 6 and 24 x 4, with and without the default forecast
(`esft_window_rows`: where the forecast stands down).

With --bursts, instead of those rows, what the bursts cost the "oracle, bursts unknown" placements (`burst_rows`):
their imbalance on the steps a burst touched and on the calm ones, against their burst exposure
(`placement.burst_exposure`: the expected imbalance while a uniformly chosen expert bursts).

With --refit-block, instead of those rows, what a refit in flight costs the patches (`schedule_rows`): `cpsat` with
the forecast and patches at each shape's live pace (measured first, as with --live-pace), on longer traces, under the
yardstick's schedule (a refit every `every` steps, back to back, patches never blocked) and under the live
rebalancer's (a refit `interval` steps after the last one landed, `lag` steps in flight, no patch starting
meanwhile: `PatchPace.refit_blocks`), and with one fit and patches alone.

Usage: python scripts/bench_forecast.py [--quick] [--esft-only | --bursts | --refit-block [--intervals 100 500]
       [--schedule-steps 2000]] [--lags 0 100] [--seeds 0] [--policies deepseek cpsat]
       [--live-pace | --patch-lag 10 [--patch-every 5] [--drift-stride 1] [--burst-lag 8]]
       [--work-limit 4 | --time-limit 2] [--json PATH]
"""

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer, json_output, number
from eplb.cli.main import OneLineParser
from placement import ClusterSpec, Placement, fit_placement
from placement.burst_exposure import burst_exposure
from placement.forecast import hedged_window, trend_supported
from placement.patch_planner import PatchPace, PatchSettings
from placement.replay import rolling_replay
from placement.scoring import score_placement
from traces import load_trace
from traces.atomic_file import write_text_atomically
from traces.synthetic import SyntheticConfig, active_bursts_TL, generate_trace

# (GPUs, slots per GPU, tokens per GPU per step), as issue 25 states its rows
SHAPES = ((64, 5, 128), (128, 3, 64))
TRAFFICS = {
    "drift": {},  # the generator's defaults: 4 domains drifting over ~1000 steps, 2 bursts per layer per 1000
    "bursty": {"burst_rate": 20.0, "burst_length_steps": 75.0, "burst_factor": 3.0},  # a burst every ~50 steps
}
TWIN_SAMPLE_SEED = 1_000_003
# (steps, layers, every, window) of the synthetic traces and their rolling fits: --quick, and the full run
QUICK_RUN, FULL_RUN = (140, 1, 40, 40), (800, 4, 100, 100)
POLICIES = ("deepseek", "cpsat")
ESFT = Path(__file__).resolve().parents[2] / "shared" / "data" / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"
ESFT_TASKS = ("intent", "law", "summary", "translation")
ESFT_CLUSTER = ClusterSpec(num_gpus=12, slots_per_gpu=6, gpus_per_node=12)  # issue 25's ESFT row: 72 slots, 64 experts
ESFT_TOKENS_PER_STEP = 512
# Real routing at short and long windows: (task, tokens a step, window, every); None: the four tasks in file order, one
# stream (a task switch every ~32 steps, as a server sees one). The first row is issue 53's.
ESFT_WINDOW_RUNS = (("summary", 512, 4, 4), (None, 256, 4, 4), (None, 256, 8, 8), (None, 256, 16, 16),
                    (None, 256, 64, 16))
ESFT_WINDOW_CLUSTERS = (ClusterSpec(num_gpus=12, slots_per_gpu=6, gpus_per_node=4),
                        ClusterSpec(num_gpus=24, slots_per_gpu=4, gpus_per_node=8))
IID_FRESH_STEPS = 64  # fresh draws each iid row is scored on
MAX_STEPS = 100_000  # a trace's steps (and any lag, pace or interval in steps): 4 layers x 256 experts stay in bounds
Patching = tuple[PatchSettings, PatchPace]  # the planner's settings and the replay's pace


def live_paces(shapes, quick: bool) -> dict[tuple[int, int], Patching]:
    """Per (GPUs, slots per GPU), the patch settings and pace a live group's steady patches keep at that shape on this
    machine, measured by `scripts/bench_patch.py` (`live_pace`: the live rebalancer's jobs at the full shape, or its
    quick shape with `quick`)."""
    spec = importlib.util.spec_from_file_location("bench_patch", Path(__file__).with_name("bench_patch.py"))
    bench_patch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_patch)
    bench_patch.import_solving_modules("cpsat", None)  # as the helper does at start: no import inside a timed job
    paces = {}
    for gpus, slots, _ in shapes:
        paces[(gpus, slots)] = bench_patch.live_pace(gpus, slots, quick=quick)
        settings, pace = paces[(gpus, slots)]
        print(f"live pace at {gpus} x {slots}: a patch every {settings.every} steps, drift stride "
              f"{settings.drift_stride}, lag {pace.lag}, burst layers' lag {pace.burst_lag}", file=sys.stderr)
    return paces


def trace_config(gpus: int, tokens_per_gpu: int, traffic: str, steps: int, layers: int, seed: int
                 ) -> SyntheticConfig:
    """The synthetic trace of one shape, traffic and seed: [T, L, 256], top-8, gpus * tokens_per_gpu tokens a step."""
    return SyntheticConfig(num_steps=steps, num_layers=layers, num_experts=256, top_k=8,
                           tokens_per_step=gpus * tokens_per_gpu, seed=seed, **TRAFFICS[traffic])


def traces(gpus: int, tokens_per_gpu: int, traffic: str, steps: int, layers: int, seed: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """(counts_TLE, twin_TLE): a trace and its twin (same popularity, other samples), [T, L, 256] int64."""
    config = trace_config(gpus, tokens_per_gpu, traffic, steps, layers, seed)
    twin = config.model_copy(update={"sample_seed": TWIN_SAMPLE_SEED})
    return generate_trace(config).counts_TLE, generate_trace(twin).counts_TLE


def calm_twin(gpus: int, tokens_per_gpu: int, traffic: str, steps: int, layers: int, seed: int) -> np.ndarray:
    """The twin without the traffic's bursts (same popularity and domain mix: the burst draws are a stream of their
    own), [T, L, 256] int64."""
    config = trace_config(gpus, tokens_per_gpu, traffic, steps, layers, seed)
    return generate_trace(config.model_copy(update={"burst_rate": 0.0, "sample_seed": TWIN_SAMPLE_SEED})).counts_TLE


def rolling_row(counts_TLE: np.ndarray, cluster: ClusterSpec, policy: str, options: dict, every: int, window: int,
                lag: int, first_scored: int, forecast: bool = False, patches: Patching | None = None) -> dict:
    """Held-out live imbalance of the rolling replay at `lag` (fitting the trend forecast if `forecast`, patching
    for bursts between refits with `patches`), over steps [first_scored, T)."""
    began = time.perf_counter()
    settings, pace = patches if patches else (None, PatchPace())
    result = rolling_replay(counts_TLE, cluster, policy, every=every, window=window, routing="live",
                            policy_options=options, lag=lag, forecast=forecast, patches=settings, pace=pace)
    imbalance_TL = result.held_out.imbalance_TL[first_scored - (window + lag):]
    patch_name = ""
    if patches:
        every = f", every {settings.every}" if settings.every != PatchSettings().every else ""
        stride = f", drift stride {settings.drift_stride}" if settings.drift_stride != 1 else ""
        early = f", burst layers at lag {pace.burst_lag}" if pace.burst_lag is not None else ""
        blocked = ", blocked by refits in flight" if pace.refit_blocks else ""
        patch_name = f" (patch lag {pace.lag}{every}{stride}{early}{blocked})"
    name = f"rolling{' + forecast' if forecast else ''}{' + patches' if patches else ''}, lag {lag}{patch_name}"
    row = {"fit": name, "imbalance_mean": float(imbalance_TL.mean()),
           "fits": len(result.refit_steps), "seconds": time.perf_counter() - began}
    if patches:
        row["patch_moves"] = result.patch_moves
    return row


def segment_fits(counts_TLE: np.ndarray, twin_TLE: np.ndarray, cluster: ClusterSpec, policy: str, options: dict,
                 every: int, first_scored: int) -> list[tuple[slice, Placement, np.ndarray]]:
    """(segment, placement, imbalance_TL) of each `every`-step segment of [first_scored, T): the placement fitted on
    the twin's counts of that very segment, its live imbalance on the trace's."""
    fits = []
    for start in range(first_scored, counts_TLE.shape[0], every):
        segment = slice(start, min(start + every, counts_TLE.shape[0]))
        placement = fit_placement(policy, twin_TLE[segment], cluster, **options)
        fits.append((segment, placement, score_placement(placement, counts_TLE[segment], "live").imbalance_TL))
    return fits


def oracle_row(counts_TLE: np.ndarray, twin_TLE: np.ndarray, cluster: ClusterSpec, policy: str, options: dict,
               every: int, first_scored: int, name: str = "oracle (popularity known)") -> dict:
    """Live imbalance over [first_scored, T) with each `every`-step segment served by a placement fitted on the
    twin's counts of that very segment (`segment_fits`). Given a twin without the bursts, what a perfect forecast of
    the domain mix alone could serve."""
    began = time.perf_counter()
    fits = segment_fits(counts_TLE, twin_TLE, cluster, policy, options, every, first_scored)
    return {"fit": name, "imbalance_mean": float(np.concatenate([scores for _, _, scores in fits]).mean()),
            "fits": len(fits), "seconds": time.perf_counter() - began}


def measure(quick: bool, lags: list[int], budget: dict, seeds: tuple[int, ...] = (0,),
            policies: tuple[str, ...] = POLICIES, patches: Patching | dict | None = None) -> list[dict]:
    """Every row of every shape, traffic, seed and policy (with `patches`, also the forecast rows with patches
    between refits: one settings and pace for every shape, or a dict of them per (GPUs, slots per GPU))."""
    steps, layers, every, window = QUICK_RUN if quick else FULL_RUN
    shapes = ((32, 9, 64),) if quick else SHAPES
    rows = []
    for gpus, slots, tokens_per_gpu in shapes:
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
        for traffic in (("drift",) if quick else TRAFFICS):
            for seed in seeds:
                counts_TLE, twin_TLE = traces(gpus, tokens_per_gpu, traffic, steps, layers, seed)
                calm_TLE = calm_twin(gpus, tokens_per_gpu, traffic, steps, layers, seed)
                first_scored = window + max(lags)
                for policy in policies:
                    options = {} if policy == "deepseek" else {**budget, "routing": "dynamic"}
                    found = [rolling_row(counts_TLE, cluster, policy, options, every, window, lag, first_scored,
                                         forecast) for lag in lags for forecast in (False, True)]
                    if patches is not None:
                        patching = patches[(gpus, slots)] if isinstance(patches, dict) else patches
                        found += [rolling_row(counts_TLE, cluster, policy, options, every, window, lag, first_scored,
                                              True, patching) for lag in lags]
                    found.append(oracle_row(counts_TLE, calm_TLE, cluster, policy, options, every, first_scored,
                                            "oracle, bursts unknown"))
                    found.append(oracle_row(counts_TLE, twin_TLE, cluster, policy, options, every, first_scored))
                    oracle = found[-1]["imbalance_mean"]
                    for row in found:
                        row.update({"shape": f"{gpus} x {slots}, {tokens_per_gpu} tokens/GPU", "traffic": traffic,
                                    "seed": seed, "policy": policy, "forecast_gap": row["imbalance_mean"] - oracle,
                                    "scored_steps": steps - first_scored})
                    rows.extend(found)
    return rows


def burst_rows(quick: bool, lags: list[int], budget: dict, seeds: tuple[int, ...],
               policies: tuple[str, ...]) -> list[dict]:
    """Per shape, traffic, seed and policy, the "oracle, bursts unknown" placements (each served segment fitted on the
    burst-free twin) scored on the trace: the share q of scored (step, layer) rows with a burst active, the mean
    imbalance on those rows and on the calm ones, and the placements' burst exposure at the traffic's burst factor
    (mean over segments, layers and bursting experts), and the mean number of bursts on the rows that have one.
    predicted = (1 - q) * calm + q * exposure: the held-out imbalance if every row with a burst cost what one burst
    of a uniformly chosen expert costs on average (bursts that overlap cost more)."""
    steps, layers, every, window = QUICK_RUN if quick else FULL_RUN
    first_scored = window + max(lags)  # the rolling rows' scored steps
    rows = []
    for gpus, slots, tokens_per_gpu in ((32, 9, 64),) if quick else SHAPES:
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
        for traffic in (("drift",) if quick else TRAFFICS):
            for seed in seeds:
                config = trace_config(gpus, tokens_per_gpu, traffic, steps, layers, seed)
                counts_TLE = generate_trace(config).counts_TLE
                calm_TLE = calm_twin(gpus, tokens_per_gpu, traffic, steps, layers, seed)
                bursts_TL = active_bursts_TL(config)[first_scored:]
                active_TL = bursts_TL > 0
                for policy in policies:
                    options = {} if policy == "deepseek" else {**budget, "routing": "dynamic"}
                    fits = segment_fits(counts_TLE, calm_TLE, cluster, policy, options, every, first_scored)
                    exposure = [burst_exposure(placement, calm_TLE[segment].mean(axis=0), config.burst_factor).mean()
                                for segment, placement, _ in fits]
                    imbalance_TL = np.concatenate([scores for _, _, scores in fits])
                    share = float(active_TL.mean())
                    calm = float(imbalance_TL[~active_TL].mean())
                    rows.append({"shape": f"{gpus} x {slots}, {tokens_per_gpu} tokens/GPU", "traffic": traffic,
                                 "seed": seed, "policy": policy, "burst_factor": config.burst_factor,
                                 "burst_share": share,
                                 "bursts_per_burst_row": float(bursts_TL[active_TL].mean()) if share else 0.0,
                                 "calm_rows": calm,
                                 "burst_rows": float(imbalance_TL[active_TL].mean()) if share else None,
                                 "exposure": float(np.mean(exposure)),
                                 "predicted": (1 - share) * calm + share * float(np.mean(exposure)),
                                 "measured": float(imbalance_TL.mean())})
    return rows


def schedule_rows(quick: bool, steps: int, lag: int, intervals: list[int], budget: dict,
                  seeds: tuple[int, ...]) -> list[dict]:
    """Per shape, traffic and seed, `cpsat` with the forecast and patches at the shape's live pace (`live_paces`) on a
    `steps`-step trace, scored on [window + lag, steps): refits every `window` steps back to back with patches never
    blocked (the yardstick's schedule); for each interval, a refit `interval` steps after the last one landed (every
    interval + lag steps) with no patch starting while one is in flight (`PatchPace.refit_blocks`, as a live group
    runs them), and without patches; one fit, then patches alone."""
    _, layers, _, window = QUICK_RUN if quick else FULL_RUN
    first_scored = window + lag
    options = {**budget, "routing": "dynamic"}
    shapes = ((32, 9, 64),) if quick else SHAPES
    paces = live_paces(shapes, quick)
    rows = []
    for gpus, slots, tokens_per_gpu in shapes:
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
        settings, pace = paces[(gpus, slots)]
        blocked = (settings, PatchPace(pace.lag, pace.burst_lag, refit_blocks=True))
        schedules = [(f"refits every {window} back to back, patches never blocked", window, (settings, pace))]
        for interval in intervals:
            schedules += [(f"a refit {interval} after the last landed, patches blocked while one is in flight",
                           interval + lag, blocked),
                          (f"a refit {interval} after the last landed, no patches", interval + lag, None)]
        schedules.append(("one fit, then patches alone", steps, (settings, pace)))
        for traffic in (("drift",) if quick else TRAFFICS):
            for seed in seeds:
                counts_TLE, _ = traces(gpus, tokens_per_gpu, traffic, steps, layers, seed)
                for name, every, patches in schedules:
                    row = rolling_row(counts_TLE, cluster, "cpsat", options, every, window, lag, first_scored, True,
                                      patches)
                    row.update({"fit": name, "shape": f"{gpus} x {slots}, {tokens_per_gpu} tokens/GPU",
                                "traffic": traffic, "seed": seed, "policy": "cpsat", "lag": lag,
                                "patch_lag": None if patches is None else patches[1].lag,
                                "patch_every": None if patches is None else patches[0].every,
                                "drift_stride": None if patches is None else patches[0].drift_stride,
                                "scored_steps": steps - first_scored})
                    rows.append(row)
    return rows


def schedule_table(rows: list[dict]) -> str:
    header = (f"| shape | traffic | seed | schedule (lag {rows[0]['lag']}) | patches (lag, every, stride) | held-out "
              "imbalance (live) | fits | slots moved by patches |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        pace = "-" if row["patch_lag"] is None else f"{row['patch_lag']}, {row['patch_every']}, {row['drift_stride']}"
        lines.append(f"| {row['shape']} | {row['traffic']} | {row['seed']} | {row['fit']} | {pace} | "
                     f"{row['imbalance_mean']:.4f} | {row['fits']} | {row.get('patch_moves', '-')} |")
    return "\n".join(lines)


def burst_table(rows: list[dict]) -> str:
    lines = ["| shape | traffic | seed | policy | rows with a burst (bursts on them) | imbalance there | calm rows "
             "| exposure (factor) | predicted | measured |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        there = "-" if row["burst_rows"] is None else f"{row['burst_rows']:.4f}"
        lines.append(f"| {row['shape']} | {row['traffic']} | {row['seed']} | {row['policy']} | "
                     f"{row['burst_share']:.3f} ({row['bursts_per_burst_row']:.2f}) | {there} | "
                     f"{row['calm_rows']:.4f} | {row['exposure']:.4f} ({row['burst_factor']:g}) | "
                     f"{row['predicted']:.4f} | {row['measured']:.4f} |")
    return "\n".join(lines)


def esft_rows(budget: dict) -> list[dict]:
    """Real routing (ESFT, DeepSeek-V2-Lite, 26 layers x 64 experts, top-6) at 12 x 6 and 512 tokens a step: per task,
    fit on the first half of its steps, score on the rest of the task (the next steps) and on each other task, with
    the window as it is and with the trend forecast to the next steps. Scores under the live router.

    Two more rows say how much of the gap any fit could close: steps drawn independently (multinomial) from each
    task's mean load, a window of as many draws fitted and scored on fresh ones ("iid draws: window"), and the same
    scored with the placement fitted on the exact mean ("iid draws: mean known", a perfect forecast). What stays
    between the latter and its fitted score is the steps' own noise, which no placement fitted in advance removes."""
    tasks = {t: load_trace(ESFT, tokens_per_step=ESFT_TOKENS_PER_STEP, tasks=[t]).counts_TLE for t in ESFT_TASKS}
    options = {**budget, "routing": "dynamic"}
    rows = []
    for fit in ("window", "window + forecast", "iid draws: window", "iid draws: mean known"):
        fitted, following, others = [], [], []
        rng = np.random.default_rng(0)  # the same draws for both iid rows
        for name, counts_TLE in tasks.items():
            half = len(counts_TLE) // 2
            window_TLE, next_TLE = counts_TLE[:half], counts_TLE[half:]
            fit_TLE = window_TLE
            if fit == "window + forecast":
                fit_TLE = hedged_window(window_TLE, 0, len(next_TLE))
            elif fit.startswith("iid"):
                window_TLE, next_TLE, mean_TLE = iid_draws(counts_TLE, half, IID_FRESH_STEPS, rng)
                fit_TLE = mean_TLE if fit == "iid draws: mean known" else window_TLE
            placement = fit_placement("cpsat", fit_TLE, ESFT_CLUSTER, **options)
            fitted.append(score_placement(placement, window_TLE, "live").imbalance_TL.mean())
            following.append(score_placement(placement, next_TLE, "live").imbalance_TL.mean())
            others.extend(score_placement(placement, other, "live").imbalance_TL.mean()
                          for other_name, other in tasks.items() if other_name != name)
        rows.append({"fit": fit, "fitted": float(np.mean(fitted)), "next_steps": float(np.mean(following)),
                     "other_tasks": float(np.mean(others)), "gap_next": float(np.mean(following) - np.mean(fitted))})
    return rows


def esft_window_rows(budget: dict) -> list[dict]:
    """Real routing (ESFT) at the windows of `ESFT_WINDOW_RUNS` and the clusters of `ESFT_WINDOW_CLUSTERS`: a rolling
    replay at lag 0 with the window as it is (`--forecast none`) and with the default forecast (the trend where the
    window supports it, `placement.forecast.trend_supported`), `deepseek` under the best split and `cpsat` under the
    live router; held-out and fitted imbalance, and how many of the fits drew a trend."""
    rows = []
    for task, tokens, window, every in ESFT_WINDOW_RUNS:
        counts_TLE = load_trace(ESFT, tokens_per_step=tokens, tasks=None if task is None else [task]).counts_TLE
        for cluster in ESFT_WINDOW_CLUSTERS:
            for policy, routing in (("deepseek", "dynamic"), ("cpsat", "live")):
                options = {} if policy == "deepseek" else {**budget, "routing": "dynamic"}
                found = {}
                for forecast in (False, True):
                    result = rolling_replay(counts_TLE, cluster, policy, every=every, window=window, routing=routing,
                                            policy_options=options, forecast=forecast)
                    found[forecast] = result
                trended = sum(trend_supported(counts_TLE[first:stop]) for first, stop in found[True].fit_windows)
                rows.append({"trace": task or "all four tasks", "tokens_per_step": tokens, "window": window,
                             "every": every, "shape": f"{cluster.num_gpus} x {cluster.slots_per_gpu}",
                             "policy": policy, "routing": routing,
                             "none": float(found[False].held_out.imbalance_TL.mean()),
                             "none_fitted": float(found[False].fitted.imbalance_TL.mean()),
                             "default": float(found[True].held_out.imbalance_TL.mean()),
                             "default_fitted": float(found[True].fitted.imbalance_TL.mean()),
                             "fits": len(found[True].fit_windows), "trend_fits": int(trended)})
    return rows


def esft_window_table(rows: list[dict]) -> str:
    lines = ["| ESFT trace, tokens/step | window / every | shape | policy / routing | `--forecast none` (fitted) "
             "| default (fitted) | fits with a trend |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['trace']}, {row['tokens_per_step']} | {row['window']} / {row['every']} | {row['shape']} "
                     f"| {row['policy']} / {row['routing']} | {row['none']:.4f} ({row['none_fitted']:.4f}) | "
                     f"{row['default']:.4f} ({row['default_fitted']:.4f}) | {row['trend_fits']} of {row['fits']} |")
    return "\n".join(lines)


def iid_draws(counts_TLE: np.ndarray, window: int, fresh: int, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window_TLE, fresh_TLE, mean_TLE): `window` and `fresh` steps drawn independently from the mean shares of
    `counts_TLE` [T, L, E], each row with the picks of the trace's first step (multinomial, so an expert may be
    drawn twice for one token: the noise is close to, not exactly, top-k's), and `window` rows of the exact mean
    (rounded)."""
    totals_LE = counts_TLE.sum(axis=0).astype(np.float64)
    shares_LE = totals_LE / np.maximum(totals_LE.sum(axis=1, keepdims=True), 1.0)
    picks_L = counts_TLE[0].sum(axis=1)
    window_TLE, fresh_TLE = (rng.multinomial(picks_L, shares_LE, size=(steps, len(picks_L)))
                             for steps in (window, fresh))
    mean_TLE = np.repeat(np.rint(picks_L[:, None] * shares_LE)[None], window, axis=0).astype(np.int64)
    return window_TLE, fresh_TLE, mean_TLE


def esft_table(rows: list[dict]) -> str:
    lines = ["| ESFT 12 x 6, 512 tokens/step, cpsat | fitted (own window) | next steps | other tasks "
             "| gap (next - fitted) |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['fit']} | {row['fitted']:.4f} | {row['next_steps']:.4f} | {row['other_tasks']:.4f} | "
                     f"{row['gap_next']:+.4f} |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| shape | traffic | seed | policy | fit | held-out imbalance (live) | forecast gap | fits | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['shape']} | {row['traffic']} | {row['seed']} | {row['policy']} | {row['fit']} | "
                     f"{row['imbalance_mean']:.4f} | {row['forecast_gap']:+.4f} | {row['fits']} | "
                     f"{row['seconds']:.1f} |")
    return "\n".join(lines)


def patching_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Patching | None:
    """The patch rows' settings and pace from the flags (None without --patch-lag); exits on flags out of range."""
    if args.patch_lag is None:
        if args.burst_lag is not None:
            parser.error("--burst-lag needs --patch-lag")
        return None
    if args.live_pace:
        parser.error("--live-pace measures the pace: give it or --patch-lag, not both")
    pace = PatchPace(lag=args.patch_lag, burst_lag=args.burst_lag)
    flags = {"lag": "--patch-lag", "burst_lag": "--burst-lag"}
    problems = pace.problems(args.patch_every)
    if problems:
        parser.error("; ".join(f"{flags[name]} {what}" for name, what in problems))
    return PatchSettings(every=args.patch_every, drift_stride=args.drift_stride), pace


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small shape, short drifting traces (a smoke run)")
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 100], help="lags of the rolling rows (steps)")
    parser.add_argument("--work-limit", type=number(0, low_open=True, high=1e6), default=4.0,
                        help="cpsat's deterministic budget per fit, work units (default 4)")
    parser.add_argument("--time-limit", type=number(0, low_open=True, high=86_400), default=None,
                        help="cpsat's budget per fit as wall-clock seconds instead (its rows then move run to run)")
    parser.add_argument("--seeds", type=integer(0, SEED_MAX), nargs="+", default=[0],
                        help="seeds of the synthetic traces")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES), help="policies to fit")
    parser.add_argument("--json", type=json_output(), default=None, help="also write the rows here as JSON")
    parser.add_argument("--esft-only", action="store_true", help="only the ESFT rows (needs ../shared/data)")
    parser.add_argument("--patch-lag", type=integer(0, MAX_STEPS), default=None, metavar="STEPS",
                        help="also the forecast rows with patches between refits, each serving STEPS after the steps "
                             "it saw (placement.patch_planner)")
    parser.add_argument("--patch-every", type=integer(1, MAX_STEPS), default=PatchSettings().every, metavar="STEPS",
                        help="with --patch-lag, steps between patch starts (default %(default)s)")
    parser.add_argument("--drift-stride", type=integer(1, MAX_STEPS), default=PatchSettings().drift_stride, metavar="K",
                        help="with --patch-lag, each layer's drift swaps in every K-th patch (default %(default)s)")
    parser.add_argument("--burst-lag", type=integer(0, MAX_STEPS), default=None, metavar="STEPS",
                        help="with --patch-lag, the layers whose burst moves come or go serve STEPS after the steps "
                             "a patch saw, ahead of its other layers (within (patch lag - patch every, patch lag])")
    parser.add_argument("--live-pace", action="store_true",
                        help="also the forecast rows with patches, at the pace a live group keeps at each shape on "
                             "this machine, measured first (scripts/bench_patch.py)")
    parser.add_argument("--bursts", action="store_true",
                        help="only what the bursts cost the placements fitted without them (no ESFT)")
    parser.add_argument("--refit-block", action="store_true",
                        help="only what a refit in flight costs the patches: the live rebalancer's schedule against "
                             "the yardstick's, at the largest of --lags (no ESFT)")
    parser.add_argument("--intervals", type=integer(1, MAX_STEPS), nargs="+", default=[100, 500], metavar="STEPS",
                        help="with --refit-block, steps from a refit's landing to the next refit's start")
    parser.add_argument("--schedule-steps", type=integer(1, MAX_STEPS), default=None, metavar="T",
                        help="with --refit-block, steps of each trace (default 2000; 300 with --quick)")
    args = parser.parse_args(argv)
    budget = {"work_limit": args.work_limit} if args.time_limit is None else {"time_limit_s": args.time_limit}
    if min(args.lags) < 0:
        parser.error("--lags must be >= 0")
    if args.esft_only and (args.quick or not ESFT.exists()):
        parser.error(f"--esft-only needs the ESFT logs at {ESFT} and no --quick")
    steps, _, _, window = QUICK_RUN if args.quick else FULL_RUN
    if window + max(args.lags) >= steps:
        parser.error(f"--lags up to {max(args.lags)} leave no step to score in {'--quick' if args.quick else 'the'} "
                     f"traces' {steps} steps after a {window}-step window; give lags below {steps - window}")
    if args.esft_only + args.bursts + args.refit_block > 1:
        parser.error("--esft-only, --bursts and --refit-block choose different rows: give one of them")
    if args.refit_block:
        steps = args.schedule_steps or (300 if args.quick else 2000)
        if min(args.intervals) < 1 or window + max(args.lags) >= steps:
            parser.error("--intervals must be >= 1 and --schedule-steps above the window plus the largest of --lags")
        rows = schedule_rows(args.quick, steps, max(args.lags), args.intervals, budget, tuple(args.seeds))
        print(schedule_table(rows))
        if args.json:
            write_text_atomically(args.json, json.dumps({"schedules": rows}, indent=1) + "\n")
        return 0
    if args.bursts:
        bursts = burst_rows(args.quick, args.lags, budget, tuple(args.seeds), tuple(args.policies))
        print(burst_table(bursts))
        if args.json:
            write_text_atomically(args.json, json.dumps({"bursts": bursts}, indent=1) + "\n")
        return 0
    patches = patching_from(parser, args)
    if args.live_pace and not args.esft_only:
        patches = live_paces(((32, 9, 64),) if args.quick else SHAPES, args.quick)
    rows = [] if args.esft_only else measure(args.quick, args.lags, budget, tuple(args.seeds),
                                             tuple(args.policies), patches)
    if rows:
        print(table(rows))
    esft = esft_rows(budget) if ESFT.exists() and not args.quick else []
    esft_windows = esft_window_rows(budget) if esft else []
    if esft:
        print("\n" + esft_table(esft))
        print("\n" + esft_window_table(esft_windows))
    if args.json:
        write_text_atomically(args.json, json.dumps({"synthetic": rows, "esft": esft, "esft_windows": esft_windows},
                                                    indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
