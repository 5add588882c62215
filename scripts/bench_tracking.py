"""What share of the greedy's gap to the expectation oracle does cpsat close at 2 and 4 slots a GPU, moves priced?

On request-level decode traffic (`traces.request_traffic`: requests keep their own experts for hundreds of steps, so the
expected load moves as they come and go) the expectation oracle (`placement.yardsticks`: refitted every ORACLE_EVERY
steps on those steps' expected load, no lag, free moves) sits below what a refit every 100 steps on the last 100 serves,
greedy or cpsat. The gap left is tracking, not packing. This benchmark prices the tracking: a placement serves only once
its moves have crossed the link. Per switch between consecutive fits, `placement.migration.plan_migration` gives the
most experts one GPU receives from other GPUs on the replayed layers; scaled to the served model's MODEL_LAYERS and at
EXPERT_BYTES an expert (DeepSeek-V3's FP8 experts, about 44 MB), that GPU's bytes over the link speed give the switch's
seconds, and the replay serves every fit that many steps (rounded up) after its window ends: the most any switch of the
run needs, measured on a first replay without lag. The fit comes first: its CPU seconds as measured here per replayed
layer (every thread counted, so a busy machine does not inflate them), scaled to MODEL_LAYERS over `--fit-cores` cores,
are added to the lag. The burst patches (`placement.patch_planner` defaults) are priced the same way, as if one GPU
received all of a patch's moves of a layer (an upper bound). A cadence whose moves need more than the link carries
between two switches (`link share` above 1), or whose fits take longer than the steps between them (`fit share` above
1), cannot be kept up: the move budget or the fitting cores, not the placement, are what stop it.

Rows, per shape (144 x 2, 72 x 4; 128 tokens a GPU a step) and skew (the simulator's two scenarios, 1.251 and 0.5),
means over seeds and over the same scored steps (from step SCORED_FROM on, so that every row's first fit and its
lag are behind it): the greedy with the best split and cpsat with the live router, a refit every 100 steps on the
last 100; cpsat refitted every 50, 25 and 10 steps on the last as many, the greedy every 10 (what the cadence alone
gives), and cpsat every 100 with the burst patches, each at each link speed; the expectation oracle. `closed` is
the share of the greedy's gap to the oracle that a row closes.

Usage: python scripts/bench_tracking.py [--shapes 144x2 72x4] [--skews 1.251 0.5] [--seeds 1 2 3]
       [--link-gbs 50 12.5] [--step-ms 50] [--fit-cores 16] [--work-limit 4] [--json out.json]
"""

import math
import sys

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer, number
from eplb.cli.bench_harness import bench_parser, cell, finish, markdown_table
from placement import ClusterSpec, rolling_replay
from placement.migration import plan_migration
from placement.patch_planner import PatchPace, PatchSettings
from placement.yardsticks import expectation_oracle
from traces.request_traffic import RequestTrafficConfig, request_traffic_with_expectation

NUM_EXPERTS, TOP_K, LAYERS, STEPS, TOKENS_PER_GPU = 256, 8, 4, 400, 128
MODEL_LAYERS = 58  # DeepSeek-V3's MoE layers
EXPERT_BYTES = 3 * 7168 * 2048  # one DeepSeek-V3 expert in FP8: gate, up and down projections
SCORED_FROM = 150
ORACLE_EVERY = 10
CADENCES = (100, 50, 25, 10)  # refit every N steps on the last N


def switch_seconds(placements: list, link_gbs: float) -> list[float]:
    """Seconds each switch between consecutive `placements` keeps the link of its busiest receiving GPU busy."""
    seconds = []
    for before, after in zip(placements, placements[1:]):
        received = plan_migration(before, after).summary()["max_receives_per_gpu"]
        seconds.append(received * MODEL_LAYERS / before.num_layers * EXPERT_BYTES / (link_gbs * 1e9))
    return seconds


def priced(counts_TLE: np.ndarray, cluster: ClusterSpec, policy: str, routing: str, every: int, options: dict,
           link_gbs: float, step_s: float, fit_cores: int, free_replays: dict) -> dict:
    """A refit every `every` steps on the last `every`, served after its priced lag (its fit, then its moves):
    held-out imbalance per scored step and layer, the lag, and the shares of the link and of the fitting cores that
    the cadence needs. `free_replays` keeps the replays without lag, which the link speeds share."""
    key = (policy, every)
    if key not in free_replays:
        free_replays[key] = rolling_replay(counts_TLE, cluster, policy, every=every, window=every, routing=routing,
                                           policy_options=options)
    free = free_replays[key]
    seconds = switch_seconds(free.placements, link_gbs) or [0.0]
    fit_s = float(np.mean(free.fit_cpu_seconds)) * MODEL_LAYERS / counts_TLE.shape[1] / fit_cores
    lag = math.ceil((fit_s + max(seconds)) / step_s - 1e-9)
    served = free if lag == 0 else rolling_replay(counts_TLE, cluster, policy, every=every, window=every,
                                                  routing=routing, policy_options=options, lag=lag)
    return {"imbalance_TL": served.held_out.imbalance_TL, "lag": lag,
            "link_share": float(np.mean(seconds) / (every * step_s)), "fit_share": fit_s / (every * step_s)}


def patched(counts_TLE: np.ndarray, cluster: ClusterSpec, options: dict, link_gbs: float, step_s: float,
            fit_cores: int, free_replays: dict) -> dict:
    """cpsat at the slowest cadence with the burst patches, each patch served after its priced lag (one GPU
    receiving all of a patch's moves of a layer), each refit after its own."""
    settings = PatchSettings()
    every = CADENCES[0]
    refit = priced(counts_TLE, cluster, "cpsat", "live", every, options, link_gbs, step_s, fit_cores, free_replays)
    patch_s = settings.max_moves * MODEL_LAYERS * EXPERT_BYTES / (link_gbs * 1e9)
    pace = PatchPace(lag=max(1, math.ceil(patch_s / step_s - 1e-9)))
    served = rolling_replay(counts_TLE, cluster, "cpsat", every=every, window=every, routing="live",
                            policy_options=options, lag=refit["lag"], patches=settings, pace=pace)
    return {"imbalance_TL": served.held_out.imbalance_TL, "lag": pace.lag,
            "link_share": patch_s / (settings.every * step_s), "fit_share": refit["fit_share"]}


def measure(shapes: list[str], skews: list[float], seeds: list[int], speeds: list[float], step_s: float,
            fit_cores: int, options: dict) -> list[dict]:
    rows = []
    for shape in shapes:
        gpus, slots = (int(n) for n in shape.split("x"))
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
        for skew in skews:
            found: dict[str, list] = {}
            for seed in seeds:
                counts_TLE, expected_TLE = request_traffic_with_expectation(RequestTrafficConfig(
                    mode="decode", num_steps=STEPS, num_layers=LAYERS, num_experts=NUM_EXPERTS, top_k=TOP_K,
                    tokens_per_step=gpus * TOKENS_PER_GPU, seed=seed, skew=skew))
                cpsat, free = {"routing": "dynamic", **options}, {}
                slowest, fastest = CADENCES[0], CADENCES[-1]
                readings = {f"greedy, best split, every {slowest}": priced(
                    counts_TLE, cluster, "deepseek", "dynamic", slowest, {}, speeds[0], step_s, fit_cores, free)}
                for speed in speeds:
                    for every in CADENCES:
                        readings[f"cpsat every {every}, {speed:g} GB/s"] = priced(
                            counts_TLE, cluster, "cpsat", "live", every, cpsat, speed, step_s, fit_cores, free)
                    readings[f"greedy every {fastest}, {speed:g} GB/s"] = priced(
                        counts_TLE, cluster, "deepseek", "dynamic", fastest, {}, speed, step_s, fit_cores, free)
                    readings[f"cpsat every {slowest} + patches, {speed:g} GB/s"] = patched(
                        counts_TLE, cluster, cpsat, speed, step_s, fit_cores, free)
                oracle = expectation_oracle(counts_TLE[SCORED_FROM:], expected_TLE[SCORED_FROM:], cluster, "cpsat",
                                            "live", ORACLE_EVERY, cpsat)
                readings["expectation oracle"] = {"imbalance_TL": oracle.imbalance_TL, "lag": 0, "link_share": None,
                                                  "fit_share": None}
                for name, reading in readings.items():
                    scored = float(reading["imbalance_TL"][-(STEPS - SCORED_FROM):].mean())
                    found.setdefault(name, []).append((scored, reading["lag"], reading["link_share"],
                                                       reading["fit_share"]))
            greedy = np.mean([r[0] for r in found[f"greedy, best split, every {CADENCES[0]}"]])
            oracle = np.mean([r[0] for r in found["expectation oracle"]])
            for name, per_seed in found.items():
                value = float(np.mean([r[0] for r in per_seed]))
                shares = [r[2] for r in per_seed if r[2] is not None]
                fits = [r[3] for r in per_seed if r[3] is not None]
                rows.append({"shape": f"{gpus} x {slots}", "skew": skew, "row": name, "imbalance": value,
                             "per_seed": [r[0] for r in per_seed], "lag_max": max(r[1] for r in per_seed),
                             "link_share_max": max(shares) if shares else None,
                             "fit_share_max": max(fits) if fits else None,
                             "closed": None if greedy <= oracle else float((greedy - value) / (greedy - oracle))})
                print(f"{shape} skew {skew:g} {name}: {value:.4f} lag {rows[-1]['lag_max']}", file=sys.stderr,
                      flush=True)
    return rows


def table(rows: list[dict]) -> str:
    return markdown_table(
        ("shape", "skew", "row", "imbalance (mean over seeds)", "lag, steps (most)", "link share (most)",
         "fit share (most)", "closed"),
        ((row["shape"], f"{row['skew']:g}", row["row"], f"{row['imbalance']:.4f}", row["lag_max"],
          cell(row["link_share_max"], ".2f"), cell(row["fit_share_max"], ".2f"), cell(row["closed"], ".0%"))
         for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--shapes", nargs="+", default=["144x2", "72x4"], choices=["144x2", "72x4", "64x4"],
                        help="GPUs x slots (default: %(default)s)")
    parser.add_argument("--skews", type=number(0, high=4), nargs="+", default=[1.251, 0.5],
                        help="request-level popularity skews (default: the simulator's two scenarios)")
    parser.add_argument("--seeds", type=integer(0, SEED_MAX), nargs="+", default=[1, 2, 3],
                        help="trace seeds (default: %(default)s)")
    parser.add_argument("--link-gbs", type=number(0, low_open=True, high=1e4), nargs="+", default=[50.0, 12.5],
                        help="GB/s a GPU's moves may take (default: a 400 Gb/s NIC whole, and a quarter of it)")
    parser.add_argument("--step-ms", type=number(0, low_open=True, high=1e5), default=50.0,
                        help="decode step time in ms (default: %(default)s)")
    parser.add_argument("--fit-cores", type=integer(1, 4096), default=16,
                        help="cores a fit of the served model's layers runs on (default: %(default)s; the fit's "
                        "CPU seconds are measured here, per replayed layer)")
    parser.add_argument("--work-limit", type=number(0, low_open=True, high=1e6), default=4.0,
                        help="cpsat work budget per fit (default: %(default)s)")
    args = parser.parse_args(argv)
    rows = measure(args.shapes, args.skews, args.seeds, args.link_gbs, args.step_ms / 1000, args.fit_cores,
                   {"work_limit": args.work_limit})
    return finish(args.json, rows, table(rows))


if __name__ == "__main__":
    sys.exit(main())
