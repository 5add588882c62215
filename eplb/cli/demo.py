"""The main job on an embedded default, with no argument needed.

It synthesises a full-shape decode trace (61 layers x 256 experts, top-8, 8,192 tokens per step: 128 tokens
per GPU on 64 GPUs) and replays it on 64 GPUs x 5 slots, refitting every 50 steps on the last 50: with no
balancing and with DeepSeek's greedy under static and dynamic routing, and with this project's `cpsat` policy
under dynamic routing (--work-limit units per refit of the whole model). Each placement is scored on the steps
it was fitted on ("fitted") and on the steps that follow ("held-out"); "dynamic" takes each step's best split of
an expert's tokens over its replicas, "live" the split the live router makes (`route_step`, whole tokens). It
writes the trace, the last `cpsat` placement, three figures to --out-dir, and prints a table.
"""

import argparse
import time
from pathlib import Path

from eplb.cli.commands import emit, plot_before_after
from eplb.cli.progress import Progress
from eplb.cli.report import format_table
from placement import ClusterSpec, rolling_replay, save_placement
from traces import save_trace
from traces.synthetic import SyntheticConfig, generate_trace

DEMO_CLUSTER = ClusterSpec(num_gpus=64, slots_per_gpu=5)
DEMO_LAYERS, DEMO_EXPERTS = 61, 256  # DeepSeek-V3's MoE layers and routed experts
DEMO_EVERY = 50
DEMO_WINDOW = 50


def cmd_demo(args: argparse.Namespace) -> int:
    from eplb.cli import plots  # matplotlib is imported only by what draws
    out = Path(args.out_dir)
    began = time.perf_counter()
    config = SyntheticConfig(num_steps=args.steps, num_layers=DEMO_LAYERS, num_experts=DEMO_EXPERTS, top_k=8,
                             tokens_per_step=8192)
    trace = generate_trace(config)
    save_trace(trace, out / "trace.npz")
    counts = trace.counts_TLE
    rows, series = [], {}
    progress = Progress("demo", enabled=not (args.json or args.quiet))
    tick = progress.callback()
    jobs = [(policy, routing) for policy in ("trivial", "deepseek") for routing in ("static", "dynamic")]
    jobs.append(("cpsat", "dynamic"))
    budget = {"work_limit": args.work_limit} if args.time_limit is None else {"time_limit_s": args.time_limit}
    solver = {"routing": "dynamic", **budget}
    refit_steps: list[int] = []
    for done, (policy, routing) in enumerate(jobs, 1):
        also = ("live",) if policy == "cpsat" else ()
        replay = rolling_replay(counts, DEMO_CLUSTER, policy, DEMO_EVERY, DEMO_WINDOW, routing,
                                solver if policy == "cpsat" else None, also_routings=also)
        rows.append({"policy": policy, "routing": routing, "fit": "fitted", **replay.fitted.summary()})
        rows.append({"policy": policy, "routing": routing, "fit": "held-out", **replay.held_out.summary()})
        for name, scores in replay.held_out_also.items():
            rows.append({"policy": policy, "routing": name, "fit": "held-out", **scores.summary()})
        if policy != "trivial":
            series[f"{policy}, {routing}"] = replay.held_out.imbalance_TL.mean(axis=1)
            refit_steps = [s - DEMO_WINDOW for s in replay.refit_steps]
            bound_T = replay.held_out.lower_bound_TL.mean(axis=1)
        tick(done, len(jobs))
    progress.close()
    placement, last_window = replay.last, counts[slice(*replay.fit_windows[-1])]
    save_placement(placement, out / "placement.json")
    plots.plot_load_heatmap(trace.load_LE(), out / "load_heatmap.png", title="Expert load, synthetic 61 x 256")
    plot_before_after(placement, last_window, out / "gpu_loads.png")
    plots.plot_imbalance_over_time(series, out / "replay.png", refit_steps=refit_steps, lower_bound_T=bound_T,
                                   title=f"Rolling replay: refit every {DEMO_EVERY} steps on the last {DEMO_WINDOW}")
    seconds = time.perf_counter() - began
    header = (f"synthetic trace: {trace.num_steps} steps x 61 layers x 256 experts, top-8, 8192 tokens/step; "
              f"cluster 64 GPUs x 5 slots; {seconds:.0f} s\n")
    footer = f"\nwrote {out}/trace.npz, placement.json, load_heatmap.png, gpu_loads.png, replay.png"
    emit(args, {"out_dir": str(out), "rows": rows, "seconds": seconds},
         header + format_table(rows, ("policy", "routing", "fit")) + footer)
    return 0
