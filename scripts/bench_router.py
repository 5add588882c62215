"""How fast, and how near the LP optimum, is the live router at 256 experts on 64x5 and 128x3 (8,192 tokens)?

For each shape it fits a placement (default `cpsat` under dynamic routing, on the 60 steps before those routed) and
times, in this process, one layer's routing of one step:
- `route_step` (the live router, whole tokens) as the layer's table chooses: the exact chain split when the layout
  is a chain, else water-filling with its default rounds; and beside it water-filling forced on the same layout
  (`exact_chains=False`), the method of layouts that are not chains;
  each eager and compiled (`torch.compile(fullgraph=True)`, `check_values=False`: the per-step path); and the
  same fit as a live refit serves it ("N relabelled": N GPUs moved), its GPUs relabelled by `plan_migration` from
  a fit on other traffic (the placement serving before), so its layout is no longer in GPU order;
- the static split (tokens times fixed weights, rounded), the baseline a router replaces;
- the exact optimum by an LP (scipy HiGHS), the quality reference;
and reports the busiest GPU of each router relative to the LP optimum, and of the static split. Times are the
least mean per call over `--repeats` runs of `--calls` calls, wall clock and CPU time of this thread (other
processes on the cores add to both, to the wall clock most); the load average is printed at the start and end.

With `--device cuda` the tables and counts live on the GPU and each timing run ends with a synchronisation, so a
call's time is its launches and kernels; two more columns replay the compiled router captured in a CUDA graph, as
a decode step captured whole runs it: one call per replay, and 16 calls (16 layers) per replay, per call.

Usage: python scripts/bench_router.py [--steps 50] [--threads 1] [--policy cpsat] [--no-compile] [--cpp-wrapper]
       [--calls 200] [--repeats 5] [--device cpu|cuda] [--quick]
"""

import os
import sys
import time

import numpy as np
import torch
import torch._inductor.config as inductor_config

from eplb.cli.arg_types import integer
from eplb.cli.bench_harness import bench_parser
from placement import POLICIES, ClusterSpec, fit_placement
from placement.migration import plan_migration
from placement.routing.exact_split import exact_max_load
from placement.routing.live_router import DEFAULT_ROUNDS, LayerRoutingTable, route_step
from traces.synthetic import SyntheticConfig, generate_trace

FIT_STEPS = 60
EXPERTS = 256


GRAPH_LAYERS = 16


def synchronize() -> None:
    """Wait for the GPU's queued work (nothing on CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def per_call(fn, calls: int, repeats: int) -> tuple[float, float]:
    """Seconds per call, wall clock and this thread's CPU time: the least mean of each over `repeats` runs of
    `calls` calls, after one warm-up call, each run ended by a GPU synchronisation. CPU time leaves out the time
    other processes hold the core."""
    fn()
    synchronize()
    wall = cpu = float("inf")
    for _ in range(repeats):
        began, began_cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            fn()
        synchronize()
        wall = min(wall, (time.perf_counter() - began) / calls)
        cpu = min(cpu, (time.thread_time() - began_cpu) / calls)
    return wall, cpu


def ms(seconds: tuple[float, float]) -> str:
    """Wall / CPU milliseconds."""
    return f"{seconds[0] * 1e3:.3f} / {seconds[1] * 1e3:.3f} ms"


def cuda_graph_of(fn, counts_E: torch.Tensor, table, calls: int):
    """A CUDA graph of `calls` calls of `fn(counts, table)` on a static copy of `counts_E`; returns (graph, static
    counts, the last call's output)."""
    static_counts = counts_E.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static_counts, table, check_values=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn(static_counts, table, check_values=False)
    return graph, static_counts, out


def busiest_over_lp(route, steps_TE: np.ndarray, lp_T: np.ndarray, num_gpus: int, device: torch.device) -> float:
    """Mean over steps of the busiest GPU under `route(counts_E) -> tokens_P`, over the LP optimum."""
    busiest = [route(torch.as_tensor(counts, device=device)).view(num_gpus, -1).sum(1).max().item()
               for counts in steps_TE]
    return float(np.mean(np.array(busiest) / lp_T))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, whole_doc=True, json_help=None)
    parser.add_argument("--steps", type=integer(1, 100_000), default=50,
                        help="held-out steps routed per shape (default 50)")
    parser.add_argument("--threads", type=integer(1, 1024), default=1,
                        help="torch CPU threads (default 1, as a worker's side)")
    parser.add_argument("--policy", default="cpsat", choices=sorted(POLICIES),
                        help="placement to route on (default cpsat)")
    parser.add_argument("--calls", type=integer(1, 10**6), default=200, help="calls per timing run (default 200)")
    parser.add_argument("--repeats", type=integer(1, 1000), default=5,
                        help="timing runs, the least is kept (default 5)")
    parser.add_argument("--no-compile", action="store_true", help="eager only (each compile takes ~15 s on CPU)")
    parser.add_argument("--cpp-wrapper", action="store_true",
                        help="compile with inductor's C++ wrapper (less Python per call on CPU; longer compiles)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the router runs")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 steps, 1 s fits, 20 calls x 2 runs")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu and args.no_compile:
        parser.error("--device cuda times the compiled router in CUDA graphs: leave out --no-compile")
    if args.quick:
        args.steps, args.calls, args.repeats = 5, 20, 2
    torch.set_num_threads(args.threads)
    inductor_config.cpp_wrapper = args.cpp_wrapper
    print(f"load average at start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1 / 5 / 15 min) on "
          f"{os.cpu_count()} cores; torch {torch.__version__}, {args.threads} thread(s)")
    if on_gpu:
        print(f"router on {torch.cuda.get_device_name(device)}")
    trace = generate_trace(SyntheticConfig(num_steps=FIT_STEPS + args.steps, num_layers=1, tokens_per_step=8192))
    steps = trace.counts_TLE[FIT_STEPS:, 0]
    earlier = SyntheticConfig(num_steps=FIT_STEPS, num_layers=1, tokens_per_step=8192, seed=1)
    earlier_TLE = generate_trace(earlier).counts_TLE
    print("Times per call, one layer, one step: wall / CPU of this thread.")
    graph_heads = f"graph, 1 call | graph, {GRAPH_LAYERS} calls, per call | " if on_gpu else ""
    print(f"| cluster | policy | GPUs | method | rounds | eager | compiled | {graph_heads}static split | exact LP | "
          f"router / LP | static / LP |")
    print("|---|---|---|---|---|---|---|" + "---|---|" * on_gpu + "---|---|---|---|")
    for cluster in (ClusterSpec(num_gpus=64, slots_per_gpu=5), ClusterSpec(num_gpus=128, slots_per_gpu=3)):
        options = {"time_limit_s": 1.0 if args.quick else 5.0, "routing": "dynamic"} if args.policy == "cpsat" else {}
        placement = fit_placement(args.policy, trace.counts_TLE[:FIT_STEPS], cluster, **options)
        phy2log, weights = placement.phy2log_LP[0], placement.weights_LP[0]
        gpu_of_slot = np.arange(cluster.num_slots) // cluster.slots_per_gpu
        lp = np.array([exact_max_load(c.astype(float), phy2log, gpu_of_slot, cluster.num_gpus) for c in steps])
        weights_t = torch.as_tensor(weights, dtype=torch.float32, device=device)
        phy2log_t = torch.as_tensor(phy2log, device=device)
        counts_t = torch.as_tensor(steps[0], device=device)

        def static(counts_E: torch.Tensor) -> torch.Tensor:
            return (counts_E[phy2log_t] * weights_t).round()

        static_lp = busiest_over_lp(static, steps, lp, cluster.num_gpus, device)
        t_static = per_call(lambda: static(counts_t), args.calls, args.repeats)
        t_lp = per_call(lambda: exact_max_load(steps[0].astype(float), phy2log, gpu_of_slot, cluster.num_gpus),
                        5, 1)[0]
        # The same fit as a live refit serves it: relabelled by `plan_migration` to the GPUs that already hold most
        # of the placement serving before (a fit on other traffic), so its layout is no longer in GPU order.
        previous = fit_placement(args.policy, earlier_TLE, cluster, **options)
        plan = plan_migration(previous, placement)
        realised, moved = plan.realised, plan.summary()["gpus_relabelled"]
        layouts = [("as fitted", phy2log, weights, True), ("as fitted", phy2log, weights, False),
                   (f"{moved} relabelled", realised.phy2log_LP[0], realised.weights_LP[0], True)]
        fitted_method = None
        for gpus, layout_P, weights_P, exact_chains in layouts:
            table = LayerRoutingTable.build(layout_P, cluster.slots_per_gpu, EXPERTS, device=device,
                                            weights_P=weights_P, exact_chains=exact_chains)
            fitted_method = fitted_method or table.method
            if not exact_chains and fitted_method == "water-filling":
                continue  # not a chain: the forced water-filling row would repeat the one above
            router_lp = busiest_over_lp(lambda c: route_step(c, table), steps, lp, cluster.num_gpus, device)
            t_eager = per_call(lambda: route_step(counts_t, table, check_values=False), args.calls, args.repeats)
            compiled = "-"
            if not args.no_compile:
                fn = torch.compile(route_step, fullgraph=True, dynamic=False)
                for counts in steps:  # the compiled router gives the eager one's tokens
                    counts_E = torch.as_tensor(counts, device=device)
                    assert torch.equal(fn(counts_E, table, check_values=False), route_step(counts_E, table))
                t_compiled = per_call(lambda: fn(counts_t, table, check_values=False), args.calls, args.repeats)
                compiled = ms(t_compiled)
            graphs = ""
            if on_gpu:
                graph, static_counts, out = cuda_graph_of(fn, counts_t, table, 1)
                for counts in steps:  # the replayed graph gives the eager router's tokens
                    counts_E = torch.as_tensor(counts, device=device)
                    static_counts.copy_(counts_E)
                    graph.replay()
                    assert torch.equal(out, route_step(counts_E, table))
                t_graph = per_call(graph.replay, args.calls, args.repeats)
                graph_many = cuda_graph_of(fn, counts_t, table, GRAPH_LAYERS)[0]
                t_many = per_call(graph_many.replay, args.calls, args.repeats)
                graphs = f"{t_graph[0] * 1e6:.1f} us | {t_many[0] / GRAPH_LAYERS * 1e6:.1f} us | "
            method = "chain (exact)" if table.method == "chain" else "water-filling"
            rounds = "-" if table.method == "chain" else str(DEFAULT_ROUNDS)
            print(f"| {cluster.num_gpus}x{cluster.slots_per_gpu} | {args.policy} | {gpus} | {method} | {rounds} | "
                  f"{ms(t_eager)} | {compiled} | {graphs}{ms(t_static)} | {t_lp * 1e3:.1f} ms | "
                  f"{router_lp:.4f} | {static_lp:.4f} |", flush=True)
    print(f"load average at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
