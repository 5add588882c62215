"""What a burst patch costs a live group at the full shape, against a refit measured in the same process.

Per cluster (64 GPUs x 5 slots and 128 x 3 by default; 61 layers x 256 experts, top-8, 128 tokens per GPU a step,
`traces.synthetic`'s drifting trace with bursts), rank 0's background jobs as the `Rebalancer` submits them
(`eplb.rebalance.background_solver.solve`), each from the placement serving to the next:

- refit (the baseline): `cpsat` with the `RebalanceConfig` defaults (1 s budget, good_enough 1.001, dynamic
  routing) on the window of steps [W, 2W), from a placement fitted the same way on [0, W), every fit moved to
  (min_gain 0), as a refit that switches;
- patches, from that refit's placement as it switched to it (what rank 0's patches start from, its layers rings in
  the order of the refit's GPU map), planned against it by the live rebalancer's planner
  (`placement.patch_planner.PatchPlanner` with `RebalanceConfig.patches`) on the mean of the next
  `patches.drift_window` steps (the drift swaps') and of the last `patches.window` of them (the burst moves'): as the
  trace has them (also without drift swaps), then with one random expert per layer 4x as popular in the burst moves'
  steps in a share of the layers (a burst in 10% and in every layer);
- steady patches: from the first patch with drift swaps as it switched, `STEADY` more, `patches.every` steps apart on
  the trace, planned by the same planner as rank 0 runs it (each from the last one's drift swaps, the layers' turns at
  drift swaps widened by the last one's swap seconds against `patches.swap_budget_s`); then their medians, and the
  pace overlapping patches keep at them (`eplb.rebalance.patch_clock`: with M the moving steps,
  `eplb.rebalance.attempt.moving_steps`, a patch every max(M + 1, job steps + 1) steps, landing job steps + M + 2
  after the load it saw): the `PatchPace` and stride that model it in `eplb replay` and `scripts/bench_forecast.py`
  (`live_pace`).

Per job: its seconds (the solve and the weight moves' plan, on this machine's cores), the slots that change expert,
the fills (slots, and host copies the new placement wants), the bytes moved and the rounds at the config's
`max_bytes_per_step` for DeepSeek-V3's experts (hidden 7168, intermediate 2048, FP8), the layers the switch must build
tables for (a few a step, `eplb.rebalance.attempt.layers_per_step`), and the steps from the job's start to the switch
at a decode step of `--step-ms`: the job, the step that broadcasts the answer and posts the first round, the moving
steps M after it (the rounds, or the steps preparing the changed layers where those take longer: they run together),
one for the switch; and the patch's layers whose burst moves come or go, planned first, with the steps to their own
switch (each layer switches as its weights land: the job, the broadcast's step, their last round and one for its
completion, the switch), the steady medians' `PatchPace.burst_lag`; and per steady patch the milliseconds per changed
layer to build its routing tables and host-copy list on this CPU (`Attempt.prepare_layers`' work, a few layers a
step beside the rounds). Ratios against the refit: seconds and bytes.

Usage: python scripts/bench_patch.py [--gpus 64 128] [--slots-per-gpu 5 3] [--max-bytes-per-step 64]
       [--patch-drift-stride 1] [--patch-drift-window 30] [--patch-swap-budget 0.13] [--quick] [--json FILE]
"""

import argparse
import json
import math
import sys
import time

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer, json_output, number
from eplb.cli.main import OneLineParser
from eplb.live.replica_assignment import ReplicaTables
from eplb.rebalance.attempt import (
    changed_layers,
    last_rounds,
    layer_switch_steps,
    layers_per_step,
    moving_steps,
)
from eplb.rebalance.background_solver import SolveResult, import_solving_modules, solve
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.move_plan import KINDS, TransferShape, backup_wanted
from placement import ClusterSpec, Placement, fit_placement
from placement.cluster import MAX_GPUS, MAX_SLOTS, MAX_SLOTS_PER_GPU
from placement.patch_planner import PatchPace, PatchPlanner, PatchSettings
from traces.atomic_file import write_text_atomically
from traces.synthetic import SyntheticConfig, generate_trace

FULL = {"layers": 61, "experts": 256, "top_k": 8, "window": 100}
QUICK = {"layers": 4, "experts": 32, "top_k": 4, "window": 20}
EXPERT = {"hidden_size": 7168, "intermediate_size": 2048, "element_size": 1}  # DeepSeek-V3's routed expert, FP8
TOKENS_PER_GPU = 128
BURST_FACTOR = 4.0
BURST_SHARES = (0.1, 1.0)  # shares of the layers a burst is added to
STEADY = 6  # steady patches after the first, each from the last
MAX_STEPS = 10_000  # a drift window or stride, in steps: the full shape's trace stays within its limit
MAX_SECONDS = 86_400.0  # one day: a step or a budget beyond it is a typo


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=integer(1, MAX_GPUS), nargs="+", default=[64, 128], help="GPUs of each cluster")
    parser.add_argument("--slots-per-gpu", type=integer(1, MAX_SLOTS_PER_GPU), nargs="+", default=[5, 3],
                        help="slots per GPU of each cluster")
    parser.add_argument("--step-ms", type=number(0, low_open=True, high=MAX_SECONDS * 1000), default=50.0,
                        help="decode step time for the steps to a switch")
    parser.add_argument("--seed", type=integer(0, SEED_MAX), default=0)
    parser.add_argument("--patch-drift-stride", type=integer(1, MAX_STEPS), default=PatchSettings().drift_stride,
                        metavar="K",
                        help="PatchSettings.drift_stride, the least stride of the layers' turns at drift swaps "
                             "(default %(default)s)")
    parser.add_argument("--patch-drift-window", type=integer(1, MAX_STEPS), default=PatchSettings().drift_window,
                        metavar="STEPS",
                        help="PatchSettings.drift_window, the steps whose mean load the drift swaps follow "
                             "(default %(default)s)")
    parser.add_argument("--patch-swap-budget", type=number(0, high=MAX_SECONDS), default=PatchSettings().swap_budget_s,
                        metavar="SECONDS",
                        help="PatchSettings.swap_budget_s (default %(default)s; 0: none, the stride stays "
                             "--patch-drift-stride)")
    parser.add_argument("--max-bytes-per-step", type=number(0, low_open=True, high=2**20),
                        default=RebalanceConfig().max_bytes_per_step / 2**20, metavar="MIB",
                        help="RebalanceConfig.max_bytes_per_step in MiB, each rank's weight bytes between two decode "
                             "steps, which sets the rounds (default %(default)g)")
    parser.add_argument("--quick", action="store_true", help="a small shape (4 layers x 32 experts), for tests")
    parser.add_argument("--json", type=json_output(), default=None, help="also write the rows to this file")
    return parser


def job_row(name: str, answer: SolveResult, seconds: float, current: Placement, step_ms: float) -> dict:
    """One job's figures (see the module docstring); `current` is the placement it moves from."""
    kinds = answer.fills_U8[:, 3] if len(answer.fills_U8) else np.zeros(0, dtype=np.int64)
    rounds = int(answer.chunks_C6[:, 0].max()) + 1 if len(answer.chunks_C6) else 0
    layers = 0 if answer.kept else len(changed_layers(current, answer.placement))
    moving = 0 if answer.kept else moving_steps(layers, rounds)  # the rounds and the tables built beside them
    job_steps = math.ceil(seconds * 1000 / step_ms)
    steps = 0 if answer.kept else job_steps + 1 + moving + 1
    # The layers whose burst moves come or go switch as their weights land (taken as the first prepared: they
    # hold the first rounds), the last of them the steps `layer_switch_steps` gives after the broadcast.
    first = [] if answer.kept or answer.first_layers is None else answer.first_layers.tolist()
    last_L = last_rounds(answer.fills_U8, answer.chunks_C6)
    landed = max((last_L.get(layer, -1) for layer in first), default=None)
    burst_steps = None if landed is None else job_steps + 1 + layer_switch_steps(
        landed, len(first) - 1, layers_per_step(layers, rounds))
    return {"job": name, "seconds": round(seconds, 3), "kept": answer.kept, "slots_moved": int(answer.moves[0]),
            "slot_fills": int((kinds == KINDS.index("slot")).sum()),
            "host_copy_fills": int((kinds == KINDS.index("backup")).sum()),
            "bytes": int(answer.chunks_C6[:, 5].sum()) if len(answer.chunks_C6) else 0, "rounds": rounds,
            "changed_layers": layers, "moving_steps": moving, "steps_to_switch": steps,
            "burst_layers": len(first), "steps_to_burst_layers": burst_steps, "step_ms": step_ms}


def prepare_ms_per_layer(current: Placement, target: Placement, failures_tolerated: int) -> float | None:
    """Milliseconds per layer `target` changes from `current` to build its routing tables and host-copy list on
    this CPU (what `Attempt.prepare_layers` does a few layers a step while the rounds move), or None: none changes."""
    layers = changed_layers(current, target)
    if not layers:
        return None
    shape = (target.cluster.num_gpus, target.cluster.slots_per_gpu)
    began = time.perf_counter()
    for layer in layers:
        ReplicaTables.build(target, layer, "cpu")
        backup_wanted(target.phy2log_LP[layer].reshape(shape), failures_tolerated)
    return (time.perf_counter() - began) * 1000 / len(layers)


def timed(job) -> tuple[SolveResult, float]:
    began = time.perf_counter()
    answer = job()
    return answer, time.perf_counter() - began


def measure_cluster(num_gpus: int, slots: int, shape: dict, step_ms: float, seed: int,
                    config: RebalanceConfig | None = None) -> list[dict]:
    """The refit row, then the patch rows, of one cluster (see the module docstring), at `config` (default: the
    `RebalanceConfig` defaults)."""
    config = RebalanceConfig() if config is None else config
    patches, window = config.patches or PatchSettings(), shape["window"]
    end = 2 * window + patches.steps_seen  # the first patches see the steps up to here; the steady ones the next
    trace = generate_trace(SyntheticConfig(num_steps=end + STEADY * patches.every, num_layers=shape["layers"],
                                           num_experts=shape["experts"], top_k=shape["top_k"],
                                           tokens_per_step=TOKENS_PER_GPU * num_gpus, seed=seed))
    counts_TLE = trace.counts_TLE
    cluster = ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots)
    options = {"time_limit_s": config.time_limit_s, "routing": config.routing, "workers": config.solve_threads,
               "good_enough": config.good_enough}
    transfer = TransferShape(**EXPERT, max_bytes_per_round=config.max_bytes_per_step,
                             failures_tolerated=config.failures_tolerated_for(num_gpus))
    start = fit_placement("cpsat", counts_TLE[:window], cluster, **options)
    refit, seconds = timed(lambda: solve(counts_TLE[window : 2 * window], start, "cpsat", options, None, transfer))
    rows = [job_row("refit", refit, seconds, start, step_ms)]
    drift_LE = counts_TLE[end - patches.drift_window:end].mean(axis=0)
    recent_LE = counts_TLE[end - patches.window:end].mean(axis=0)
    rng = np.random.default_rng(seed)
    cases = [("patch, the trace's next steps, no drift swaps", recent_LE, False),
             ("patch, the trace's next steps", recent_LE, True)]
    for share in BURST_SHARES:
        layers = rng.choice(shape["layers"], max(1, round(share * shape["layers"])), replace=False)
        burst_LE = recent_LE.copy()
        burst_LE[layers, rng.integers(0, shape["experts"], len(layers))] *= BURST_FACTOR
        cases.append((f"patch, a {BURST_FACTOR:g}x burst in {len(layers)} of {shape['layers']} layers", burst_LE, True))
    for name, load_LE, swapping in cases:
        planner = PatchPlanner(patches, refit.placement)  # what rank 0's planner holds once the refit switched
        planner.refit(refit.followed)
        job = planner.job(load_LE, drift_LE if swapping and patches.drift_swaps else None)
        answer, seconds = timed(lambda: solve(None, refit.placement, "cpsat", options, None, transfer, patch=job))
        rows.append(job_row(name, answer, seconds, refit.placement, step_ms))
        if name == "patch, the trace's next steps":
            first_patch, first_planner = answer, planner
    first_planner.measured(first_patch.swap_seconds_per_layer)
    serving = refit.placement
    if not first_patch.kept:  # the steady patches start from the first one as it switched
        first_planner.landed(first_patch.followed)
        serving = first_patch.placement
    rows += steady_rows(counts_TLE, end, serving, first_planner, config, options, transfer, step_ms)
    for row in rows:
        row.update({"gpus": num_gpus, "slots_per_gpu": slots,
                    "seconds_vs_refit": round(row["seconds"] / rows[0]["seconds"], 4),
                    "bytes_vs_refit": round(row["bytes"] / max(rows[0]["bytes"], 1), 4)})
    return rows


def steady_rows(counts_TLE: np.ndarray, end: int, serving: Placement, planner: PatchPlanner,
                config: RebalanceConfig, options: dict, transfer: TransferShape, step_ms: float) -> list[dict]:
    """The steady patches after the first (see the module docstring), planned by `planner` from `serving` on, each
    row with the layers' stride and the swaps' seconds per layer, then a row of their medians with the pace of
    overlapping patches at them."""
    patches = planner.settings
    rows = []
    for turn in range(1, STEADY + 1):
        seen = end + turn * patches.every
        stride = planner.stride
        drift_LE = counts_TLE[seen - patches.drift_window:seen].mean(axis=0) if patches.drift_swaps else None
        job = planner.job(counts_TLE[seen - patches.window:seen].mean(axis=0), drift_LE)
        answer, seconds = timed(lambda: solve(None, serving, "cpsat", options, None, transfer, patch=job))
        row = job_row(f"steady patch {turn}", answer, seconds, serving, step_ms)
        prepare_ms = None if answer.kept else prepare_ms_per_layer(
            serving, answer.placement, config.failures_tolerated_for(serving.cluster.num_gpus))
        row.update({"drift_stride": stride, "swap_ms_per_layer": None if answer.swap_seconds_per_layer is None
                    else round(answer.swap_seconds_per_layer * 1000, 2),
                    "prepare_ms_per_layer": None if prepare_ms is None else round(prepare_ms, 3)})
        rows.append(row)
        planner.measured(answer.swap_seconds_per_layer)
        if not answer.kept:
            serving = answer.placement
            planner.landed(answer.followed)
    return rows + [steady_median(rows)]


def steady_median(rows: list[dict]) -> dict:
    """The steady patches' medians (rounded up where a median falls between two jobs) and the pace overlapping
    patches keep at them: a patch every max(M + 1, job steps + 1) steps, landing job steps + M + 2 after its load."""
    keys = ("slots_moved", "slot_fills", "host_copy_fills", "bytes", "rounds", "changed_layers", "moving_steps",
            "steps_to_switch", "drift_stride")
    median = {key: math.ceil(float(np.median([row[key] for row in rows]))) for key in keys}
    median["seconds"] = float(np.median([row["seconds"] for row in rows]))
    job_steps = math.ceil(median["seconds"] * 1000 / rows[0]["step_ms"])
    every, lag = max(median["moving_steps"] + 1, job_steps + 1), job_steps + median["moving_steps"] + 2
    early = [row["steps_to_burst_layers"] for row in rows if row["steps_to_burst_layers"] is not None]
    # The patches' burst layers: the median of the patches that have some, rounded up; a live patch's land after
    # the last patch's layers, so never before lag - every + 1 (the model's range, `PatchPace.burst_lag`).
    burst_lag = None if not early else min(lag, max(lag - every + 1, math.ceil(float(np.median(early)))))
    prepared = [row["prepare_ms_per_layer"] for row in rows if row["prepare_ms_per_layer"] is not None]
    median["prepare_ms_per_layer"] = round(float(np.median(prepared)), 3) if prepared else None
    median.update({"job": f"steady patches (median of {STEADY})", "kept": False, "seconds": round(median["seconds"], 3),
                   "burst_layers": math.ceil(float(np.median([row["burst_layers"] for row in rows]))),
                   "steps_to_burst_layers": burst_lag, "pace_every": every, "pace_lag": lag,
                   "pace_burst_lag": burst_lag, "step_ms": rows[0]["step_ms"]})
    return median


def live_pace(num_gpus: int, slots: int, quick: bool = False, step_ms: float = 50.0,
              seed: int = 0) -> tuple[PatchSettings, PatchPace]:
    """The patch settings and pace a live group's steady patches keep at this shape on this machine (`STEADY`
    patches' medians, `measure_cluster`), as `rolling_replay` takes them: the spacing, the stride the swap budget set,
    the lag and the burst layers' lag."""
    median = measure_cluster(num_gpus, slots, QUICK if quick else FULL, step_ms, seed)[-1]
    settings = PatchSettings(every=median["pace_every"], drift_stride=median["drift_stride"])
    return settings, PatchPace(lag=median["pace_lag"], burst_lag=median["pace_burst_lag"])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.gpus) != len(args.slots_per_gpu):
        parser.error("--gpus and --slots-per-gpu need as many values each")
    shape = QUICK if args.quick else FULL
    if not all(shape["experts"] <= gpus * slots <= MAX_SLOTS for gpus, slots in zip(args.gpus, args.slots_per_gpu)):
        parser.error(f"each cluster's --gpus x --slots-per-gpu must be in [{shape['experts']}, {MAX_SLOTS}] slots "
                     f"(a slot for every expert)")
    if args.max_bytes_per_step * 2**20 < 1:
        parser.error(f"--max-bytes-per-step must be at least a byte ({1 / 2**20:g} MiB); got {args.max_bytes_per_step}")
    import_solving_modules("cpsat", None)  # as the helper does at start: no import inside a timed job
    patches = PatchSettings(drift_stride=args.patch_drift_stride, drift_window=args.patch_drift_window,
                            swap_budget_s=args.patch_swap_budget or None)
    config = RebalanceConfig(patches=patches, max_bytes_per_step=round(args.max_bytes_per_step * 2**20))
    rows = [row for gpus, slots in zip(args.gpus, args.slots_per_gpu)
            for row in measure_cluster(gpus, slots, shape, args.step_ms, args.seed, config)]
    print(f"{shape['layers']} layers x {shape['experts']} experts, top-{shape['top_k']}, {TOKENS_PER_GPU} tokens per "
          f"GPU a step; steps to switch at {args.step_ms:g} ms a step; drift swaps toward the last "
          f"{patches.drift_window} steps, drift stride at least {patches.drift_stride}, swaps' budget "
          f"{patches.swap_budget_s} s, "
          f"{config.max_bytes_per_step / 2**20:g} MiB a rank between two steps")
    print("| GPUs x slots | job | seconds | vs refit | slots moved | slot / host-copy fills | GB moved | vs refit "
          "| rounds | changed layers | steps to switch | burst layers | steps to their switch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['gpus']} x {row['slots_per_gpu']} | {row['job']}{' (kept)' if row['kept'] else ''} | "
              f"{row['seconds']:.2f} | {row['seconds_vs_refit']:.3f} | {row['slots_moved']} | {row['slot_fills']} / "
              f"{row['host_copy_fills']} | {row['bytes'] / 1e9:.2f} | {row['bytes_vs_refit']:.3f} | {row['rounds']} | "
              f"{row['changed_layers']} | {row['steps_to_switch']} | {row['burst_layers']} | "
              f"{'-' if row['steps_to_burst_layers'] is None else row['steps_to_burst_layers']} |")
    for row in rows:
        if "pace_every" in row:
            print(f"{row['gpus']} x {row['slots_per_gpu']}: steady patches, drift stride {row['drift_stride']}, "
                  f"overlapping: a patch every {row['pace_every']} steps, each {row['pace_lag']} after its load "
                  f"(PatchSettings(every={row['pace_every']}, drift_stride={row['drift_stride']}), "
                  f"PatchPace(lag={row['pace_lag']}, burst_lag={row['pace_burst_lag']})); tables and host-copy list "
                  f"{row['prepare_ms_per_layer']} ms a changed layer")
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
