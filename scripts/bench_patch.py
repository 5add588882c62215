"""What a burst patch costs a live group at the full shape, against a refit measured in the same process.

Per cluster (64 GPUs x 5 slots and 128 x 3 by default; 61 layers x 256 experts, top-8, 128 tokens per GPU a step,
`traces.synthetic`'s drifting trace with bursts), rank 0's background jobs as the `Rebalancer` submits them
(`eplb.rebalance.background_solver.solve`), each from the placement serving to the next:

- refit (the baseline): `cpsat` with the `RebalanceConfig` defaults (1 s budget, good_enough 1.001, dynamic
  routing) on the window of steps [W, 2W), from a placement fitted the same way on [0, W), every fit moved to
  (min_gain 0), as a refit that switches;
- patches, from that refit's placement as it switched to it (what rank 0's patches start from, its layers rings in
  the order of the refit's GPU map), planned against it (`PatchRequest` with the config's patch_moves,
  patch_threshold and patch_swaps, the drift swaps in the layers whose turn it is in the first patch after a refit, patch_drift_stride) on
  the mean of the next `patch_drift_window` steps (the drift swaps') and of the last `patch_window` of them (the burst
  moves'): as the trace has them (also without drift swaps, patch_swaps 0), then with one random expert per layer 4x
  as popular in the burst moves' steps in a share of the layers (a burst in 10% and in every layer);
- patches adopting the refit (`RebalanceConfig.refit_adopt_layers`): from the placement serving before it, a patch
  that takes 1 and 4 of its layers, the ones it gains most on, with its drift swaps and burst moves;
- steady patches: from the first patch with drift swaps as it switched, `STEADY` more, `patch_every` steps apart on
  the trace, each from the last one's placement and drift swaps (as rank 0 keeps them), its layers' turns at drift
  swaps set by the last one's swap seconds and `patch_swap_budget_s` (`drift_stride_for`), as the `Rebalancer` runs
  them; then their medians, and the pace overlapping patches keep at them (`patch_overlap`: with M the moving steps,
  `eplb.rebalance.attempt.moving_steps`, a patch every max(M + 1, job steps + 1) steps, landing job steps + M + 2
  after the load it saw; docs/benchmarks.md, "Patches at a live group's pace"), the `PatchConfig(lag, every)` that
  models it in `eplb replay` and `scripts/bench_forecast.py`.

Per job: its seconds (the solve and the weight moves' plan, on this machine's cores), the slots that change expert,
the fills (slots, and host copies the new placement wants), the bytes moved and the rounds at the config's
`max_bytes_per_step` for DeepSeek-V3's experts (hidden 7168, intermediate 2048, FP8), the layers the switch must build
tables for (a few a step, `eplb.rebalance.attempt.layers_per_step`), and the steps from the job's start to the switch
at a decode step of `--step-ms`: the job, the step that broadcasts the answer and posts the first round, the moving
steps M after it (the rounds, or the steps preparing the changed layers where those take longer: they run together),
one for the switch; and the patch's layers whose burst moves come or go, planned first, with the steps to their own
switch (each layer switches as its weights land: the job, the broadcast's step, their last round and one for its
completion, the switch), the steady medians' `PatchConfig.burst_lag`; and per steady patch the milliseconds per changed
layer to build its routing tables and host-copy list on this CPU (`Attempt.prepare_layers`' work, a few layers a
step beside the rounds). Ratios against the refit: seconds and bytes.

Usage: python scripts/bench_patch.py [--gpus 64 128] [--slots-per-gpu 5 3] [--max-bytes-per-step 64]
       [--patch-drift-window 30] [--quick] [--json FILE]
"""

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from eplb.live.replica_assignment import ReplicaTables
from eplb.rebalance.attempt import (changed_layers, last_rounds, layer_switch_steps, layers_per_step,
                                    moving_steps)
from eplb.rebalance.background_solver import (PatchRequest, SolveResult, drift_stride_for,
                                              import_solving_modules, solve)
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.move_plan import KINDS, TransferShape, backup_wanted
from placement import ClusterSpec, Placement, fit_placement
from placement.drift_swaps import layers_in_turn
from traces.atomic_file import write_text_atomically
from traces.synthetic import SyntheticConfig, generate_trace

FULL = {"layers": 61, "experts": 256, "top_k": 8, "window": 100}
QUICK = {"layers": 4, "experts": 32, "top_k": 4, "window": 20}
EXPERT = {"hidden_size": 7168, "intermediate_size": 2048, "element_size": 1}  # DeepSeek-V3's routed expert, FP8
TOKENS_PER_GPU = 128
BURST_FACTOR = 4.0
BURST_SHARES = (0.1, 1.0)  # shares of the layers a burst is added to
ADOPTED = (1, 4)  # layers of the refit a patch adopts, in the rows of refits the patches adopt
STEADY = 6  # steady patches after the first, each from the last


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 128], help="GPUs of each cluster")
    parser.add_argument("--slots-per-gpu", type=int, nargs="+", default=[5, 3], help="slots per GPU of each cluster")
    parser.add_argument("--step-ms", type=float, default=50.0, help="decode step time for the steps to a switch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--patch-drift-stride", type=int, default=RebalanceConfig().patch_drift_stride, metavar="K",
                        help="RebalanceConfig.patch_drift_stride, the least stride of the layers' turns at drift swaps "
                             "(default %(default)s)")
    parser.add_argument("--patch-drift-window", type=int, default=RebalanceConfig().patch_drift_window,
                        metavar="STEPS",
                        help="RebalanceConfig.patch_drift_window, the steps whose mean load the drift swaps follow "
                             "(default %(default)s)")
    parser.add_argument("--patch-swap-budget", type=float, default=RebalanceConfig().patch_swap_budget_s,
                        metavar="SECONDS",
                        help="RebalanceConfig.patch_swap_budget_s (default %(default)s; 0: none, the stride stays "
                             "--patch-drift-stride)")
    parser.add_argument("--max-bytes-per-step", type=float, default=RebalanceConfig().max_bytes_per_step / 2**20,
                        metavar="MIB",
                        help="RebalanceConfig.max_bytes_per_step in MiB, each rank's weight bytes between two decode "
                             "steps, which sets the rounds (default %(default)g)")
    parser.add_argument("--quick", action="store_true", help="a small shape (4 layers x 32 experts), for tests")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
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
            "burst_layers": len(first), "steps_to_burst_layers": burst_steps}


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
    window = shape["window"]
    seen = max(config.patch_window, config.patch_drift_window)
    end = 2 * window + seen  # the first patches see the steps up to here; the steady ones the steps after
    trace = generate_trace(SyntheticConfig(num_steps=end + STEADY * config.patch_every, num_layers=shape["layers"],
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
    fitted = refit.followed  # what rank 0's patches start from: the refit as relabelled, rings in its GPU map's order
    drift_LE = counts_TLE[end - config.patch_drift_window:end].mean(axis=0)
    recent_LE = counts_TLE[end - config.patch_window:end].mean(axis=0)
    rng = np.random.default_rng(seed)
    cases = [("patch, the trace's next steps, no drift swaps", recent_LE, 0), ("patch, the trace's next steps",
                                                                             recent_LE, config.patch_swaps)]
    for share in BURST_SHARES:
        layers = rng.choice(shape["layers"], max(1, round(share * shape["layers"])), replace=False)
        burst_LE = recent_LE.copy()
        burst_LE[layers, rng.integers(0, shape["experts"], len(layers))] *= BURST_FACTOR
        cases.append((f"patch, a {BURST_FACTOR:g}x burst in {len(layers)} of {shape['layers']} layers", burst_LE,
                      config.patch_swaps))
    for name, load_LE, swaps in cases:
        request = PatchRequest(load_LE, fitted, config.patch_moves, config.patch_threshold,
                               drift_LE if swaps else None, swaps,
                               layers_in_turn(shape["layers"], config.patch_drift_stride, 0), refit.ring_order_LG)
        answer, seconds = timed(lambda: solve(None, refit.placement, "cpsat", options, None, transfer, patch=request))
        rows.append(job_row(name, answer, seconds, refit.placement, step_ms))
        if name == "patch, the trace's next steps":
            first_patch = answer
    # Refits the patches adopt (`refit_adopt_layers`): from the placement serving before the refit, a patch that
    # adopts the refit's `count` layers it gains most on (with its drift swaps and burst moves, as any patch).
    order = np.argsort(-refit.layer_gains_L, kind="stable")
    for count in ADOPTED:
        request = PatchRequest(recent_LE, start, config.patch_moves, config.patch_threshold, drift_LE,
                               config.patch_swaps, layers_in_turn(shape["layers"], config.patch_drift_stride, 0),
                               None, refit.followed, order[:count], refit.ring_order_LG[0], 1)
        answer, seconds = timed(lambda: solve(None, start, "cpsat", options, None, transfer, patch=request))
        rows.append(job_row(f"patch adopting {count} of the refit's layers", answer, seconds, start, step_ms))
    if first_patch.kept:  # nothing to swap or move: the steady patches start from the refit
        first_patch = dataclasses.replace(first_patch, placement=refit.placement, followed=refit.followed,
                                          ring_order_LG=refit.ring_order_LG)
    rows += steady_rows(counts_TLE, end, first_patch, config, options, transfer, step_ms)
    for row in rows:
        row.update({"gpus": num_gpus, "slots_per_gpu": slots,
                    "seconds_vs_refit": round(row["seconds"] / rows[0]["seconds"], 4),
                    "bytes_vs_refit": round(row["bytes"] / max(rows[0]["bytes"], 1), 4)})
    return rows


def steady_rows(counts_TLE: np.ndarray, end: int, first: SolveResult, config: RebalanceConfig, options: dict,
                transfer: TransferShape, step_ms: float) -> list[dict]:
    """The steady patches after `first` (see the module docstring), each row with the layers' stride and the swaps'
    seconds per layer, then a row of their medians with the pace of overlapping patches at them."""
    num_layers = counts_TLE.shape[1]
    serving, followed, ring_order_LG, last = first.placement, first.followed, first.ring_order_LG, first
    rows = []
    for turn in range(1, STEADY + 1):
        seen = end + turn * config.patch_every
        stride = drift_stride_for(last.swap_seconds_per_layer, num_layers, config.patch_swap_budget_s,
                                  config.patch_drift_stride)
        request = PatchRequest(counts_TLE[seen - config.patch_window:seen].mean(axis=0), followed,
                               config.patch_moves, config.patch_threshold,
                               counts_TLE[seen - config.patch_drift_window:seen].mean(axis=0), config.patch_swaps,
                               layers_in_turn(num_layers, stride, turn), ring_order_LG)
        answer, seconds = timed(lambda: solve(None, serving, "cpsat", options, None, transfer, patch=request))
        row = job_row(f"steady patch {turn}", answer, seconds, serving, step_ms)
        prepare_ms = None if answer.kept else prepare_ms_per_layer(
            serving, answer.placement, config.failures_tolerated_for(serving.cluster.num_gpus))
        row.update({"drift_stride": stride, "swap_ms_per_layer": None if answer.swap_seconds_per_layer is None
                    else round(answer.swap_seconds_per_layer * 1000, 2),
                    "prepare_ms_per_layer": None if prepare_ms is None else round(prepare_ms, 3)})
        rows.append(row)
        if answer.swap_seconds_per_layer is not None:
            last = answer
        if not answer.kept:
            serving, followed, ring_order_LG = answer.placement, answer.followed, answer.ring_order_LG
    median = {key: float(np.median([row[key] for row in rows])) for key in
              ("seconds", "slots_moved", "slot_fills", "host_copy_fills", "bytes", "rounds", "changed_layers",
               "moving_steps", "steps_to_switch", "drift_stride")}
    for key in ("slots_moved", "slot_fills", "host_copy_fills", "bytes", "rounds", "changed_layers", "moving_steps",
                "steps_to_switch", "drift_stride"):
        median[key] = math.ceil(median[key])  # a median between two jobs, rounded up
    job_steps = math.ceil(median["seconds"] * 1000 / step_ms)
    every, lag = max(median["moving_steps"] + 1, job_steps + 1), job_steps + median["moving_steps"] + 2
    early = [row["steps_to_burst_layers"] for row in rows if row["steps_to_burst_layers"] is not None]
    # The patches' burst layers: the median of the patches that have some, rounded up; a live patch's land after
    # the last patch's layers, so never before lag - every + 1 (the model's range, `PatchConfig.burst_lag`).
    burst_lag = None if not early else min(lag, max(lag - every + 1, math.ceil(float(np.median(early)))))
    prepared = [row["prepare_ms_per_layer"] for row in rows if row["prepare_ms_per_layer"] is not None]
    median["prepare_ms_per_layer"] = round(float(np.median(prepared)), 3) if prepared else None
    median.update({"job": f"steady patches (median of {STEADY})", "kept": False, "seconds": round(median["seconds"], 3),
                   "burst_layers": math.ceil(float(np.median([row["burst_layers"] for row in rows]))),
                   "steps_to_burst_layers": burst_lag, "pace_every": every, "pace_lag": lag,
                   "pace_burst_lag": burst_lag})
    return rows + [median]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.gpus) != len(args.slots_per_gpu):
        print("bench_patch: --gpus and --slots-per-gpu need as many values each", file=sys.stderr)
        return 2
    import_solving_modules("cpsat", None)  # as the helper does at start: no import inside a timed job
    shape = QUICK if args.quick else FULL
    if (args.patch_drift_stride < 1 or args.patch_drift_window < 1 or args.patch_swap_budget < 0
            or args.max_bytes_per_step * 2**20 < 1):
        print("bench_patch: --patch-drift-stride and --patch-drift-window must be >= 1, --patch-swap-budget >= 0 and "
              "--max-bytes-per-step above 0", file=sys.stderr)
        return 2
    config = RebalanceConfig(patch_drift_stride=args.patch_drift_stride, patch_drift_window=args.patch_drift_window,
                             patch_swap_budget_s=args.patch_swap_budget or None,
                             max_bytes_per_step=round(args.max_bytes_per_step * 2**20))
    rows = [row for gpus, slots in zip(args.gpus, args.slots_per_gpu)
            for row in measure_cluster(gpus, slots, shape, args.step_ms, args.seed, config)]
    print(f"{shape['layers']} layers x {shape['experts']} experts, top-{shape['top_k']}, {TOKENS_PER_GPU} tokens per "
          f"GPU a step; steps to switch at {args.step_ms:g} ms a step; drift swaps toward the last "
          f"{config.patch_drift_window} steps, drift stride at least {config.patch_drift_stride}, swaps' budget "
          f"{config.patch_swap_budget_s} s, "
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
                  f"(PatchConfig(lag={row['pace_lag']}, every={row['pace_every']}, drift_stride={row['drift_stride']}, "
                  f"burst_lag={row['pace_burst_lag']})); tables and host-copy list "
                  f"{row['prepare_ms_per_layer']} ms a changed layer")
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
