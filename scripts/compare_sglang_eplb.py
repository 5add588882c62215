"""How often, and by how much, SGLang's in-tree DeepSeek EPLB differs from DeepSeek's `eplb.py` and `eplb place`.

SGLang 0.5.23 ships DeepSeek's algorithm as `sglang/srt/eplb/eplb_algorithms/deepseek.py` (what its `--eplb-algorithm
auto` runs: hierarchical when the expert groups divide over the nodes, else global). One change there alters maps:
its packing sums each pack's load in Python floats (float64) where `eplb.py` sums float32 tensors, so near-equal packs
can compare the other way. This script runs SGLang's file (loaded by path from the installed SGLang; it needs only
torch), this project's `rebalance_experts(policy="deepseek")` (DeepSeek's `eplb.py`, element for element) and
`fit_placement("deepseek", ..., num_groups=8)` (what `eplb place --policy deepseek --groups 8` fits: float64, stable
ties) on the same loads, one case per layer: `--layers` layers of a synthetic 256-expert trace at each of the
design's shapes (G x S: 64 x 5, 128 x 3, 144 x 2, 72 x 4, 64 x 4, 128 x 2, 32 x 9; 8 expert groups, 8 GPUs a node).
Per pair it prints the cases whose maps differ, the share of their slots that differ, and on those cases the
imbalance under equal split on the case's own load (max over GPUs / mean): the mean and largest difference, SGLang's
minus the other's.

Usage: PYTHONPATH=DIR python scripts/compare_sglang_eplb.py [--layers 58] [--seed 0] [--json out.json]
(SGLang without its dependencies: pip install --no-deps --target DIR sglang==0.5.23)
"""

import importlib.util
import json
import sys
from pathlib import Path

from eplb.cli.arg_types import json_output
from eplb.cli.main import OneLineParser

SHAPES = ((64, 5), (128, 3), (144, 2), (72, 4), (64, 4), (128, 2), (32, 9))
EXPERTS, GROUPS, GPUS_PER_NODE = 256, 8, 8


def sglang_deepseek():
    """SGLang's `eplb_algorithms/deepseek.py` as a module, or None when SGLang is not installed."""
    found = importlib.util.find_spec("sglang")
    if found is None:
        return None
    path = Path(found.submodule_search_locations[0], "srt", "eplb", "eplb_algorithms", "deepseek.py")
    spec = importlib.util.spec_from_file_location("sglang_eplb_deepseek", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def imbalance_L(phy2log_LP, load_LE, gpus: int, slots: int):
    """[L] max over GPUs / mean of each layer's load under an equal split of each expert over its replicas."""
    from placement import ClusterSpec, Placement, static_gpu_loads

    placement = Placement.equal_split(phy2log_LP, ClusterSpec(num_gpus=gpus, slots_per_gpu=slots), EXPERTS)
    gpu_loads_LG = static_gpu_loads(load_LE[None], placement)[0]
    return gpu_loads_LG.max(axis=1) / gpu_loads_LG.mean(axis=1)


def compare(sglang, layers: int, steps: int, seed: int) -> dict:
    """Per other policy: cases, cases whose maps differ, and the imbalance differences on those."""
    import numpy as np
    import torch

    from eplb import rebalance_experts
    from placement import ClusterSpec, fit_placement
    from traces.synthetic import SyntheticConfig, generate_trace

    differing = {"eplb.py": [], "eplb place": []}  # per differing case: (imbalance difference, share of slots)
    cases = 0
    for gpus, slots in SHAPES:
        counts = generate_trace(SyntheticConfig(num_steps=steps, num_layers=layers, num_experts=EXPERTS, top_k=8,
                                                tokens_per_step=gpus * 128, seed=seed + gpus * 10 + slots)).counts_TLE
        load_LE = counts.sum(axis=0)
        num_slots, nodes = gpus * slots, gpus // GPUS_PER_NODE
        weight = torch.from_numpy(load_LE)
        maps = {
            "sglang": sglang.rebalance_experts(weight, num_slots, GROUPS, nodes, gpus,
                                               enable_hierarchical=GROUPS % nodes == 0)[0].numpy(),
            "eplb.py": rebalance_experts(weight, num_slots, GROUPS, nodes, gpus)[0].numpy(),
            "eplb place": fit_placement("deepseek", counts, ClusterSpec(num_gpus=gpus, slots_per_gpu=slots),
                                        num_groups=GROUPS).phy2log_LP,
        }
        score = {name: imbalance_L(phy2log, load_LE, gpus, slots) for name, phy2log in maps.items()}
        cases += layers
        for other in differing:
            unequal_LP = maps["sglang"] != maps[other]
            for layer in np.flatnonzero(unequal_LP.any(axis=1)):
                differing[other].append((float(score["sglang"][layer] - score[other][layer]),
                                         float(unequal_LP[layer].mean())))
    return {other: {"cases": cases, "differing": len(rows),
                    "slots_differing_mean": float(np.mean([share for _, share in rows])) if rows else 0.0,
                    "imbalance_delta_mean": float(np.mean([delta for delta, _ in rows])) if rows else 0.0,
                    "imbalance_delta_max_abs": float(np.max([abs(delta) for delta, _ in rows])) if rows else 0.0}
            for other, rows in differing.items()}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=58, help="layers (cases) per shape, 1 to 256 (default 58)")
    parser.add_argument("--steps", type=int, default=1000,
                        help="steps summed into each load, 1 to 10,000 (default 1000: SGLang's recorder buffer)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed, 0 to 2^31 (default 0)")
    parser.add_argument("--json", type=json_output(), default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if not (1 <= args.layers <= 256 and 1 <= args.steps <= 10_000 and 0 <= args.seed <= 2**31):
        parser.error("--layers must be in [1, 256], --steps in [1, 10000] and --seed in [0, 2^31]")
    sglang = sglang_deepseek()
    if sglang is None:
        parser.error("SGLang is not installed: pip install --no-deps --target DIR sglang==0.5.23 and run with "
                     "PYTHONPATH=DIR")
    result = compare(sglang, args.layers, args.steps, args.seed)
    for other, row in result.items():
        print(f"SGLang vs {other}: {row['differing']} of {row['cases']} maps differ, in "
              f"{row['slots_differing_mean']:.1%} of their slots on average; imbalance on those, SGLang minus {other}: "
              f"mean {row['imbalance_delta_mean']:+.2e}, largest {row['imbalance_delta_max_abs']:.2e}")
    if args.json:
        from traces.atomic_file import write_text_atomically

        write_text_atomically(args.json, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
