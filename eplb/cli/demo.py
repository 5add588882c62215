"""The main job on an embedded default, with no argument needed.

It synthesises a full-shape decode trace of request-level traffic, as the simulator's default is (61 layers x 256
experts (--layers fewer), top-8, 8,192 tokens per step: 128 tokens per GPU on 64 GPUs; requests that keep their own
experts for their whole output, under continuous batching, at the popularity skew fitted on TensorRT-LLM's
no-balancing figure), and replays it on 64 GPUs x 5 slots, refitting every 50 steps on the last 50: with no
balancing and with DeepSeek's greedy under static and dynamic routing, and with this project's `cpsat` policy under
dynamic routing (--work-limit units per refit of the whole model). Each placement is scored on the steps it was
fitted on ("fitted") and on the steps that follow ("held-out"); "dynamic" takes each step's best split of an
expert's tokens over its replicas, "live" the split the live router makes (`route_step`, whole tokens). Beside each
row: the same replay on tokens drawn independently at the same shape and skew (`traces.synthetic`, the first
TOKENS_STEPS steps), the traffic most balancer benchmarks use. It writes the request-level trace, its last `cpsat`
placement, three figures to --out-dir, and prints a table.
"""

import argparse
import time
from pathlib import Path

import numpy as np

from eplb.cli.commands import emit, plot_before_after
from eplb.cli.progress import Progress
from eplb.cli.report import format_table
from placement import ClusterSpec, rolling_replay, save_placement
from placement.replay import ReplayResult
from traces import save_trace
from traces.request_traffic import RequestTrafficConfig, generate_request_traffic
from traces.synthetic import SyntheticConfig, generate_trace

DEMO_CLUSTER = ClusterSpec(num_gpus=64, slots_per_gpu=5)
DEMO_LAYERS, DEMO_EXPERTS, DEMO_TOKENS = 61, 256, 8192  # DeepSeek-V3's MoE layers and experts; tokens a step
DEMO_EVERY = 50
DEMO_WINDOW = 50
TOKENS_STEPS = 100  # steps of the independent-token trace beside: one refit, 50 held-out steps
JOBS = (("trivial", "static"), ("trivial", "dynamic"), ("deepseek", "static"), ("deepseek", "dynamic"),
        ("cpsat", "dynamic"))
BESIDE = "independent tokens"


def _replays(counts_TLE: np.ndarray, solver: dict, tick) -> tuple[list[dict], dict[str, ReplayResult]]:
    """Rows of every job's fitted and held-out scores on `counts_TLE` [T, L, E] (cpsat's also under the live router),
    and each balancing job's replay by "policy, routing"."""
    rows, replays = [], {}
    for policy, routing in JOBS:
        replay = rolling_replay(counts_TLE, DEMO_CLUSTER, policy, DEMO_EVERY, DEMO_WINDOW, routing,
                                solver if policy == "cpsat" else None,
                                also_routings=("live",) if policy == "cpsat" else ())
        rows.append({"policy": policy, "routing": routing, "fit": "fitted", **replay.fitted.summary()})
        rows.append({"policy": policy, "routing": routing, "fit": "held-out", **replay.held_out.summary()})
        for name, scores in replay.held_out_also.items():
            rows.append({"policy": policy, "routing": name, "fit": "held-out", **scores.summary()})
        if policy != "trivial":
            replays[f"{policy}, {routing}"] = replay
        tick()
    return rows, replays


def cmd_demo(args: argparse.Namespace) -> int:
    from eplb.cli import plots  # matplotlib is imported only by what draws
    from sim.calibration import fitted  # the simulator's calibration, read only when the demo runs
    out = Path(args.out_dir)
    began = time.perf_counter()
    skew = fitted("traffic.skew")
    trace = generate_request_traffic(RequestTrafficConfig(
        mode="decode", num_steps=args.steps, num_layers=args.layers, num_experts=DEMO_EXPERTS, top_k=8,
        tokens_per_step=DEMO_TOKENS, skew=skew))
    save_trace(trace, out / "trace.npz")
    tokens_TLE = generate_trace(SyntheticConfig(
        num_steps=min(args.steps, TOKENS_STEPS), num_layers=args.layers, num_experts=DEMO_EXPERTS, top_k=8,
        tokens_per_step=DEMO_TOKENS, skew=skew)).counts_TLE
    budget = {"work_limit": args.work_limit} if args.time_limit is None else {"time_limit_s": args.time_limit}
    solver = {"routing": "dynamic", **budget}
    progress = Progress("demo", enabled=not (args.json or args.quiet))
    callback, done = progress.callback(), [0]

    def tick() -> None:
        done[0] += 1
        callback(done[0], 2 * len(JOBS))

    rows, replays = _replays(trace.counts_TLE, solver, tick)
    beside_rows, _ = _replays(tokens_TLE, solver, tick)
    progress.close()
    beside = {(r["policy"], r["routing"], r["fit"]): r["imbalance_mean"] for r in beside_rows}
    for row in rows:
        row[BESIDE] = f"{beside[row['policy'], row['routing'], row['fit']]:.3f}"
    replay = replays["cpsat, dynamic"]
    placement, last_window = replay.last, trace.counts_TLE[slice(*replay.fit_windows[-1])]
    save_placement(placement, out / "placement.json")
    plots.plot_load_heatmap(trace.load_LE(), out / "load_heatmap.png",
                            title=f"Expert load, request-level {args.layers} x {DEMO_EXPERTS}")
    plot_before_after(placement, last_window, out / "gpu_loads.png")
    plots.plot_imbalance_over_time(
        {name: r.held_out.imbalance_TL.mean(axis=1) for name, r in replays.items()}, out / "replay.png",
        refit_steps=[s - DEMO_WINDOW for s in replay.refit_steps],
        lower_bound_T=replay.held_out.lower_bound_TL.mean(axis=1),
        title=f"Rolling replay: refit every {DEMO_EVERY} steps on the last {DEMO_WINDOW}")
    seconds = time.perf_counter() - began
    header = (f"request-level decode trace: {trace.num_steps} steps x {args.layers} layers x {DEMO_EXPERTS} experts, "
              f"top-8, {DEMO_TOKENS} tokens/step, popularity skew {skew:.3f}; cluster 64 GPUs x 5 slots; last "
              f"column: the mean on independent tokens, same shape and skew, {tokens_TLE.shape[0]} steps; "
              f"{seconds:.0f} s\n")
    footer = f"\nwrote {out}/trace.npz, placement.json, load_heatmap.png, gpu_loads.png, replay.png"
    emit(args, {"out_dir": str(out), "rows": rows, "independent_tokens_rows": beside_rows, "seconds": seconds},
         header + format_table(rows, ("policy", "routing", "fit"), after_keys=(BESIDE,)) + footer)
    return 0
