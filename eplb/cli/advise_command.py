"""eplb advise: how many GPUs and redundant experts to deploy, from your routing trace, model, card and latency target.

For each candidate decode layout (an EP size from --ep-sizes times expert slots per GPU from --slots-per-gpu, every
expert once and up to --max-redundant more, without and with node limits: --node-limits) it replays the trace at the
layout's shape, refitting every --refit-every steps on the last --window (this project's cpsat policy with the live
router, and DeepSeek's greedy with the static equal split beside it), the trace's steps pooled or thinned to the
layout's tokens per GPU; and it runs the simulator's capacity mode on that imbalance: the largest decode batch that
fits the card's memory after the weights and meets the TPOT target, and the decode tokens/s per GPU there. It prints a
ranked table (best first) with what binds each row (TPOT, memory, the batch cap, or weights that do not fit), the
memory per GPU, and the recommendation with the settings of vLLM, SGLang and TensorRT-LLM (--sglang-out and
--trtllm-out also write their files for it, fitted with cpsat on the trace's last --window steps); --plot draws
tokens/s per GPU and the imbalance against redundant experts, one line per EP size (and per EP size with node
limits); --json prints the whole table.

Each row is what `eplb sim --capacity` reports for a config holding the same layout, with `balance.routing_trace`
the trace (`--json` gives each row's settings). The advice holds as far as the trace stands for the traffic to come
and within the simulator's stated limits (docs/simulator.md).

Examples:
  eplb advise                                   # a synthetic trace, DeepSeek-V3 on H800 at 20 tokens/s per user
  eplb advise --trace out/demo/trace.npz --card H800 --tokens-per-user 20 --mtp --plot advice.png
  eplb advise --trace routing.npz --ep-sizes 64,128 --slots-per-gpu 2,3,4,5 --load 1e6 --json
"""

import argparse
import tempfile
from pathlib import Path

from eplb.cli.advice_text import advice_text, no_pick
from eplb.cli.commands import emit
from eplb.cli.progress import Progress
from eplb.cli.traffic_cases import traffic_cases

# `eplb demo`'s shape, with the steps for EP64 and EP72 to score two windows at their top load (larger EP sizes pool
# more steps and say so).
DEFAULT_TRACE = dict(num_steps=500, num_layers=61, num_experts=256, top_k=8, tokens_per_step=8192)


def cmd_advise(args: argparse.Namespace) -> int:
    # Imported here: the other subcommands start without the simulator's modules.
    from sim.advice import advise
    from sim.hardware import PROFILES

    if args.card not in PROFILES:
        raise ValueError(f"--card {args.card} is not a hardware profile; use one of {', '.join(sorted(PROFILES))}")
    prefill_flags = [flag for flag, given in (("--prompt-tokens", args.prompt_tokens != 4096),
                                              ("--cached-share", args.cached_share != 0.0),
                                              ("--prefill-nodes", args.prefill_nodes != [1, 2, 4, 8]),
                                              ("--prefill-redundant", args.prefill_redundant != [0, 32])) if given]
    if prefill_flags and args.ttft_s is None:
        raise ValueError(f"{', '.join(prefill_flags)} apply to prefill advice: add --ttft-s, or drop them")
    case_list = traffic_cases(args)
    searched = _advice_settings(args, "", case_list)  # the search's checks need no trace: made before reading it
    _check_candidates(searched)
    _check_current(searched)
    _check_case_work(searched)
    with tempfile.TemporaryDirectory() as folder:
        trace, mix = _routing_trace(args, Path(folder))
        files = _engine_files(args, trace, args.trace or trace)  # checked before any work
        settings = _advice_settings(args, trace, case_list)
        progress = Progress("advise", enabled=not (args.json or args.quiet))
        try:
            result = advise(settings, progress.callback())
        finally:
            progress.close()
        result["settings"] = {**_settings_summary(args, settings), "trace_mix": mix}
        if result["recommended"] is None and files is not None:
            raise ValueError(f"{no_pick(result)}; so no --sglang-out or --trtllm-out file was written")
        if result["recommended"] is not None:
            from sim.advice import engine_settings

            model = settings.base.model
            result["engines"] = engine_settings(result["recommended"], model.num_routed_experts, model.expert_groups,
                                                settings.base.cluster.cards_per_node, result["vllm_recommended"],
                                                (model.num_layers, model.num_dense_layers),
                                                settings.base.speculative.enabled)
            result.update(_write_engine_files(args, files, result["recommended"], settings))
    if args.plot:
        from eplb.cli.plots import advice_plot

        advice_plot(result["rows"], args.plot, f"{args.card}, TPOT {settings.base.capacity.tpot_slo_ms:g} ms, "
                                                f"{settings.base.capacity.decode_context_tokens:,}-token contexts")
    emit(args, result, advice_text(result))
    return 0


def _advice_settings(args: argparse.Namespace, trace: str, case_list: list):
    """The adviser's settings from the flags, the trace the rows replay and the traffic cases."""
    from sim.advice import AdviceSettings

    return AdviceSettings(base=_base_config(args, trace), ep_sizes=tuple(args.ep_sizes),
                          slots_per_card=tuple(args.slots_per_gpu), max_redundant=args.max_redundant,
                          redundant=None if args.redundant is None else tuple(args.redundant),
                          load_tokens_per_s=args.load, price_per_card_hour=args.price_per_gpu_hour,
                          prefill_nodes=tuple(args.prefill_nodes) if args.ttft_s is not None else (),
                          prefill_redundant=tuple(args.prefill_redundant),
                          node_limits=tuple(sorted({limit == "groups" for limit in args.node_limits})),
                          current=None if args.current_layout is None else (*args.current_layout, False),
                          cases=tuple(case_list))


def _engine_files(args: argparse.Namespace, trace: str, original: str):
    """(the trace the rows replay, SGLang's model layers, TensorRT-LLM's layer ids) when --sglang-out or --trtllm-out
    asks for a file (their flags checked as `eplb place` checks them, before any work; an engine dump's layout read
    from the `original` file), else None."""
    if not (args.sglang_out or args.trtllm_out or args.sglang_num_layers is not None
            or args.sglang_first_moe_layer is not None or args.trtllm_layers is not None
            or args.trtllm_mtp_layers is not None):
        return None
    from eplb.cli.sglang_out import check_sglang_layers, sglang_model_layers
    from eplb.cli.trtllm_output import trtllm_layer_ids
    from traces import load_trace

    named = argparse.Namespace(**{**vars(args), "trace": original})
    routing = load_trace(trace)
    layers = sglang_model_layers(named)
    check_sglang_layers(named, layers, routing)
    return routing, layers, trtllm_layer_ids(named, routing)


def _write_engine_files(args: argparse.Namespace, files, best: dict, settings) -> dict:
    """Fit the recommended layout with cpsat on the whole trace (every layer, the last --window steps, the live
    router's split, node limits where the row has them) and write --sglang-out and --trtllm-out from it; their JSON
    keys."""
    if files is None:
        return {}
    from eplb.cli.trtllm_output import write_trtllm
    from eplb.engines.sglang.expert_map import save_sglang_mapping
    from placement import ClusterSpec, fit_placement

    routing, layers, layer_ids = files
    cards, slots = best["cards"], best["slots_per_card"]
    counts_TLE = routing.counts_TLE[-settings.base.balance.window:]
    per_node = settings.base.cluster.cards_per_node
    cluster = ClusterSpec(num_gpus=cards, slots_per_gpu=slots, gpus_per_node=per_node if cards % per_node == 0
                          else cards)
    limits = {"groups": settings.base.model.expert_groups, "nodes_per_group": 1} if best["node_limits"] else {}
    placement = fit_placement("cpsat", counts_TLE, cluster, routing="dynamic",
                              work_limit=0.25 * routing.counts_TLE.shape[1], **limits)
    written = {}
    if layers is not None:
        save_sglang_mapping(placement, args.sglang_out, layers)
        written.update({"sglang_out": str(args.sglang_out), "sglang_rows": layers.num_layers})
    if layer_ids is not None:
        written.update(write_trtllm(args, placement, counts_TLE, layer_ids)[0])
    return written


def _routing_trace(args: argparse.Namespace, folder: Path) -> tuple[str, str]:
    """(the trace the rows replay, how its steps are ordered): --trace read once (a dump's warnings said once) into a
    scratch file in `folder`, a top-k id log's tasks interleaved (`traces.task_mix`: every window holds the same
    mix); a synthetic trace of independent tokens without --trace."""
    topk_flags = [flag for flag, value in (("--tokens-per-step", args.tokens_per_step), ("--task", args.task),
                                           ("--num-experts", args.num_experts)) if value is not None]
    if args.trace is None:
        if topk_flags:
            raise ValueError(f"{', '.join(topk_flags)} read top-k id logs; give --trace LOG, or drop them")
        return _default_trace(folder), (f"independent tokens, {DEFAULT_TRACE['num_steps']} steps of "
                                     f"{DEFAULT_TRACE['tokens_per_step']:,} tokens")
    import numpy as np

    from traces import load_trace
    from traces.task_mix import interleave_tasks

    tasks = _topk_tasks(args.trace)
    path = folder / "routing_trace.npz"  # a scratch file, read back and removed within the command (not an output)
    if not tasks:
        if topk_flags:
            raise ValueError(f"{', '.join(topk_flags)} read top-k id logs; {args.trace} holds counts: drop them")
        np.savez(path, counts=load_trace(args.trace).counts_TLE)
        return str(path), "steps as recorded"
    if args.tokens_per_step is None:
        raise ValueError(f"{args.trace} is a top-k id log: give --tokens-per-step, the tokens of one decode step (for "
                         f"example 256 for the ESFT logs)")
    chosen = args.task.split(",") if args.task else tasks
    per_task = [load_trace(args.trace, tokens_per_step=args.tokens_per_step, tasks=[task],
                           num_experts=args.num_experts).counts_TLE for task in chosen]
    np.savez(path, counts=interleave_tasks(per_task))
    if len(chosen) == 1:
        return str(path), f"top-k id log, task {chosen[0]}, {args.tokens_per_step} tokens a step"
    return str(path), (f"top-k id log, tasks {', '.join(chosen)} interleaved by progress (every window holds the same "
                       f"mix), {args.tokens_per_step} tokens a step")


def _topk_tasks(path: str) -> list[str]:
    """The tasks of a top-k id log at `path` (an .npz of `<task>_topk_ids` arrays); [] for any other file."""
    if not path.lower().endswith(".npz") or not Path(path).is_file():
        return []
    import zipfile

    from traces.topk_log import topk_tasks

    try:
        with zipfile.ZipFile(path) as archive:
            names = [name[:-4] if name.endswith(".npy") else name for name in archive.namelist()]
    except (OSError, zipfile.BadZipFile):
        return []  # the trace reader says what is wrong with it
    return [] if "counts" in names else topk_tasks(names)


MAX_CASE_WORK = 2400.0  # cpsat work units the reruns over the traffic cases may take (about 20 minutes on 2 cores)


def _check_case_work(settings) -> None:
    """Refuse reruns over the traffic cases that would take more than `MAX_CASE_WORK` work units, saying which flags
    lower it."""
    from sim.advice import MAX_SCREENED
    from sim.advice_range import case_work

    if not settings.cases:
        return
    rows = 1 + MAX_SCREENED + (settings.current is not None)
    work = case_work(settings.base, list(settings.cases), rows)
    if work > MAX_CASE_WORK:
        raise ValueError(f"rerunning up to {rows} layouts over {len(settings.cases)} traffic cases, a refit every "
                         f"{settings.base.balance.refit_every} steps, takes about {work:,.0f} cpsat work units (about "
                         f"{work / 120:,.0f} minutes on 2 cores), more than {MAX_CASE_WORK:,.0f}; lower --seeds, "
                         f"refit less often (--refit-every), or add --scenarios none")


def _check_current(settings) -> None:
    """Refuse a --current layout that cannot hold the model's experts."""
    if settings.current is None:
        return
    cards, slots, _ = settings.current
    experts = settings.base.model.num_routed_experts
    if cards * slots < experts:
        raise ValueError(f"--current {cards}x{slots} holds {cards * slots} expert slots, fewer than the model's "
                         f"{experts} experts; give the layout serving now, for example 144x2 for DeepSeek-V3")


def _default_trace(folder: Path) -> str:
    """The default synthetic full-shape trace of independent tokens (61 layers x 256 experts, top-8, 8,192 tokens a
    step), written to `folder`; its path."""
    import numpy as np

    from traces.synthetic import SyntheticConfig, generate_trace

    path = folder / "demo_trace.npz"  # a scratch file, read back and removed within the command (not an output)
    np.savez(path, counts=generate_trace(SyntheticConfig(**DEFAULT_TRACE)).counts_TLE)
    return str(path)


def _base_config(args: argparse.Namespace, trace: str):
    """The simulator config every candidate starts from: the model (DeepSeek-V3, or a config file's), the card, the
    targets, MTP, the trace and the replay's settings."""
    from sim import load_sim_config
    from sim.config import SimConfig

    model = load_sim_config(args.model).model if args.model else SimConfig().model.model_copy(
        update={"sliding_window_share": 0.0})
    base = SimConfig(model=model)
    tpot = args.tpot_ms if args.tpot_ms is not None else 1000.0 / args.tokens_per_user
    speculative = base.speculative.model_copy(update={"enabled": args.mtp, "draft_tokens": 1, "policy": "all"})
    layers = args.layers
    work = args.work_limit if args.work_limit is not None else 0.25 * layers
    balance = base.balance.model_copy(update={"routing_trace": str(Path(trace).resolve()), "trace_layers": layers,
                                              "refit_every": args.refit_every, "window": args.window,
                                              "work_limit": work})
    capacity = {"tpot_slo_ms": tpot, "decode_context_tokens": args.context, "ttft_slo_s": args.ttft_s,
                "prompt_tokens": args.prompt_tokens, "cached_share": args.cached_share}
    return base.model_copy(update={
        "hardware": base.hardware.model_copy(update={"decode": args.card, "prefill": args.card}),
        "capacity": base.capacity.model_copy(update=capacity),
        "cluster": base.cluster.model_copy(update={"max_decode_batch_per_card": args.max_batch_per_gpu}),
        "speculative": speculative, "balance": balance})


MAX_LAYOUTS = 400  # decode layouts one search replays at most (the default search has 23)


def _check_candidates(settings) -> None:
    """Refuse a search with no candidate, saying which flags to widen, or with more than `MAX_LAYOUTS`."""
    from sim.advice import candidates

    found = len(candidates(settings))
    if found > MAX_LAYOUTS:
        raise ValueError(f"--ep-sizes x --slots-per-gpu (with --max-redundant {settings.max_redundant}) give {found:,} "
                         f"layouts to replay, more than {MAX_LAYOUTS}; narrow them to the sizes you would deploy")
    if not found:
        experts = settings.base.model.num_routed_experts
        counts = "" if settings.redundant is None else f" (of --redundant {list(settings.redundant)})"
        limits = "" if False in settings.node_limits else \
            (f" and takes node limits (the model's {settings.base.model.expert_groups} expert groups a multiple of "
             f"its nodes of {settings.base.cluster.cards_per_node} GPUs; or add --node-limits none)")
        raise ValueError(f"no layout of --ep-sizes {list(settings.ep_sizes)} x --slots-per-gpu "
                         f"{list(settings.slots_per_card)} holds the model's {experts} experts with at most "
                         f"--max-redundant {settings.max_redundant} redundant ones{counts}{limits}; widen them")


def _replayed_layers(base) -> int:
    """The layers each row replays: --layers, or the trace's own where it has fewer."""
    from traces import load_trace

    return min(base.balance.trace_layers, load_trace(base.balance.routing_trace).num_layers)


def _settings_summary(args: argparse.Namespace, settings) -> dict:
    base = settings.base
    return {"trace": args.trace or "a synthetic trace of independent tokens", "card": base.hardware.decode,
            "tpot_slo_ms": base.capacity.tpot_slo_ms, "context_tokens": base.capacity.decode_context_tokens,
            "mtp": base.speculative.enabled, "trace_layers": _replayed_layers(base),
            "refit_every": base.balance.refit_every, "window": base.balance.window,
            "work_limit": base.balance.work_limit, "max_batch_per_gpu": base.cluster.max_decode_batch_per_card,
            "ep_sizes": list(settings.ep_sizes), "slots_per_gpu": list(settings.slots_per_card),
            "node_limits": list(args.node_limits), "expert_groups": base.model.expert_groups,
            "groups_per_token": base.model.groups_per_token,
            "ttft_s": args.ttft_s, "prompt_tokens": args.prompt_tokens, "cached_share": args.cached_share,
            "max_redundant": settings.max_redundant, "redundant": args.redundant,
            "load_tokens_per_s": settings.load_tokens_per_s,
            "price_per_gpu_hour": settings.price_per_card_hour}
