"""eplb sim: simulate the serving cluster around the balancer.

Requests (a Mooncake or Azure trace, or synthetic chat and agent sessions) pass a vision stage on single cheap
cards, prefill on 8-card nodes that reuse the persistent prefix cache and the sliding-window state, and decode on
EP units whose expert imbalance comes from replaying a routing trace through this project's placement policies and
router. It prints a readable report (or one JSON object with --json) and, with --out-dir, writes report.json and
sim_timeline.png there. The config (YAML or JSON) is `sim.config.SimConfig`; every field has a default, and
`sim/configs/` holds examples.

Examples:
  eplb sim
  eplb sim --config sim/configs/mooncake-conversation.yaml --json
"""

import argparse
import json
import math
import sys
from pathlib import Path

from eplb.commands import emit
from traces.atomic_file import write_text_atomically


def cmd_sim(args: argparse.Namespace) -> int:
    # Imported here: the other subcommands start without SimPy and the simulator's modules.
    from sim import load_sim_config, run_simulation
    from sim.report import text_report, write_plots

    config = load_sim_config(args.config)
    progress = None
    if not (args.json or args.quiet) and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=round(config.duration_s), unit="sim s", file=sys.stderr, leave=False)

        def progress(now: float, duration: float) -> None:
            bar.n = min(round(now), bar.total)
            bar.refresh()

    result, report = run_simulation(config, progress)
    clean = _finite(report)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out / "report.json", json.dumps(clean, indent=1, sort_keys=True) + "\n")
        write_plots(result, report, out)
    emit(args, clean, text_report(report))
    return 0


def _finite(value):
    """The report with NaN (no sample) as null, so that it is valid JSON."""
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
