"""Where does cpsat beat the greedy at production's shapes: two to nine slots per GPU, few or no redundant experts?

Shapes (DESIGN.md, 'Numbers everyone uses'): 144 GPUs x 2 slots (DeepSeek-V3 decode, 256 + 32), 72 x 4 (SGLang's
EP72, 256 + 32), 64 x 4 and 128 x 2 (no redundant slot, vLLM's default), 32 x 9 (EP32 prefill, 2,048 tokens a GPU);
128 tokens a GPU a step elsewhere. Traffic: synthetic decode routing (`traces.synthetic`, 256 experts, top-8, four
drifting domains, a few bursts) with lognormal popularity of sigma 0.6 and 1.2. Each trace is replayed rolling (a
refit every `--every` steps on the last `--window`, lag 0) and every placement is scored on its own window
("fitted") and on the steps it serves ("held-out"):

- `deepseek` under the best per-step split (`--routing dynamic`: the greedy's placement with the best router any
  engine could run);
- `cpsat` under the live router (`placement.routing`: what a decode worker runs), fitted for dynamic routing;
- the bound: the replay's per-step lower bound (`placement.bounds`), the mean over the held-out steps, and over the
  fit windows' steps (fitted): the fit's proven gap is its fitted imbalance minus the latter.

With `--oracle`, also each policy's oracle: every served segment's placement fitted on a twin of that segment (the
same popularity, other samples: `SyntheticConfig.sample_seed`), scored on the trace's segment: what the policy serves
when the popularity the held-out steps are drawn from is known, so the gap between the rolling fit and it is
forecast error, and the oracles' difference is what placement alone can gain.

With `--real` (and ../shared/data present), instead, real routing: ESFT's four tasks in one stream (256 tokens a
step, a task switch every ~32 steps) rolling every 16 steps on the last 16 at 12 x 6, 24 x 4 and 36 x 2 (144 x 2's
two slots a GPU and one redundant slot in eight, for 64 experts), the greedy under
the best split against `cpsat` under the live router; and OLMoE's per-domain totals (3 layers x 64 experts, top-8)
at 2 and 4 slots per GPU with and without redundant slots, each placement fitted on one domain's totals and scored
on 64 decode steps drawn from them (128 tokens a GPU: the steps' own noise) and on each other domain (a switch of
traffic), under equal split (`rebalance_experts`, what vLLM and SGLang route) and under the best split
(`fit_placement`, dynamic).

With `--traffic requests`, the synthetic traffic is request-level (`traces.request_traffic`: requests keep their own
experts; decode steps under continuous batching, and at 32 x 9 prefill batches of whole 4K prompts, chunked) at the
same skews, beside today's independent tokens.

With `--groups 8`, also node-limited rows: the hierarchical greedy (each of 8 expert groups on one node) under the
best split against `cpsat` with `groups=8, nodes_per_group=1` under the live router, on the shapes whose GPU count
is a multiple of 8 nodes' worth.

Usage: python scripts/bench_production.py [--shapes 144x2 72x4 64x4 128x2 32x9] [--skews 0.6 1.2] [--steps 400]
       [--layers 4] [--every 100] [--window 100] [--seed 0] [--groups 8] [--oracle] [--work-limit 20]
       [--real] [--traffic tokens|requests] [--json out.json]
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

from eplb import rebalance_experts
from eplb.cli.arg_types import integer, number
from eplb.cli.bench_harness import bench_parser, cell, finish, markdown_table
from placement import ClusterSpec, Placement, fit_placement, rolling_replay, score_placement
from traces import load_trace
from placement.yardsticks import expectation_oracle, trace_yardsticks
from traces.request_traffic import RequestTrafficConfig, request_traffic_with_expectation
from traces.synthetic import SyntheticConfig, expected_counts_TLE, generate_trace

# "G x S" -> tokens a GPU carries a step (EP32 prefill batches 2,048 tokens a GPU; decode 128)
SHAPES = {"144x2": 128, "72x4": 128, "64x4": 128, "128x2": 128, "32x9": 2048}
PREFILL_SHAPES = ("32x9",)  # under --traffic requests, prefill batches of whole prompts; the others decode
PREFILL_PROMPT_TOKENS = 4096.0
NUM_EXPERTS = 256
TOP_K = 8
TWIN_SAMPLE_SEED = 1_000_003
# The expectation oracle's cpsat budget a fit (it fits one expected row: 1 and 4 units land within 0.001 at 72 x 4).
ORACLE_WORK_LIMIT = 1.0
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ESFT = DATA / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"
OLMOE = DATA / "olmoe-counts" / "olmoe_mixtral_routing_counts.npz"
# GPUs, slots per GPU, GPUs per node; 36 x 2 is DeepSeek-V3's 144 x 2 for 64 experts (2 slots a GPU, 1/8 redundant)
ESFT_CLUSTERS = ((12, 6, 4), (24, 4, 8), (36, 2, 4))
OLMOE_SHAPES = ((32, 2), (36, 2), (16, 4), (18, 4))  # 64 experts: none or 8 redundant slots
OLMOE_DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")
OLMOE_TOP_K = 8
OLMOE_STEPS = 64  # decode steps drawn from a domain's totals, at 128 tokens a GPU
TOKENS_PER_GPU = 128


def parse_shape(text: str) -> tuple[int, int]:
    gpus, slots = text.lower().split("x")
    return int(gpus), int(slots)


def trace(gpus: int, tokens_per_gpu: int, skew: float, steps: int, layers: int, seed: int,
          sample_seed: int | None = None, traffic: str = "tokens", stage: str = "decode") -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """([T, L, 256] synthetic counts at `gpus * tokens_per_gpu` tokens a step, [T, L, 256] their expected counts),
    lognormal popularity of sigma `skew` (with `sample_seed`, the twin: the same popularity and requests, other
    samples); `traffic` "requests" draws request-level traffic of `stage` (decode: continuous batching, outputs of
    mean 512; prefill: chunked batches of 4K prompts), "tokens" independent tokens."""
    if traffic == "requests":
        stage_settings = {"prompt_tokens": PREFILL_PROMPT_TOKENS} if stage == "prefill" else {}
        return request_traffic_with_expectation(RequestTrafficConfig(
            mode=stage, num_steps=steps, num_layers=layers, num_experts=NUM_EXPERTS, top_k=TOP_K,
            tokens_per_step=gpus * tokens_per_gpu, seed=seed, skew=skew, sample_seed=sample_seed, **stage_settings))
    config = SyntheticConfig(num_steps=steps, num_layers=layers, num_experts=NUM_EXPERTS, top_k=TOP_K,
                             tokens_per_step=gpus * tokens_per_gpu, seed=seed, skew=skew, sample_seed=sample_seed)
    return generate_trace(config).counts_TLE, expected_counts_TLE(config)


def yardstick_row(counts_TLE: np.ndarray, expected_TLE: np.ndarray, cluster: ClusterSpec, options: dict,
                  window: int, oracle_every: int) -> dict:
    """The held-out steps' yardsticks (`placement.yardsticks`): the noise floor, the granularity bound on the expected
    load and the expectation oracle (cpsat with `options` refitted every `oracle_every` steps on those steps'
    expected load, no lag, the live router; `ORACLE_WORK_LIMIT` units a fit)."""
    held = slice(window, None)
    found = trace_yardsticks(counts_TLE[held], cluster, expected_TLE[held])
    oracle = expectation_oracle(counts_TLE[held], expected_TLE[held], cluster, "cpsat", "live", oracle_every, options)
    return {"noise_floor": found["noise_floor"], "granularity_bound": found["granularity_bound"],
            "expectation_oracle": float(oracle.imbalance_TL.mean())}


def oracle_row(counts_TLE: np.ndarray, twin_TLE: np.ndarray, cluster: ClusterSpec, policy: str, routing: str,
               options: dict, every: int, window: int) -> dict:
    """Held-out imbalance with each served segment's placement fitted on the twin's counts of that segment."""
    scores = []
    for start in range(window, counts_TLE.shape[0], every):
        segment = slice(start, min(start + every, counts_TLE.shape[0]))
        placement = fit_placement(policy, twin_TLE[segment], cluster, **options)
        scores.append(score_placement(placement, counts_TLE[segment], routing).imbalance_TL)
    return {"policy": policy, "routing": routing, "oracle": float(np.concatenate(scores).mean())}


def replay_row(counts_TLE: np.ndarray, cluster: ClusterSpec, policy: str, routing: str, options: dict,
               every: int, window: int) -> dict:
    began = time.perf_counter()
    result = rolling_replay(counts_TLE, cluster, policy, every=every, window=window, routing=routing,
                            policy_options=options)
    held, fitted = result.held_out.summary(), result.fitted.summary()
    return {"policy": policy, "routing": routing, "held_out": held["imbalance_mean"], "held_out_p99":
            held["imbalance_p99"], "fitted": fitted["imbalance_mean"], "bound": held["lower_bound"],
            "fitted_bound": fitted["lower_bound"],
            "fits": len(result.fit_seconds), "fit_seconds_mean": float(np.mean(result.fit_seconds)),
            "seconds": time.perf_counter() - began}


def measure(shapes: list[str], skews: list[float], steps: int, layers: int, every: int, window: int, seed: int,
            groups: int | None, cpsat_options: dict, oracle: bool = False, traffic: str = "tokens",
            oracle_every: int = 10) -> list[dict]:
    rows = []
    for shape in shapes:
        gpus, slots = parse_shape(shape)
        tokens_per_gpu = SHAPES.get(shape, 128)
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
        for skew in skews:
            stage = "prefill" if shape in PREFILL_SHAPES else "decode"
            counts_TLE, expected_TLE = trace(gpus, tokens_per_gpu, skew, steps, layers, seed, traffic=traffic,
                                             stage=stage)
            limits = [None] + ([groups] if groups and cluster.num_nodes >= 1 and groups % cluster.num_nodes == 0
                               else [])
            for group_count in limits:
                greedy_options = {} if group_count is None else {"num_groups": group_count}
                node_options = {} if group_count is None else {"groups": group_count, "nodes_per_group": 1}
                found = [replay_row(counts_TLE, cluster, "deepseek", "dynamic", greedy_options, every, window),
                         replay_row(counts_TLE, cluster, "cpsat", "live",
                                    {"routing": "dynamic", **cpsat_options, **node_options}, every, window)]
                yardsticks = yardstick_row(counts_TLE, expected_TLE, cluster, {"routing": "dynamic",
                                           "work_limit": ORACLE_WORK_LIMIT, **node_options}, window, oracle_every)
                greedy_row, cpsat_row = found
                gap = greedy_row["held_out"] - yardsticks["expectation_oracle"]
                yardsticks["recovered"] = (greedy_row["held_out"] - cpsat_row["held_out"]) / gap if gap > 0 else None
                if oracle:
                    twin_TLE, _ = trace(gpus, tokens_per_gpu, skew, steps, layers, seed, TWIN_SAMPLE_SEED, traffic,
                                        stage)
                    for row, options in zip(found, (greedy_options, {"routing": "dynamic", **cpsat_options,
                                                                       **node_options})):
                        row["oracle"] = oracle_row(counts_TLE, twin_TLE, cluster, row["policy"], row["routing"],
                                                   options, every, window)["oracle"]
                for row in found:
                    row.update({"shape": f"{gpus} x {slots}", "tokens_per_gpu": tokens_per_gpu, "traffic": traffic,
                                "redundant": gpus * slots - NUM_EXPERTS, "skew": skew,
                                "groups": group_count, **yardsticks})
                    print(f"{row['shape']} skew {skew} groups {group_count} {row['policy']}/{row['routing']}: "
                          f"held-out {row['held_out']:.4f} (fitted {row['fitted']:.4f}) bound {row['bound']:.4f} "
                          f"fit {row['fit_seconds_mean']:.2f} s", file=sys.stderr, flush=True)
                rows.extend(found)
    return rows


def real_rows(options: dict) -> list[dict]:
    """ESFT rolling rows and OLMoE cross-domain rows (see the module docstring)."""
    rows = []
    counts_TLE = load_trace(ESFT, tokens_per_step=256).counts_TLE
    for gpus, slots, per_node in ESFT_CLUSTERS:
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=per_node)
        greedy = replay_row(counts_TLE, cluster, "deepseek", "dynamic", {}, 16, 16)
        cpsat = replay_row(counts_TLE, cluster, "cpsat", "live", {"routing": "dynamic", **options}, 16, 16)
        rows.append({"data": "ESFT, four tasks, 256 tokens a step, refit every 16 on 16", "shape": f"{gpus} x {slots}",
                     "routing": "greedy: best split; cpsat: live router", "greedy": greedy["held_out"],
                     "cpsat": cpsat["held_out"], "greedy_fitted": greedy["fitted"], "cpsat_fitted": cpsat["fitted"],
                     "bound": greedy["bound"]})
    data = np.load(OLMOE)
    totals = {domain: data[f"olmoe__expert_counts__{domain}"] for domain in OLMOE_DOMAINS}  # [3, 64] each
    for gpus, slots in OLMOE_SHAPES:
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=gpus // 2)
        for routing in ("equal", "dynamic"):
            score = "static" if routing == "equal" else "dynamic"
            scores = {name: {"fitted": [], "sampled": [], "others": []} for name in ("greedy", "cpsat")}
            for domain, fit_LE in totals.items():
                steps_TLE = _sampled_steps(fit_LE, gpus * TOKENS_PER_GPU * OLMOE_TOP_K, OLMOE_STEPS)
                for name, found in scores.items():
                    placement = _olmoe_fit(name, routing, fit_LE, cluster, options)
                    found["fitted"].append(score_placement(placement, fit_LE[None], score).imbalance_TL.mean())
                    found["sampled"].append(score_placement(placement, steps_TLE, score).imbalance_TL.mean())
                    found["others"].extend(score_placement(placement, other[None], score).imbalance_TL.mean()
                                           for other_domain, other in totals.items() if other_domain != domain)
            for held in ("sampled", "others"):
                what = ("its own domain's sampled steps" if held == "sampled" else "the other domains")
                rows.append({"data": f"OLMoE per-domain totals, fit one domain, score {what}",
                             "shape": f"{gpus} x {slots}", "routing": routing,
                             **{name: float(np.mean(found[held])) for name, found in scores.items()},
                             **{f"{name}_fitted": float(np.mean(found["fitted"])) for name, found in scores.items()},
                             "bound": None})
                print(f"OLMoE {gpus} x {slots} {routing} {held}: greedy {rows[-1]['greedy']:.4f} cpsat "
                      f"{rows[-1]['cpsat']:.4f}", file=sys.stderr, flush=True)
    return rows


def _sampled_steps(total_LE: np.ndarray, picks: int, steps: int) -> np.ndarray:
    """[steps, L, E] decode steps drawn from the domain's totals [L, E]: `picks` expert picks a layer a step
    (multinomial; tokens pick distinct experts, so this slightly overstates the noise)."""
    rng = np.random.default_rng(int(total_LE.sum()) % 2**32)
    shares_LE = total_LE / total_LE.sum(axis=1, keepdims=True)
    return rng.multinomial(picks, shares_LE, size=(steps, len(total_LE)))


def _olmoe_fit(name: str, routing: str, fit_LE: np.ndarray, cluster: ClusterSpec, options: dict) -> Placement:
    """The greedy or cpsat placement of one domain's totals [L, E]: under equal split through the adapter (what
    vLLM runs), else `fit_placement` for the dynamic split."""
    if routing == "equal":
        phy2log, _, _ = rebalance_experts(torch.from_numpy(fit_LE), cluster.num_slots, 1, 1, cluster.num_gpus,
                                          "cpsat" if name == "cpsat" else "deepseek")
        return Placement.equal_split(phy2log.numpy(), cluster, fit_LE.shape[1])
    if name == "greedy":
        return fit_placement("deepseek", fit_LE[None], cluster)
    return fit_placement("cpsat", fit_LE[None], cluster, routing="dynamic", **options)


def real_table(rows: list[dict]) -> str:
    return markdown_table(
        ("real routing", "shape", "routing", "greedy: held-out (fitted)", "cpsat: held-out (fitted)", "cpsat - greedy"),
        ((row["data"], row["shape"], row["routing"], f"{row['greedy']:.4f} ({row['greedy_fitted']:.4f})",
          f"{row['cpsat']:.4f} ({row['cpsat_fitted']:.4f})", f"{row['cpsat'] - row['greedy']:+.4f}") for row in rows))


def table(rows: list[dict]) -> str:
    oracle = "oracle" in rows[0]
    header = ["shape", "redundant", "popularity", "node limit", "greedy + best split: held-out (fitted)",
              "cpsat, live router: held-out (fitted)", "cpsat - greedy", "in-batch bound: held-out (fitted)",
              "cpsat's gap to its fitted bound", "noise floor", "granularity bound", "expectation oracle",
              "recovered of the oracle gap"] + (["twin oracle: greedy / cpsat"] if oracle else [])
    lines = []
    for greedy, cpsat in zip(rows[0::2], rows[1::2]):
        limit = "-" if greedy["groups"] is None else f"{greedy['groups']} groups, 1 node each"
        requests = ", requests" if greedy.get("traffic") == "requests" else ""
        lines.append([greedy["shape"], greedy["redundant"], f"lognormal {greedy['skew']:g}{requests}", limit,
                      f"{greedy['held_out']:.4f} ({greedy['fitted']:.4f})",
                      f"{cpsat['held_out']:.4f} ({cpsat['fitted']:.4f})",
                      f"{cpsat['held_out'] - greedy['held_out']:+.4f}",
                      f"{greedy['bound']:.4f} ({cpsat['fitted_bound']:.4f})",
                      f"{cpsat['fitted'] - cpsat['fitted_bound']:.4f}", f"{greedy['noise_floor']:.4f}",
                      f"{greedy['granularity_bound']:.4f}", f"{greedy['expectation_oracle']:.4f}",
                      cell(greedy["recovered"], ".0%")]
                     + ([f"{greedy['oracle']:.4f} / {cpsat['oracle']:.4f}"] if oracle else []))
    return markdown_table(header, lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="GxS shapes (default: %(default)s)")
    parser.add_argument("--skews", type=number(0, high=5), nargs="+", default=[0.6, 1.2], help="lognormal sigmas")
    parser.add_argument("--steps", type=integer(2, 20_000), default=400, help="steps of each trace")
    parser.add_argument("--layers", type=integer(1, 61), default=4, help="layers of each trace")
    parser.add_argument("--every", type=integer(1, 20_000), default=100, help="refit every N steps")
    parser.add_argument("--window", type=integer(1, 20_000), default=100, help="fit on the last W steps")
    parser.add_argument("--seed", type=integer(0, 2**32 - 1), default=0, help="trace seed")
    parser.add_argument("--groups", type=integer(1, NUM_EXPERTS), default=None,
                        help="also node-limited rows with this many groups")
    parser.add_argument("--oracle", action="store_true", help="also each policy's twin oracle (each segment fitted "
                        "on a twin of its steps: the same popularity, other samples)")
    parser.add_argument("--oracle-every", type=integer(1, 20_000), default=10, help="the expectation oracle refits "
                        "cpsat every N steps on those steps' expected load (default 10)")
    parser.add_argument("--real", action="store_true", help="instead, the real-routing rows (ESFT, OLMoE)")
    parser.add_argument("--traffic", choices=("tokens", "requests"), default="tokens",
                        help="synthetic traffic: independent tokens, or requests that keep their own experts "
                             "(decode under continuous batching; 32x9: prefill batches of whole 4K prompts)")
    parser.add_argument("--work-limit", type=number(0, low_open=True, high=1e6), default=None,
                        help="cpsat: work budget per fit (default: CpSatConfig's)")
    args = parser.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes]
        for gpus, slots in shapes:
            ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
    except ValueError:
        parser.error("--shapes take the form GxS, G a multiple of 8 (whole nodes) within the cluster limits, for "
                     "example 144x2")
    if min(g * s for g, s in shapes) < NUM_EXPERTS or args.window + 1 > args.steps:
        parser.error(f"every shape needs at least {NUM_EXPERTS} slots, and --steps must exceed --window")
    if args.groups is not None and (NUM_EXPERTS % args.groups
                                    or all(args.groups % -(-gpus // 8) for gpus, _ in shapes)):  # nodes
        parser.error(f"--groups must divide {NUM_EXPERTS} and be a multiple of some shape's node count (G / 8)")
    options = {} if args.work_limit is None else {"work_limit": args.work_limit}
    if args.real:
        if not (ESFT.exists() and OLMOE.exists()):
            parser.error(f"--real needs the ESFT and OLMoE data under {DATA}")
        rows = real_rows(options)
        return finish(args.json, rows, real_table(rows))
    rows = measure(args.shapes, args.skews, args.steps, args.layers, args.every, args.window, args.seed,
                   args.groups, options, args.oracle, args.traffic, args.oracle_every)
    return finish(args.json, rows, table(rows))

if __name__ == "__main__":
    sys.exit(main())
