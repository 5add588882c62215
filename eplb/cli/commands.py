"""The `eplb` subcommands: each takes the parsed arguments and returns the process exit status."""

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

from eplb.cli.node_layout import gpus_per_node
from eplb.cli.progress import Progress
from eplb.cli.report import format_table, yardstick_lines
from eplb.cli.sglang_out import check_sglang_layers, sglang_model_layers
from eplb.cli.synth_checks import check_mode_flags, check_work
from eplb.cli.trtllm_output import trtllm_layer_ids, trtllm_scores, write_trtllm
from eplb.engines.sglang.expert_map import save_sglang_mapping
from placement import (
    ClusterSpec,
    Placement,
    PlacementInfeasibleError,
    burst_exposure,
    fit_placement,
    load_placement,
    rolling_replay,
    save_placement,
    score_placement,
    static_gpu_loads,
)
from placement.imbalance_metrics import group_metric
from placement.migration import oblivious_moves, plan_migration
from placement.patch_planner import PatchPace, PatchSettings
from placement.scoring import check_compatible
from placement.yardsticks import trace_yardsticks
from traces import RoutingTrace, TraceFormatError, load_trace, save_trace
from traces.request_traffic import RequestTrafficConfig, generate_request_traffic
from traces.synthetic import SyntheticConfig, generate_trace

logger = logging.getLogger(__name__)


def read_trace(args: argparse.Namespace) -> RoutingTrace:
    """The trace named by --trace, narrowed to --steps START:STOP when given."""
    tasks = args.task.split(",") if args.task is not None else None
    trace = load_trace(args.trace, tokens_per_step=args.tokens_per_step, tasks=tasks, num_experts=args.num_experts)
    if getattr(args, "steps", None):
        start, stop = parse_step_range(args.steps, trace.num_steps)
        trace = trace.steps(start, stop)
    logger.info("read %s: %d steps x %d layers x %d experts", args.trace, *trace.counts_TLE.shape)
    return trace


def parse_step_range(text: str, num_steps: int) -> tuple[int, int]:
    """'A:B' -> (A, B) within [0, num_steps]; either side may be empty."""
    try:
        left, right = text.split(":")
        start = int(left) if left else 0
        stop = int(right) if right else num_steps
    except ValueError:
        raise TraceFormatError(f"--steps must look like START:STOP (e.g. 0:500); got {text!r}") from None
    if start >= stop:
        raise TraceFormatError(f"--steps {text} selects no step; START must be below STOP (e.g. 0:500)")
    if not 0 <= start < stop <= num_steps:
        raise TraceFormatError(f"--steps {text} is outside the trace's {num_steps} steps")
    return start, stop


def cluster_from(args: argparse.Namespace, current: Placement | None = None) -> ClusterSpec:
    """The cluster of --gpus, --slots-per-gpu and --gpus-per-node (left out: `node_layout.gpus_per_node`, which
    takes the node size of `current`, the placement now serving, where it has as many GPUs)."""
    return ClusterSpec(num_gpus=args.gpus, slots_per_gpu=args.slots_per_gpu,
                       gpus_per_node=gpus_per_node(args, current.cluster if current is not None else None))


CPSAT_WORK_LIMIT, CPSAT_WORKERS, CPSAT_SEED = 20.0, 2, 0  # cpsat's defaults on the command line


def policy_options(args: argparse.Namespace) -> dict:
    """Keyword options of the chosen policy from the command line."""
    options: dict = {}
    if args.policy == "cpsat":
        # cpsat fits the live router's split when scored with either per-step routing.
        budget = {"time_limit_s": args.time_limit} if args.time_limit is not None else \
            {"work_limit": CPSAT_WORK_LIMIT if args.work_limit is None else args.work_limit}
        options = {**budget, "workers": CPSAT_WORKERS if args.workers is None else args.workers,
                   "seed": CPSAT_SEED if args.seed is None else args.seed,
                   "routing": "static" if args.routing == "static" else "dynamic"}
        if args.nodes_per_group is not None or args.groups is not None:
            options.update({"groups": args.groups, "nodes_per_group": args.nodes_per_group})
        if args.migration_cost:
            options["migration_cost"] = args.migration_cost
        return options
    given = [flag for flag, value in (("--work-limit", args.work_limit), ("--time-limit", args.time_limit),
                                      ("--workers", args.workers), ("--seed", args.seed),
                                      ("--nodes-per-group", args.nodes_per_group),
                                      ("--migration-cost", args.migration_cost or None)) if value is not None]
    if given:
        one = len(given) == 1
        raise PlacementInfeasibleError(f"{', '.join(given)} {'applies' if one else 'apply'} only to --policy cpsat, "
                                       f"not {args.policy}; drop {'it' if one else 'them'} or use --policy cpsat")
    if args.groups is None:
        return options
    if args.policy != "deepseek":
        raise PlacementInfeasibleError(f"--groups applies only to --policy deepseek or cpsat, not {args.policy}")
    return {"num_groups": args.groups}


def emit(args: argparse.Namespace, result: dict, table: str) -> None:
    """Print one JSON object under --json, else the human table.

    A reader that closed the pipe early (`eplb ... | head`) does not want the rest: stdout goes to /dev/null and
    the command still writes its files.
    """
    try:
        if args.json:
            print(json.dumps(result, sort_keys=True), flush=True)
        elif not args.quiet:
            print(table, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def mean_gpu_loads_LG(placement: Placement, counts_TLE: np.ndarray) -> np.ndarray:
    """[L, G] mean over steps of each GPU's static load."""
    return static_gpu_loads(counts_TLE, placement).mean(axis=0)


def plot_before_after(placement: Placement, counts_TLE: np.ndarray, path) -> None:
    """Per-GPU loads with no balancing (the `trivial` layout) beside `placement`'s, as a PNG at `path`."""
    from eplb.cli import plots  # matplotlib is imported only by what draws
    cluster = placement.cluster
    trivial = fit_placement("trivial", counts_TLE, cluster)
    plots.plot_gpu_loads(
        mean_gpu_loads_LG(trivial, counts_TLE),
        mean_gpu_loads_LG(placement, counts_TLE),
        path,
        labels=("no balancing", placement.policy or "placement"),
        title=f"Per-GPU load, {cluster.num_gpus} GPUs x {cluster.slots_per_gpu} slots",
    )


def synthetic_config(args: argparse.Namespace) -> SyntheticConfig:
    """The generator's config from `eplb synth`'s flags; a shape flag of the other popularity is refused."""
    lognormal = args.popularity == "lognormal"
    own, other = ("--skew", "--zipf-exponent") if lognormal else ("--zipf-exponent", "--skew")
    if (args.zipf_exponent if lognormal else args.skew) is not None:
        raise TraceFormatError(f"{other} does not apply to --popularity {args.popularity}; use {own} to shape it")
    shape = {"skew": args.skew} if lognormal else {"zipf_exponent": args.zipf_exponent}
    return SyntheticConfig(
        num_steps=args.steps,
        num_layers=args.layers,
        num_experts=args.experts,
        top_k=args.top_k,
        tokens_per_step=args.tokens_per_step,
        seed=args.seed,
        popularity=args.popularity,
        **{key: value for key, value in shape.items() if value is not None},
    )


REQUEST_FLAGS = {"concentration": "--concentration", "prompt_tokens": "--prompt-tokens",
                 "output_tokens": "--output-tokens", "tokens_per_request": "--tokens-per-request",
                 "request_trace": "--request-trace"}


def request_traffic_config(args: argparse.Namespace) -> RequestTrafficConfig:
    """`eplb synth --requests`'s config from its flags; Zipf popularity, a flag of the other mode and a run past its
    work bound are refused (`synth_checks`)."""
    if args.popularity != "lognormal" or args.zipf_exponent is not None:
        raise TraceFormatError("--requests draws lognormal popularity; drop --popularity zipf and --zipf-exponent, "
                               "and shape it with --skew")
    check_mode_flags(args)
    given = {key: getattr(args, key) for key in REQUEST_FLAGS if getattr(args, key) is not None}
    if args.request_trace is not None and not Path(args.request_trace).is_file():
        raise TraceFormatError(f"--request-trace {args.request_trace} not found; give a Mooncake .jsonl or Azure "
                               f".csv request trace")
    config = RequestTrafficConfig(
        mode=args.requests, num_steps=args.steps, num_layers=args.layers, num_experts=args.experts,
        top_k=args.top_k, tokens_per_step=args.tokens_per_step, seed=args.seed,
        **({"skew": args.skew} if args.skew is not None else {}), **given)
    check_work(config)
    return config


def cmd_synth(args: argparse.Namespace) -> int:
    from eplb.cli import plots  # matplotlib is imported only by what draws
    if args.requests is None:
        unused = [flag for key, flag in REQUEST_FLAGS.items() if getattr(args, key) is not None]
        if unused:
            raise TraceFormatError(f"{', '.join(unused)} shape request-level traffic; add --requests prefill or "
                                   f"--requests decode")
    config = synthetic_config(args) if args.requests is None else request_traffic_config(args)
    began = time.perf_counter()
    trace = generate_trace(config) if args.requests is None else generate_request_traffic(config)
    save_trace(trace, args.out)
    if args.plot:
        plots.plot_load_heatmap(trace.load_LE(), args.plot, title=f"Expert load: {Path(args.out).name}")
    logger.info("synthesised %d steps x %d layers x %d experts", *trace.counts_TLE.shape)
    result = {"out": str(args.out), "shape": list(trace.counts_TLE.shape), "seconds": time.perf_counter() - began}
    emit(args, result, f"wrote {args.out}: {trace.num_steps} steps x {trace.num_layers} layers x "
         f"{trace.num_experts} experts ({result['seconds']:.1f} s)")
    return 0


def cmd_place(args: argparse.Namespace) -> int:
    sglang_layers = sglang_model_layers(args)
    trace = read_trace(args)
    check_sglang_layers(args, sglang_layers, trace)
    current = load_placement(args.current) if args.current else None
    cluster = cluster_from(args, current)
    options = policy_options(args)
    layer_ids = trtllm_layer_ids(args, trace)
    if current is not None and args.policy == "cpsat":
        options["current"] = current
    elif args.migration_cost:
        raise PlacementInfeasibleError("--migration-cost needs --current (the placement now serving)")
    began = time.perf_counter()
    placement = fit_placement(args.policy, trace.counts_TLE, cluster, **options)
    seconds = time.perf_counter() - began
    logger.info("fitted %s on %d steps in %.2f s", args.policy, trace.num_steps, seconds)
    placement.info.update({"fit_steps": trace.num_steps, "trace": trace.header.source})
    migration_line = ""
    result = {"out": str(args.out), "policy": args.policy, "solve_seconds": seconds}
    if current is not None:
        # Realise the new placement with the fewest expert copies from the one now serving.
        plan = plan_migration(current, placement, args.bytes_per_expert)
        oblivious = oblivious_moves(current, placement)
        placement = plan.realised
        result["migration"] = {**plan.summary(), "oblivious_moves": oblivious}
        result.update({"bytes_moved": plan.bytes_moved, "experts_moved": plan.num_moves})
        migration_line = (f"migration from {args.current}: {plan.num_moves} expert copies, "
                          f"{plan.bytes_moved / 2**30:.2f} GiB (slot-by-slot remap: {oblivious} copies)\n")
    fitted = score_placement(placement, trace.counts_TLE, args.routing).summary()
    result.update(fitted)
    if args.plot:
        plot_before_after(placement, trace.counts_TLE, args.plot)
    if sglang_layers is not None:
        save_sglang_mapping(placement, args.sglang_out, sglang_layers)
        result.update({"sglang_out": str(args.sglang_out), "sglang_rows": sglang_layers.num_layers})
        migration_line += f"wrote {args.sglang_out}: SGLang's map, {sglang_layers.describe()}\n"
    if layer_ids is not None:
        trtllm, trtllm_line = write_trtllm(args, placement, trace.counts_TLE, layer_ids)
        result.update(trtllm)
        migration_line += trtllm_line
    save_placement(placement, args.out)
    table = format_table([{"policy": args.policy, "routing": args.routing, "fit": "fitted", **fitted}],
                         ("policy", "routing", "fit"))
    emit(args, result, f"wrote {args.out} ({seconds * 1000:.0f} ms)\n{migration_line}{table}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    placement = load_placement(args.placement)
    trace = read_trace(args)
    progress = Progress(f"score {args.routing}", enabled=not (args.json or args.quiet))
    try:
        scores = score_placement(placement, trace.counts_TLE, args.routing, on_chunk=progress.callback())
    finally:
        progress.close()
    result = {"placement": str(args.placement), "policy": placement.policy, **scores.summary()}
    result.update(yardsticks_of(trace.counts_TLE, placement.cluster, result, args.metric_groups))
    if args.burst_factor is not None:
        result.update(burst_scores(placement, trace.counts_TLE, args.burst_factor))
    trtllm, trtllm_text = trtllm_scores(args, placement, trace.counts_TLE)
    result.update(trtllm)
    if args.plot:
        plot_before_after(placement, trace.counts_TLE, args.plot)
    rows = [{"policy": placement.policy, "routing": args.routing, **result}]
    text = format_table(rows, ("policy", "routing")) + "\n" + yardstick_lines(result)
    if args.burst_factor is not None:
        text += (f"\nburst exposure (one expert's load x{args.burst_factor:g}, best split): mean "
                 f"{result['burst_exposure_mean']:.3f}, worst {result['burst_exposure_max']:.3f}")
    emit(args, result, text + trtllm_text)
    return 0


def yardsticks_of(counts_TLE: np.ndarray, cluster: ClusterSpec, summary: dict, groups: int | None) -> dict:
    """The keys a score's summary gains beside its figures: the granularity bound of the scored steps
    (`placement.yardsticks.trace_yardsticks`) and, with `groups` (--metric-groups), the per-routing-group metric."""
    found = trace_yardsticks(counts_TLE, cluster)
    extra = {"granularity_bound": found["granularity_bound"], "granularity_from": found["granularity_from"]}
    if groups is not None:
        if counts_TLE.shape[-1] % groups:
            raise ValueError(f"--metric-groups {groups} does not divide the trace's {counts_TLE.shape[-1]} experts; "
                             f"give the model's expert groups (DeepSeek-V3: 8)")
        extra["metrics"] = {**summary["metrics"], "group_step": group_metric(counts_TLE, groups)}
    return extra


def burst_scores(placement: Placement, counts_TLE: np.ndarray, factor: float) -> dict:
    """`eplb score --burst-factor`: the placement's burst exposure on the trace's mean load (mean over layers and
    bursting experts, and the worst), as `placement.burst_exposure` defines it."""
    load_LE = counts_TLE.mean(axis=0)
    empty = np.flatnonzero(load_LE.sum(axis=1) <= 0)
    if len(empty):
        raise ValueError(f"--burst-factor needs tokens in every layer of the trace, and layer {empty[0]} has none; "
                         f"score steps where every layer routes tokens (--steps START:STOP)")
    exposure_LE = burst_exposure(placement, load_LE, factor)
    return {"burst_factor": factor, "burst_exposure_mean": float(exposure_LE.mean()),
            "burst_exposure_max": float(exposure_LE.max())}


def cmd_replay(args: argparse.Namespace) -> int:
    from eplb.cli import plots  # matplotlib is imported only by what draws
    trace = read_trace(args)
    cluster = cluster_from(args)
    progress = Progress(f"replay {args.policy}", enabled=not (args.json or args.quiet))
    try:
        result = rolling_replay(
            trace.counts_TLE, cluster, args.policy, args.every, args.window, args.routing,
            policy_options(args), on_refit=progress.callback(), drift_ratio=args.refit_on_drift, lag=args.lag,
            forecast=args.forecast == "trend", patches=patches_from(args), pace=pace_from(args),
        )
    finally:
        progress.close()
    logger.info("replayed %d fits (%d on drift)", len(result.refit_steps), len(result.drift_steps))
    scored_TLE = trace.counts_TLE[args.window + args.lag:]
    summary = {"policy": args.policy, "every": args.every, "window": args.window,
               "refit_on_drift": args.refit_on_drift, "forecast": args.forecast,
               "patch_lag": args.patch_lag if args.patch_every else None,
               "drift_swaps": args.drift_swaps if args.patch_every else None,
               "drift_stride": args.drift_stride if args.patch_every else None,
               "patch_burst_lag": args.patch_burst_lag if args.patch_every else None,
               "refit_blocks_patches": args.refit_blocks_patches if args.patch_every else None,
               **result.summary()}
    summary.update(yardsticks_of(scored_TLE, cluster, summary, args.metric_groups or args.groups))
    if args.plot:
        plots.plot_imbalance_over_time(
            {f"{args.policy}, {args.routing}": result.held_out.imbalance_TL.mean(axis=1)},
            args.plot,
            refit_steps=[s - args.window - args.lag for s in result.refit_steps],
            lower_bound_T=result.held_out.lower_bound_TL.mean(axis=1),
            title=f"Rolling replay: refit every {args.every} steps on the last {args.window}"
                  + ("" if args.refit_on_drift is None else f", and on drift ({args.refit_on_drift})"),
        )
    rows = [
        {"policy": args.policy, "routing": args.routing, "fit": "held-out", **summary},
        {"policy": args.policy, "routing": args.routing, "fit": "fitted", **result.fitted.summary()},
    ]
    emit(args, summary, format_table(rows, ("policy", "routing", "fit")) + "\n" + yardstick_lines(summary))
    return 0


def patches_from(args: argparse.Namespace) -> PatchSettings | None:
    """`eplb replay`'s patches (drift swaps and burst moves): None with --patch-every 0."""
    if args.patch_every == 0:
        return None
    return PatchSettings(every=args.patch_every, drift_swaps=args.drift_swaps, drift_stride=args.drift_stride)


PACE_FLAGS = {"lag": "--patch-lag", "burst_lag": "--patch-burst-lag"}


def pace_from(args: argparse.Namespace) -> PatchPace:
    """`eplb replay`'s patch pace; ValueError naming the flags when it does not fit --patch-every."""
    pace = PatchPace(lag=args.patch_lag, burst_lag=args.patch_burst_lag, refit_blocks=args.refit_blocks_patches)
    problems = pace.problems(args.patch_every) if args.patch_every else []
    if problems:
        text = "; ".join(f"{PACE_FLAGS[name]} {what}" for name, what in problems)
        raise ValueError(text.replace("(lag - every, lag]", "(--patch-lag - --patch-every, --patch-lag]"))
    return pace


def cmd_plot(args: argparse.Namespace) -> int:
    from eplb.cli import plots  # matplotlib is imported only by what draws
    trace = read_trace(args)
    placement = load_placement(args.placement) if args.placement else None
    if placement is not None:
        check_compatible(placement, trace.counts_TLE)
    out_dir = Path(args.out_dir)
    written = [out_dir / "load_heatmap.png"]
    plots.plot_load_heatmap(trace.load_LE(), written[0], title=f"Expert load: {Path(args.trace).name}")
    if placement is not None:
        written.append(out_dir / "gpu_loads.png")
        plot_before_after(placement, trace.counts_TLE, written[1])
    emit(args, {"written": [str(p) for p in written]}, "\n".join(f"wrote {p}" for p in written))
    return 0
