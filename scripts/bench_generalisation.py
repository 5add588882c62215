"""Is `cpsat` ever worse than DeepSeek's greedy on traffic neither was tuned on, trace seed by trace seed?

A placement fitted closer to its window can serve the steps after it worse: at two slots per GPU the exact pairing
of experts chosen on 100 noisy, drifting, bursty steps need not carry to the next 100. This benchmark judges the
policy only on steps it was not fitted to, on traffic from settings and seeds no part of the policy was chosen on:

- `--traffic synthetic` (default): `traces.synthetic` with HELD_OUT_SETTINGS (other drift, burst and domain settings
  than the generator's defaults and than the traffic the policy's choice rule was measured on), seeds SEEDS;
- `--traffic tuning`: `traces.synthetic` with TUNING_SETTINGS, the traffic the policy's two-slot rule was chosen
  on (`cpsat_layer.swaps_only`), with `--seeds 101 102 103` as measured there: a check of that choice, not a
  held-out test;
- `--traffic requests`: request-level traffic (`traces.request_traffic`: requests that keep their own experts; decode
  under continuous batching, and at 32 x 9 prefill batches of whole 4K prompts) at HELD_OUT_SETTINGS' drift, bursts
  and domains, seeds SEEDS;
- `--traffic regime`: `regime_trace` below, a generator that shares no code with `traces.synthetic`: the domain mix
  jumps between Dirichlet draws (ramped over a few steps) at random times, every expert's popularity also walks
  (an Ornstein-Uhlenbeck process in log space), bursts have lognormal factors and geometric lengths, and the picks
  of a step are one multinomial over pick probabilities capped at 1 / top-k;
- `--traffic esft` and `--traffic olmoe`: real routing from `../shared/data` (64 experts; rows REAL_ROWS);
- `--traffic aside` and `--traffic geometry`: the generators kept aside until a two-slot rule's final table
  (`scripts/aside_traffic.py` for the 2026-12-06 rule, `scripts/aside_geometry.py` for the present one).

Each trace (256 experts, top-8, 4 layers, 300 steps, 128 tokens a GPU a step, 2,048 at 32 x 9) is replayed rolling,
a refit every 100 steps on the last 100, served `lag` steps after its window ends: the greedy under the best
per-step split (`--routing dynamic`: the best router any engine could run beside it) against `cpsat` fitted for
dynamic routing under the live router (what a decode worker runs). Rows: at 144 x 2 (DeepSeek-V3's decode) lognormal
0.6, 0.9, 1.2 and 1.5 at lag 0 and 100; at 72 x 4, 64 x 4 and 32 x 9 lognormal 0.6 and 1.2 at lag 0. Each row gives
both held-out means over its seeds, cpsat - greedy per seed, their mean and the worst seed.

Usage: python scripts/bench_generalisation.py [--traffic synthetic|tuning|regime|requests|esft|olmoe|aside|geometry]
       [--seeds 301 302 303]
       [--rows 144x2] [--work-limit 20] [--json out.json]
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np

from eplb.cli.arg_types import SEED_MAX, integer, number
from eplb.cli.bench_harness import bench_parser, finish, markdown_table
from placement import ClusterSpec, rolling_replay
from traces.request_traffic import RequestTrafficConfig, request_traffic_TLE
from traces.synthetic import SyntheticConfig, generate_trace
from traces.trace_io import load_trace

NUM_EXPERTS, TOP_K, LAYERS, STEPS, EVERY, WINDOW = 256, 8, 4, 300, 100, 100
SEEDS = (301, 302, 303)
# (shape, lognormal sigmas, lags); tokens a GPU a step: 2,048 at 32 x 9 (EP32 prefill), else 128 (decode).
ROWS = (("144x2", (0.6, 0.9, 1.2, 1.5), (0, 100)), ("72x4", (0.6, 1.2), (0,)), ("64x4", (0.6, 1.2), (0,)),
        ("32x9", (0.6, 1.2), (0,)))
HELD_OUT_SETTINGS = {"drift_period_steps": 800.0, "drift_strength": 1.0, "burst_rate": 3.0,
                     "burst_length_steps": 40.0, "burst_factor": 4.0, "num_domains": 5, "domain_overlap": 0.75}
TUNING_SETTINGS = {"drift_period_steps": 1500.0, "drift_strength": 0.8, "burst_rate": 5.0, "burst_length_steps": 20.0,
                   "burst_factor": 6.0, "num_domains": 6, "domain_overlap": 0.8}
# Request-level traffic is also judged at the simulator's two skew scenarios (`sim.scenarios`): the fitted
# single-dataset skew and a pooled production mix's.
REQUEST_SKEWS = (0.5, 1.251)
# Real routing (64 experts): two slots a GPU with one redundant slot in eight, four with and without.
REAL_ROWS = (("36x2", (None,), (0,)), ("18x4", (None,), (0,)), ("16x4", (None,), (0,)))
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ESFT = DATA / "esft-dsv2lite" / "esft_vanilla_lite_routing.npz"
OLMOE = DATA / "olmoe-counts" / "olmoe_mixtral_routing_counts.npz"
ESFT_TOKENS, ESFT_EVERY = 256, 16  # ESFT's ~33k tokens give 130 steps of 256: a refit every 16 on the last 16
OLMOE_DOMAINS, OLMOE_TOP_K, OLMOE_SPELL = ("arxiv", "book", "c4", "github", "wikipedia"), 8, 60
TRAFFICS = ("synthetic", "tuning", "regime", "requests", "esft", "olmoe", "aside", "geometry")
WORST_ALLOWED = 0.005  # a single trace may be worse than the greedy by at most this


def regime_trace(steps: int, layers: int, tokens: int, sigma: float, seed: int, domains: int = 5,
                 overlap: float = 0.8, regime_steps: float = 80.0, ramp_steps: int = 20, walk_sd: float = 0.1,
                 walk_steps: float = 200.0, burst_rate: float = 4.0, burst_steps: float = 25.0,
                 burst_factor: float = 5.0) -> np.ndarray:
    """[steps, layers, 256] counts, top-8, `tokens` tokens a step (see the module docstring): domain scores correlated
    `overlap` with a shared base, weights exp(sigma * score); a new Dirichlet(2) mix every ~`regime_steps` steps,
    ramped in over `ramp_steps`; log-popularity walks with stationary sd `walk_sd` and time constant `walk_steps`;
    `burst_rate` bursts per layer per 1,000 steps, each on a uniform expert, ~`burst_steps` long, factor lognormal
    around `burst_factor`."""
    rng = np.random.default_rng([seed, 7919])
    base_LE = rng.standard_normal((layers, NUM_EXPERTS))
    score_ZLE = overlap * base_LE + np.sqrt(1 - overlap ** 2) * rng.standard_normal((domains, layers, NUM_EXPERTS))
    weight_ZLE = np.exp(sigma * score_ZLE)
    mix_TZ = np.empty((steps, domains))
    step, previous = 0, rng.dirichlet(np.full(domains, 2.0))
    while step < steps:
        following = rng.dirichlet(np.full(domains, 2.0))
        for i in range(1 + int(rng.geometric(1 / regime_steps))):
            if step == steps:
                break
            share = min(1.0, i / ramp_steps)
            mix_TZ[step] = (1 - share) * previous + share * following
            step += 1
        previous = following
    boost_TLE = np.ones((steps, layers, NUM_EXPERTS))
    for _ in range(rng.poisson(burst_rate * steps / 1000 * layers)):
        layer, expert, start = rng.integers(layers), rng.integers(NUM_EXPERTS), rng.integers(steps)
        boost_TLE[start:start + rng.geometric(1 / burst_steps), layer, expert] *= np.exp(
            rng.normal(np.log(burst_factor), 0.3))
    walk_LE = np.zeros((layers, NUM_EXPERTS))
    pull = 1 / walk_steps
    counts_TLE = np.empty((steps, layers, NUM_EXPERTS), dtype=np.int64)
    for t in range(steps):
        walk_LE = walk_LE * (1 - pull) + walk_sd * np.sqrt(2 * pull) * rng.standard_normal(walk_LE.shape)
        pick_LE = np.einsum("z,zle->le", mix_TZ[t], weight_ZLE) * np.exp(sigma * walk_LE) * boost_TLE[t]
        for layer in range(layers):
            counts_TLE[t, layer] = np.minimum(rng.multinomial(tokens * TOP_K, _capped(pick_LE[layer])), tokens)
    return counts_TLE


def _capped(weight_E: np.ndarray) -> np.ndarray:
    """Pick probabilities of `weight_E`, none above 1 / top-k (a token picks distinct experts), the excess handed to
    the others in proportion."""
    p = weight_E / weight_E.sum()
    for _ in range(NUM_EXPERTS):
        over = p > 1 / TOP_K
        if not over.any():
            break
        excess = (p[over] - 1 / TOP_K).sum()
        p[over] = 1 / TOP_K
        free = p < 1 / TOP_K
        p[free] += excess * p[free] / p[free].sum()
    return p / p.sum()


def esft_trace(seed: int) -> np.ndarray:
    """ESFT's four tasks in file order as one stream of ESFT_TOKENS tokens a step (a task switch every ~32 steps), on 4
    of its 26 layers drawn by `seed`: [130, 4, 64]."""
    counts_TLE = load_trace(ESFT, tokens_per_step=ESFT_TOKENS).counts_TLE
    layers = np.sort(np.random.default_rng(seed).choice(counts_TLE.shape[1], LAYERS, replace=False))
    return counts_TLE[:, layers]


def olmoe_trace(gpus: int, tokens_per_gpu: int, seed: int) -> np.ndarray:
    """STEPS decode steps of OLMoE's real per-domain popularity (3 layers x 64 experts, top-8): the domain switches
    every OLMOE_SPELL steps in an order drawn by `seed`, each step's picks a multinomial of that domain's shares."""
    data = np.load(OLMOE)
    rng = np.random.default_rng([seed, 31])
    shares = {domain: data[f"olmoe__expert_counts__{domain}"] / data[f"olmoe__expert_counts__{domain}"].sum(
        axis=1, keepdims=True) for domain in OLMOE_DOMAINS}
    order = [OLMOE_DOMAINS[i] for i in rng.permutation(len(OLMOE_DOMAINS))]
    return np.stack([rng.multinomial(gpus * tokens_per_gpu * OLMOE_TOP_K, shares[order[(t // OLMOE_SPELL)
                                                                                        % len(order)]])
                     for t in range(STEPS)])


def _aside_generator(name: str = "aside_traffic"):
    """`scripts/<name>.py` (a generator kept aside) loaded by its path (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace(traffic: str, gpus: int, tokens_per_gpu: int, sigma: float, seed: int, stage: str = "decode") -> np.ndarray:
    if traffic == "esft":
        return esft_trace(seed)
    if traffic == "olmoe":
        return olmoe_trace(gpus, tokens_per_gpu, seed)
    if traffic == "aside":
        return _aside_generator().aside_trace(STEPS, LAYERS, NUM_EXPERTS, gpus * tokens_per_gpu, sigma, seed)
    if traffic == "geometry":
        return _aside_generator("aside_geometry").geometry_trace(STEPS, LAYERS, NUM_EXPERTS, gpus * tokens_per_gpu,
                                                                  sigma, seed)
    if traffic == "regime":
        return regime_trace(STEPS, LAYERS, gpus * tokens_per_gpu, sigma, seed)
    if traffic == "requests":
        lengths = {"prompt_tokens": 4096.0} if stage == "prefill" else {}
        return request_traffic_TLE(RequestTrafficConfig(
            mode=stage, num_steps=STEPS, num_layers=LAYERS, num_experts=NUM_EXPERTS, top_k=TOP_K,
            tokens_per_step=gpus * tokens_per_gpu, seed=seed, skew=sigma, **lengths, **HELD_OUT_SETTINGS))
    settings = TUNING_SETTINGS if traffic == "tuning" else HELD_OUT_SETTINGS
    config = SyntheticConfig(num_steps=STEPS, num_layers=LAYERS, num_experts=NUM_EXPERTS, top_k=TOP_K,
                             tokens_per_step=gpus * tokens_per_gpu, seed=seed, skew=sigma, **settings)
    return generate_trace(config).counts_TLE


def held_out(counts_TLE: np.ndarray, cluster: ClusterSpec, lag: int, options: dict,
             every: int = EVERY) -> tuple[float, float]:
    """(greedy under the best split, cpsat under the live router): held-out imbalance, mean over (step, layer), a
    refit every `every` steps on the last `every`."""
    greedy = rolling_replay(counts_TLE, cluster, "deepseek", every=every, window=every, routing="dynamic", lag=lag)
    cpsat = rolling_replay(counts_TLE, cluster, "cpsat", every=every, window=every, routing="live", lag=lag,
                           policy_options={"routing": "dynamic", **options})
    return greedy.held_out.summary()["imbalance_mean"], cpsat.held_out.summary()["imbalance_mean"]


def measure(traffic: str, seeds: list[int], shapes: list[str], options: dict) -> list[dict]:
    rows = []
    real = traffic in ("esft", "olmoe")
    for shape, sigmas, lags in REAL_ROWS if real else ROWS:
        if shape not in shapes:
            continue
        if traffic == "requests" and shape == "144x2":
            sigmas = tuple(sorted(set(sigmas) | set(REQUEST_SKEWS)))
        gpus, slots = (int(n) for n in shape.split("x"))
        tokens_per_gpu = 2048 if shape == "32x9" else 128
        cluster = ClusterSpec(num_gpus=gpus, slots_per_gpu=slots, gpus_per_node=8 if gpus % 8 == 0 else gpus // 2)
        every = ESFT_EVERY if traffic == "esft" else EVERY
        for sigma in sigmas:
            stage = "prefill" if shape == "32x9" else "decode"
            traces = [trace(traffic, gpus, tokens_per_gpu, sigma, seed, stage) for seed in seeds]
            for lag in lags:
                pairs = [held_out(counts_TLE, cluster, lag, options, every) for counts_TLE in traces]
                differences = [cpsat - greedy for greedy, cpsat in pairs]
                rows.append({"traffic": traffic, "shape": f"{gpus} x {slots}", "sigma": sigma, "lag": lag,
                             "seeds": seeds, "greedy": float(np.mean([p[0] for p in pairs])),
                             "cpsat": float(np.mean([p[1] for p in pairs])), "differences": differences,
                             "difference_mean": float(np.mean(differences)), "difference_worst": max(differences)})
                print(f"{shape} {_popularity(sigma)} lag {lag}: greedy {rows[-1]['greedy']:.4f} cpsat "
                      f"{rows[-1]['cpsat']:.4f}, per seed {' '.join(f'{d:+.4f}' for d in differences)}",
                      file=sys.stderr, flush=True)
    return rows


def _popularity(sigma: float | None) -> str:
    return "real" if sigma is None else f"lognormal {sigma:g}"


def table(rows: list[dict]) -> str:
    return markdown_table(
        ("traffic", "shape", "popularity", "lag", "greedy + best split", "cpsat, live router",
         "cpsat - greedy, per seed", "mean", "worst", "holds"),
        ((row["traffic"], row["shape"], _popularity(row["sigma"]), row["lag"], f"{row['greedy']:.4f}",
          f"{row['cpsat']:.4f}", " ".join(f"{d:+.4f}" for d in row["differences"]), f"{row['difference_mean']:+.4f}",
          f"{row['difference_worst']:+.4f}",
          "yes" if row["difference_mean"] <= 0 and row["difference_worst"] <= WORST_ALLOWED else "no")
         for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--traffic", choices=TRAFFICS, default="synthetic",
                        help="held-out settings of traces.synthetic, the settings the two-slot rule was chosen on, "
                        "the independent regime generator, or request-level traffic at the held-out settings")
    parser.add_argument("--seeds", type=integer(0, SEED_MAX), nargs="+", default=list(SEEDS),
                        help="trace seeds (default: %(default)s)")
    parser.add_argument("--rows", nargs="+", default=None, choices=[row[0] for row in ROWS + REAL_ROWS],
                        help="shapes to run (default: all of the traffic's: 36x2 18x4 16x4 on real routing)")
    parser.add_argument("--work-limit", type=number(0, low_open=True, high=1e6), default=None,
                        help="cpsat: work budget per fit (default: CpSatConfig's)")
    args = parser.parse_args(argv)
    options = {} if args.work_limit is None else {"work_limit": args.work_limit}
    if args.traffic in ("esft", "olmoe") and not (ESFT.exists() and OLMOE.exists()):
        parser.error(f"--traffic {args.traffic} needs the ESFT and OLMoE data under {DATA}")
    shapes = args.rows or [row[0] for row in (REAL_ROWS if args.traffic in ("esft", "olmoe") else ROWS)]
    rows = measure(args.traffic, args.seeds, shapes, options)
    return finish(args.json, rows, table(rows))


if __name__ == "__main__":
    sys.exit(main())
