"""Does the request-level traffic model hold on real routing it was not fitted to; what do balancers recover?

Two parts (`--part esft|recovery|all`):

- `esft`: ESFT's real routing (DeepSeek-V2-Lite, 64 experts, top-6, `../shared/data/esft-dsv2lite`). The sequences of
  two tasks, in random order, cut into batches of exactly N tokens (whole prompts, the last one chunked, as an
  engine's chunked prefill does), against the same tokens shuffled across sequences, each scored under DeepSeek's
  greedy fitted on the pooled load with equal split: mean over batches and layers of max / mean GPU load. Beside
  them the model (`traces.request_traffic` in prefill mode, the same prompt lengths in the same order and the tasks'
  pooled popularity) with the concentration estimated on the *other* two tasks (`traces.request_concentration`): a
  prediction of whole-batch imbalance on held-out tasks, judged on the excess over 1.0 (within a third). The last
  split calibrates and predicts on all four tasks (the default concentration; not held out).
- `recovery`: what greedy and cpsat recover on request-level traffic, rolling (a refit every 100 steps on the last
  100, scored on the steps after each window): at the decode shapes (continuous batching, outputs of mean 512
  tokens) and at SGLang's prefill shape (32 x 9, 16,384 tokens a GPU, 4K prompts), at the fitted popularity skew
  (`traffic.skew`); and on ESFT's own whole-prompt batches (4 tasks pooled, 16 orders) at 8 x 9, 16 x 5 and 32 x 3.
  Columns: greedy with equal split (SGLang's and vLLM's static dispatch), greedy with the best per-step split, cpsat
  with the live router, the same with the live rebalancer's patches between refits (`placement.patch_planner`
  defaults: can they follow the live batch, whose requests stay for hundreds of steps?), and the yardsticks
  (`placement.yardsticks`): the noise floor at the load (a perfect expectation, sampled, static split), the
  granularity bound of the slots on the expected load, the expectation oracle (cpsat refitted every
  `ORACLE_EVERY` steps on those steps' expected load, no lag, free moves, the live router: what a perfect forecast
  reaches) and the in-batch bound (`placement.bounds` on each scored batch: it knows the batch's noise, so it is a
  floor, not a target). `recovered` is the share of the greedy's excess over the expectation oracle that cpsat
  removes, against the greedy with equal split and with the best split. ESFT's batches have no known expectation:
  their oracle and granularity columns are empty.

Usage: python scripts/bench_request_traffic.py [--part esft|recovery|all] [--work-limit 4] [--json out.json]
"""

import sys
from pathlib import Path

import numpy as np

from eplb.cli.arg_types import number
from eplb.cli.bench_harness import bench_parser, cell, finish, markdown_table
from placement import ClusterSpec, fit_placement, rolling_replay
from placement.patch_planner import PatchSettings
from placement.scoring import score_placement
from placement.yardsticks import expectation_oracle, trace_yardsticks
from traces.request_concentration import estimate_concentration, sequence_counts
from traces.request_traffic import RequestTrafficConfig, request_traffic_TLE, request_traffic_with_expectation

ESFT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "esft-dsv2lite" / \
    "esft_vanilla_lite_routing.npz"
TASKS = ("intent", "law", "summary", "translation")
SPLITS = ((("intent", "law"), ("summary", "translation")), (("summary", "translation"), ("intent", "law")),
          (("intent", "summary"), ("law", "translation")), (("law", "translation"), ("intent", "summary")),
          (("intent", "translation"), ("law", "summary")), (("law", "summary"), ("intent", "translation")),
          (TASKS, TASKS))
ESFT_SHAPES = ((8, 9), (16, 5), (32, 3))
BATCH_TOKENS = (1024, 4096)
ORDERS = 10  # random orders of the sequences cut into batches
# (label, GPUs, slots, stage, tokens a GPU a step)
RECOVERY_SHAPES = (("decode 64 x 5", 64, 5, "decode", 128), ("decode 128 x 3", 128, 3, "decode", 64),
                   ("decode 144 x 2", 144, 2, "decode", 64), ("decode 72 x 4", 72, 4, "decode", 128),
                   ("prefill 32 x 9", 32, 9, "prefill", 16384))
LAYERS, STEPS, EVERY, WINDOW = 4, 300, 100, 100


def esft_batches(tasks: tuple[str, ...], tokens: int, orders: int = ORDERS, seed: int = 0,
                 shuffled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """([B, L, E] counts of chunked batches of `tokens` tokens, [S] prompt lengths in batch order) of the tasks'
    sequences in `orders` random orders (the last partial batch of each order dropped); `shuffled` permutes the
    tokens across sequences first."""
    with np.load(ESFT) as data:
        ids = [data[f"{t}_topk_ids"].astype(np.int64) for t in tasks]
        offsets = [data[f"{t}_seq_offsets"].astype(np.int64) for t in tasks]
    sequences = [task_ids[:, a:b] for task_ids, off in zip(ids, offsets) for a, b in zip(off[:-1], off[1:])]
    layers, experts = sequences[0].shape[0], 64
    rng = np.random.default_rng(seed)
    batches, lengths = [], []
    for _ in range(orders):
        order = rng.permutation(len(sequences))
        stream = np.concatenate([sequences[i] for i in order], axis=1)
        if shuffled:
            stream = stream[:, rng.permutation(stream.shape[1])]
        lengths.append(np.array([sequences[i].shape[1] for i in order]))
        for b in range(stream.shape[1] // tokens):
            picks = stream[:, b * tokens:(b + 1) * tokens].reshape(layers, -1)
            flat = (np.arange(layers)[:, None] * experts + picks).ravel()
            batches.append(np.bincount(flat, minlength=layers * experts).reshape(layers, experts))
    return np.stack(batches), np.concatenate(lengths)


def esft_rows() -> list[dict]:
    """The held-out check (module docstring, `esft`)."""
    rows = []
    for calibration, held_out in SPLITS:
        counts, tokens, top_k = sequence_counts(ESFT, list(calibration))
        alpha = estimate_concentration(counts, tokens, top_k).alpha
        for gpus, slots in ESFT_SHAPES:
            cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8)
            for tokens_per_batch in BATCH_TOKENS:
                whole, prompts = esft_batches(held_out, tokens_per_batch)
                shuffled, _ = esft_batches(held_out, tokens_per_batch, shuffled=True)
                popularity = whole.sum(axis=0)
                placement = fit_placement("deepseek", popularity[None], cluster)
                model = request_traffic_TLE(RequestTrafficConfig(
                    mode="prefill", num_steps=whole.shape[0], num_layers=whole.shape[1], num_experts=64,
                    top_k=top_k, tokens_per_step=tokens_per_batch, concentration=alpha, num_domains=1,
                    drift_strength=0.0, burst_rate=0.0, seed=1), popularity_LE=popularity, prompts=prompts)
                measured, shuffle, modelled = (float(score_placement(placement, c, "static").imbalance_TL.mean())
                                               for c in (whole, shuffled, model))
                ratio = (modelled - 1.0) / (measured - 1.0)
                rows.append({"calibrated_on": "+".join(calibration), "predicted": "+".join(held_out),
                             "held_out": calibration != held_out, "concentration": alpha, "shape": f"{gpus}x{slots}",
                             "tokens": tokens_per_batch, "whole": measured, "shuffled": shuffle, "model": modelled,
                             "excess_ratio": ratio, "within_a_third": abs(ratio - 1.0) <= 1.0 / 3.0})
    return rows


def recovery_rows(work_limit: float) -> list[dict]:
    """The balancers on request-level traffic (module docstring, `recovery`)."""
    from sim.calibration import fitted

    rows = []
    skew = fitted("traffic.skew")
    for label, gpus, slots, stage, per_gpu in RECOVERY_SHAPES:
        settings = {"prompt_tokens": 4096.0} if stage == "prefill" else {"output_tokens": 512.0}
        counts, expected = request_traffic_with_expectation(RequestTrafficConfig(
            mode=stage, num_steps=STEPS, num_layers=LAYERS, num_experts=256, top_k=8, skew=skew,
            tokens_per_step=gpus * per_gpu, seed=0, **settings))
        rows.append(_recovery_row(f"{label} @{per_gpu}", counts, ClusterSpec(
            num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8), work_limit, EVERY, WINDOW, expected))
    if ESFT.is_file():
        for gpus, slots in ESFT_SHAPES:
            whole, _ = esft_batches(TASKS, 1024, orders=16)
            rows.append(_recovery_row(f"ESFT whole prompts {gpus} x {slots} @1024/batch", whole, ClusterSpec(
                num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8), work_limit, 100, 100))
    return rows


ORACLE_EVERY = 10  # the expectation oracle's refit period in steps (the traffic changes by a few requests a step)


def _recovery_row(label: str, counts: np.ndarray, cluster: ClusterSpec, work_limit: float, every: int,
                  window: int, expected: np.ndarray | None = None) -> dict:
    greedy = rolling_replay(counts, cluster, "deepseek", every=every, window=window, routing="static",
                            also_routings=("dynamic",))
    options = {"work_limit": work_limit, "routing": "dynamic"}
    cpsat = rolling_replay(counts, cluster, "cpsat", every=every, window=window, routing="live",
                           policy_options=options)
    patched = rolling_replay(counts, cluster, "cpsat", every=every, window=window, routing="live",
                             policy_options=options, patches=PatchSettings())
    static = float(greedy.held_out.imbalance_TL.mean())
    best = float(greedy.held_out_also["dynamic"].imbalance_TL.mean())
    live = float(cpsat.held_out.imbalance_TL.mean())
    held = slice(window, None)
    yardsticks = trace_yardsticks(counts[held], cluster, None if expected is None else expected[held])
    oracle = None if expected is None else float(expectation_oracle(
        counts[held], expected[held], cluster, "cpsat", "live", ORACLE_EVERY, options).imbalance_TL.mean())
    return {"traffic": label, "greedy_static": static, "greedy_best_split": best, "cpsat_live": live,
            "cpsat_live_patched": float(patched.held_out.imbalance_TL.mean()), "patch_moves": patched.patch_moves,
            "noise_floor": yardsticks["noise_floor"],
            "granularity_bound": yardsticks["granularity_bound"] if expected is not None else None,
            "expectation_oracle": oracle, "in_batch_bound": float(greedy.held_out.lower_bound_TL.mean()),
            "recovered_of_static": _recovered(static, live, oracle),
            "recovered_of_best_split": _recovered(best, live, oracle)}


def _recovered(greedy: float, cpsat: float, oracle: float | None) -> float | None:
    """The share of the greedy's excess over the expectation oracle that cpsat removes (None without an oracle or
    an excess to remove)."""
    if oracle is None or greedy <= oracle:
        return None
    return (greedy - cpsat) / (greedy - oracle)


SGLANG_CONFIGS = ("sglang-h100-prefill-2k.yaml", "sglang-h100-prefill-4k.yaml")


def sglang_rows() -> list[dict]:
    """SGLang's EP32 prefill operating points (sim/anchors) in the simulator's capacity mode, request-level traffic:
    the blog's EPLB (DeepSeek's algorithm, static dispatch), cpsat with the live router in its place, and perfect
    balance; `recovered` is the share of the throughput greedy-static loses to perfect balance that cpsat wins back."""
    from sim.capacity import prefill_capacity
    from sim.validation import ANCHORS_DIR
    from sim.config import load_sim_config

    rows = []
    for name in SGLANG_CONFIGS:
        stated = load_sim_config(ANCHORS_DIR / name)
        cpsat = stated.model_copy(update={"balance": stated.balance.model_copy(
            update={"policy": "cpsat", "routing": "live"})})
        per_node = stated.cluster.cards_per_node
        greedy_run, cpsat_run = prefill_capacity(stated), prefill_capacity(cpsat)
        perfect = prefill_capacity(stated, 1.0)["tokens_per_s_per_card"] * per_node
        greedy, live = (run["tokens_per_s_per_card"] * per_node for run in (greedy_run, cpsat_run))
        rows.append({"config": name, "greedy_static_imbalance": greedy_run["imbalance"],
                     "cpsat_live_imbalance": cpsat_run["imbalance"], "greedy_static_tokens_per_s_per_node": greedy,
                     "cpsat_live_tokens_per_s_per_node": live, "perfect_tokens_per_s_per_node": perfect,
                     "recovered": (live - greedy) / (perfect - greedy)})
    return rows


def sglang_table(rows: list[dict]) -> str:
    return markdown_table(
        ("operating point", "greedy, static: imbalance, tokens/s per node", "cpsat, live router", "perfect balance",
         "throughput recovered"),
        ((r["config"], f"{r['greedy_static_imbalance']:.3f}, {r['greedy_static_tokens_per_s_per_node']:,.0f}",
          f"{r['cpsat_live_imbalance']:.3f}, {r['cpsat_live_tokens_per_s_per_node']:,.0f}",
          f"1.000, {r['perfect_tokens_per_s_per_node']:,.0f}", f"{r['recovered']:.0%}") for r in rows))


def esft_table(rows: list[dict]) -> str:
    held = [r for r in rows if r["held_out"]]
    return markdown_table(
        ("calibrated on -> predicted", "alpha", "shape", "tokens", "whole", "shuffled", "model",
         "model/measured excess"),
        ((f"{r['calibrated_on']} -> {r['predicted']}", f"{r['concentration']:.0f}", r["shape"], f"{r['tokens']:,}",
          f"{r['whole']:.3f}", f"{r['shuffled']:.3f}", f"{r['model']:.3f}",
          f"{r['excess_ratio']:.2f}{'' if r['within_a_third'] else ' (miss)'}") for r in rows)) + (
        f"\nheld-out rows within a third of the measured excess: {sum(r['within_a_third'] for r in held)} of "
        f"{len(held)}")


def recovery_table(rows: list[dict]) -> str:
    return markdown_table(
        ("traffic", "greedy, equal split", "greedy, best split", "cpsat, live router", "cpsat + patches",
         "noise floor", "granularity bound", "expectation oracle", "in-batch bound (knows the noise)",
         "recovered of the oracle gap: from equal split, from best split"),
        ((r["traffic"], f"{r['greedy_static']:.4f}", f"{r['greedy_best_split']:.4f}", f"{r['cpsat_live']:.4f}",
          f"{r['cpsat_live_patched']:.4f} ({r['patch_moves']} moves)", f"{r['noise_floor']:.4f}",
          cell(r["granularity_bound"], ".4f"), cell(r["expectation_oracle"], ".4f"), f"{r['in_batch_bound']:.4f}",
          f"{cell(r['recovered_of_static'], '.0%')}, {cell(r['recovered_of_best_split'], '.0%')}") for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--part", choices=("esft", "recovery", "all"), default="all")
    parser.add_argument("--work-limit", type=number(0, low_open=True, high=3600), default=4.0,
                        help="cpsat's deterministic budget per fit")
    args = parser.parse_args(argv)
    if args.part in ("esft", "all") and not ESFT.is_file():
        parser.error(f"the ESFT routing log is not at {ESFT}; run from a checkout beside ../shared/data, or pass "
                     f"--part recovery")
    result, tables = {}, []
    if args.part in ("esft", "all"):
        result["esft"] = esft_rows()
        tables.append(esft_table(result["esft"]))
    if args.part in ("recovery", "all"):
        result["recovery"] = recovery_rows(args.work_limit)
        result["sglang_prefill"] = sglang_rows()
        tables += [recovery_table(result["recovery"]), sglang_table(result["sglang_prefill"])]
    return finish(args.json, result, *tables)

if __name__ == "__main__":
    sys.exit(main())
