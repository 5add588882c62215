"""How many different maps N processes compute from the same load window at once, at DeepSeek-V3's full shape.

vLLM and SGLang compute the placement on every rank and broadcast nothing, so the answer must be 1. Starts
`--processes` copies of this script (default 4) at the same time beside `--busy` busy loops (default 2), each calling
an entry point on the same window: `CpsatEplbPolicy.rebalance_experts` (vLLM's interface) and `rebalance_experts`
(DeepSeek's) on 58 layers x 256 experts at 144 ranks x 2 slots (EP144, 256 + 32) and at 72 x 4, with their defaults
or `--work-limit`, and `fit_placement("cpsat", ...)` under dynamic routing on 8 of the layers' 100-step windows. Prints
one line per entry point: the distinct maps among the processes, and each process's seconds. `--time-limit S` gives
every entry point a wall-clock budget instead, to see what one does (exit 1 when any maps differ).

Usage: python scripts/check_same_map.py [--processes 4] [--busy 2] [--work-limit W | --time-limit S] [--json out.json]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from eplb.cli.arg_types import json_output
from eplb.cli.main import TIME_LIMIT, WORK_LIMIT, OneLineParser

SPINNER = ("import sys; from collectives.lifeline import end_with_parent; end_with_parent(int(sys.argv[1]), True)\n"
           "while True: pass")
SHAPES = ((144, 2), (72, 4))
LAYERS = 58


def one_process(work_limit: float | None, time_limit: float | None = None) -> dict:
    """Every entry point's map hash and seconds, in this process."""
    import numpy as np
    import torch

    from eplb import CpsatEplbPolicy, rebalance_experts
    from placement import ClusterSpec, fit_placement
    from traces.synthetic import SyntheticConfig, generate_trace

    found = {}
    budget = {} if work_limit is None else {"work_limit": work_limit}
    if time_limit is not None:
        budget = {"time_limit_s": time_limit}
    for gpus, slots in SHAPES:
        counts = generate_trace(SyntheticConfig(num_steps=100, num_layers=LAYERS, num_experts=256, top_k=8,
                                                tokens_per_step=gpus * 128, seed=gpus)).counts_TLE
        weight = torch.from_numpy(counts.sum(axis=0))
        policy = CpsatEplbPolicy.configured(**budget)
        calls = {
            f"CpsatEplbPolicy {gpus} x {slots}": lambda: policy.rebalance_experts(weight, gpus * slots, 8, gpus // 8,
                                                                                  gpus).numpy(),
            f"rebalance_experts {gpus} x {slots}": lambda: rebalance_experts(weight, gpus * slots, 1, 1, gpus,
                                                                             "cpsat", **budget)[0].numpy(),
            f"fit_placement {gpus} x {slots}, 8 layers": lambda: fit_placement(
                "cpsat", counts[:, :8], ClusterSpec(num_gpus=gpus, slots_per_gpu=slots), **budget).phy2log_LP,
        }
        for name, call in calls.items():
            began = time.perf_counter()
            result = np.ascontiguousarray(call())
            found[name] = {"hash": hashlib.sha256(result.tobytes()).hexdigest(),
                           "seconds": time.perf_counter() - began}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4, help="processes computing the maps (2 to 64)")
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside them (0 to 64)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--work-limit", type=WORK_LIMIT, default=None, help="the entry points' work budget "
                        "(default: theirs)")
    budget.add_argument("--time-limit", type=TIME_LIMIT, default=None, help="a wall-clock budget instead, seconds")
    parser.add_argument("--json", type=json_output(), default=None, help="also write the result here")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child of this parent pid
    args = parser.parse_args(argv)
    if args.one is not None:
        from collectives.lifeline import end_with_parent

        end_with_parent(args.one, True)  # a child ends with the parent, however the parent ends
        print(json.dumps(one_process(args.work_limit, args.time_limit)))
        return 0
    if not (2 <= args.processes <= 64 and 0 <= args.busy <= 64):
        parser.error("--processes must be in [2, 64] and --busy in [0, 64]")
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER, str(os.getpid())]) for _ in range(args.busy)]
    children = []
    try:
        command = [sys.executable, __file__, "--one", str(os.getpid())]
        if args.work_limit is not None:
            command += ["--work-limit", str(args.work_limit)]
        if args.time_limit is not None:
            command += ["--time-limit", str(args.time_limit)]
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(args.processes)]
        outputs = [child.communicate()[0].strip().splitlines() for child in children]
    finally:
        for process in spinners + children:
            if process.poll() is None:
                process.kill()
            process.wait()
    failed = [index for index, (child, lines) in enumerate(zip(children, outputs)) if child.returncode or not lines]
    if failed:
        print(f"check_same_map.py: error: process {failed[0]} exited {children[failed[0]].returncode} without its "
              f"maps (its error is above)", file=sys.stderr)
        return 1
    results = [json.loads(lines[-1]) for lines in outputs]
    summary = {}
    for name in results[0]:
        distinct = len({result[name]["hash"] for result in results})
        seconds = [round(result[name]["seconds"], 2) for result in results]
        summary[name] = {"distinct_maps": distinct, "seconds": seconds}
        print(f"{name}: {distinct} distinct map(s) from {args.processes} processes; seconds {seconds}")
    if args.json:
        from traces.atomic_file import write_text_atomically

        write_text_atomically(args.json, json.dumps(summary, indent=1) + "\n")
    return 0 if all(row["distinct_maps"] == 1 for row in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
