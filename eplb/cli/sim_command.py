"""eplb sim: simulate the serving cluster around the balancer.

Requests (a Mooncake or Azure trace, or synthetic chat and agent sessions) pass a vision stage on single cheap
cards, prefill on 8-card nodes that reuse the persistent prefix cache and the sliding-window state, and decode on
EP units whose expert imbalance comes from replaying a routing trace through this project's placement policies and
router. It prints a readable report (or one JSON object with --json) and, with --out-dir, writes report.json and
sim_timeline.png there (throughput, cache hits and imbalance over time, latency CDFs). The config (YAML or JSON)
is `sim.config.SimConfig`; every field has a default, and `sim/configs/` holds examples. A config with a `fleet`
section runs days of a whole fleet instead (token rates per minute through prefill instances and decode units
costed by the same model, an autoscaler, faults, prices; `sim.fleet.run`), for `--days` days if given; it writes
fleet_timeline.png.

Every number in the config has a finite range, and a run's work (the engine's events, the decode replay's routing
and fits, the fleet's steps and card failures, the memory) is estimated before it starts: a value out of range or a
run over a budget is refused with one line naming the config key to change. The files the config names (request
and routing traces) are inputs: no file written to --out-dir may replace one, through a link either.

`eplb sim validate` runs no traffic either: it prints every published anchor (sim/anchors/anchors.yaml)
beside the simulator's figure for it, with its role (fitted to it, predicted, or an identity), the error and the
command behind the figure; `--refit` recomputes the declared calibration (sim/calibration.yaml) from the fitted
anchors, and `--write` rewrites that file with the result.

`--capacity` runs no traffic: it raises the load on one decode unit and one prefill instance until the latency
targets bind (`capacity.tpot_slo_ms`, `capacity.ttft_slo_s`, or --tpot-slo-ms and --ttft-slo-s) and reports per-card
tokens/s there, with the batch, the step and the expert imbalance the placement code gives at that load
(`sim.capacity`); `--curve` adds the decode latency-throughput curve (the capacity at each of several TPOT targets)
and `--plot PNG` draws it.

Examples:
  eplb sim
  eplb sim --config sim/configs/cloudmatrix384.yaml --capacity --tpot-slo-ms 50 --json
  eplb sim --config sim/configs/cloudmatrix384.yaml --capacity --curve --plot curve.png
  eplb sim validate --json
  eplb sim --config sim/configs/mooncake-conversation.yaml --json
  eplb sim --config sim/configs/deepseek-feb2025-day.yaml --json
  eplb sim --config sim/configs/seed-fleet-day.yaml --days 7
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

from eplb.cli.commands import emit
from placement.yardsticks import yardsticks_line
from eplb.cli.traffic_cases import traffic_cases
from traces.atomic_file import write_text_atomically


def cmd_sim(args: argparse.Namespace) -> int:
    # Imported here: the other subcommands start without SimPy and the simulator's modules.
    from pydantic import ValidationError

    from sim import SimConfigError, load_sim_config, run_simulation
    from sim.fleet.config import FleetConfig
    from sim.engine.report import text_report, write_plots

    if args.action == "validate":
        return _validate(args)
    if args.refit or args.write or args.anchors:
        raise SimConfigError("--refit, --write and --anchors belong to `eplb sim validate`; add validate")
    config = load_sim_config(args.config)
    if args.capacity or args.tpot_slo_ms is not None or args.ttft_slo_s is not None or args.curve is not None \
            or args.plot:
        if args.out_dir:
            raise SimConfigError("--out-dir takes a run's report and plots; --capacity runs none (it writes --json "
                                 "and --plot): drop --out-dir")
        return _capacity(args, config)
    if args.out_dir:
        _check_out_dir(Path(args.out_dir))
    if args.days is not None:
        if config.fleet is None:
            raise SimConfigError(f"--days needs a config with a fleet section (for example "
                                 f"sim/configs/deepseek-feb2025-day.yaml); {args.config or 'the default'} has none")
        try:
            fleet = FleetConfig.model_validate({**config.fleet.model_dump(), "days": args.days})
        except ValidationError as exc:
            raise SimConfigError(f"--days {args.days}: {exc.errors()[0]['msg']}") from exc
        config = config.model_copy(update={"fleet": fleet})
    if config.fleet is not None:
        return _fleet(args, config)
    progress = _progress_bar(args, round(config.duration_s), "sim s")
    result, report = run_simulation(config, progress)
    clean = _finite(report)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out / "report.json", json.dumps(clean, indent=1, sort_keys=True) + "\n")
        write_plots(result, report, out)
    emit(args, clean, text_report(report))
    return 0


def _check_out_dir(out: Path) -> None:
    """Refuse, before any work, an --out-dir that cannot be written (its nearest existing ancestor, when it does not
    exist yet); a file in its place is refused earlier, with the other output paths (`output_paths.check_paths`)."""
    from sim import SimConfigError

    existing = next(parent for parent in (out.absolute(), *out.absolute().parents) if parent.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SimConfigError(f"--out-dir {out}: {existing} cannot be written; give a folder you can write")


def _fleet(args: argparse.Namespace, config) -> int:
    """The fleet run of a config with a fleet section."""
    from sim.fleet.report import fleet_text
    from sim.fleet.run import run_fleet
    from sim.fleet.plots import write_fleet_plots

    progress = _progress_bar(args, round(config.fleet.days * 24), "sim h", per=3600.0)
    report = run_fleet(config, progress)
    clean = _finite(report)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out / "report.json", json.dumps(clean, indent=1, sort_keys=True) + "\n")
        write_fleet_plots(report, out)
    emit(args, clean, fleet_text(report))
    return 0


def _capacity(args: argparse.Namespace, config) -> int:
    """`--capacity`: both stages' capacity at the latency targets (`sim.capacity`)."""
    from sim import SimConfigError
    from sim.capacity import CURVE_TPOT_MS, capacity_report, capacity_text, curve_text, decode_curve, write_curve_plot
    from sim.engine.decode_balance import routing_shape
    from sim.work_budget import check_replay_work

    if not args.capacity:
        raise SimConfigError("--tpot-slo-ms, --ttft-slo-s, --curve and --plot belong to --capacity; add --capacity")
    if args.days is not None:
        raise SimConfigError("--days runs a fleet; --capacity runs none: give one of them")
    targets = {key: value for key, value in (("tpot_slo_ms", args.tpot_slo_ms), ("ttft_slo_s", args.ttft_slo_s))
               if value is not None}
    config = config.model_copy(update={"capacity": config.capacity.model_copy(update=targets)})
    check_replay_work(config, routing_shape(config, None))
    report = capacity_report(config)
    text = capacity_text(report)
    from placement.imbalance_metrics import metrics_line
    from sim.imbalance_readings import read_decode_unit

    reading = read_decode_unit(config, report["decode"]["micro_batch_tokens_per_card"])
    report["decode"].update({"metrics": reading.metrics, "yardsticks": reading.yardsticks})
    text += f"\ndecode imbalance read every way at that load: {metrics_line(reading.metrics)}\n" \
            f"decode yardsticks at that load: {yardsticks_line(reading.yardsticks)}"
    case_list = traffic_cases(args)
    if case_list:
        from eplb.cli.progress import Progress
        from sim.capacity_range import capacity_ranges, ranges_text

        progress = Progress("scenarios", enabled=not (args.json or args.quiet))
        try:
            report["ranges"] = capacity_ranges(config, report, case_list, progress.callback())
        finally:
            progress.close()
        text += "\n" + ranges_text(report["ranges"], config.balance.routing_trace is not None)
    if args.curve is not None or args.plot:
        rows = decode_curve(config, tuple(args.curve or CURVE_TPOT_MS))
        report["decode_curve"] = rows
        text += "\n" + curve_text(rows, config.hardware.decode)
        if args.plot:
            write_curve_plot(rows, args.plot, f"{Path(args.config).name if args.config else 'default config'}: "
                                              f"{config.cluster.decode_cards} {config.hardware.decode} cards, "
                                              f"{config.capacity.decode_context_tokens:,}-token context")
    emit(args, _finite(report), text)
    return 0


def _validate(args: argparse.Namespace) -> int:
    """`eplb sim validate`: every anchor beside the simulator's figure; with --refit, the calibration refitted."""
    from sim import SimConfigError

    given = [flag for flag, value in (("--config", args.config), ("--days", args.days), ("--capacity", args.capacity),
                                      ("--tpot-slo-ms", args.tpot_slo_ms), ("--ttft-slo-s", args.ttft_slo_s),
                                      ("--out-dir", args.out_dir), ("--curve", args.curve), ("--plot", args.plot))
             if value not in (None, False)]
    if given:
        raise SimConfigError(f"eplb sim validate runs the anchors' own operating points; drop {' '.join(given)}")
    from sim.validation import ANCHORS_PATH, refit, refitted_constants
    from sim.validation_report import validation_rows, validation_text

    anchors = Path(args.anchors) if args.anchors else ANCHORS_PATH

    if args.write and not args.refit:
        raise SimConfigError("--write rewrites the calibration with refitted values; add --refit")
    if args.refit:
        from sim.calibration import CALIBRATION_PATH, write_calibration

        refits = refit(anchors)
        report = {"refit": [{"name": item.name, "anchor": item.anchor, "current": item.current,
                             "refitted": item.refitted, "change": item.change} for item in refits],
                  "written": None}
        if args.write:
            write_calibration(refitted_constants(refits))
            report["written"] = str(CALIBRATION_PATH)
        text = "\n".join(f"{item.name:30} {item.current:10.5g} -> {item.refitted:10.5g} ({item.change:+.2%}) from "
                         f"{item.anchor}" for item in refits)
        emit(args, report, text + (f"\nwrote {report['written']}" if report["written"] else ""))
        return 0
    rows = validation_rows(anchors_path=anchors)
    emit(args, {"anchors": _finite(rows)}, validation_text(rows))
    return 0


def _progress_bar(args: argparse.Namespace, total: int, unit: str, per: float = 1.0):
    """A progress callback drawing a bar on stderr (None when quiet, with --json, or off a terminal)."""
    if args.json or args.quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    bar = tqdm(total=total, unit=unit, file=sys.stderr, leave=False)

    def progress(now: float, duration: float) -> None:
        bar.n = min(round(now / per), bar.total)
        bar.refresh()

    return progress


def _finite(value):
    """The report with NaN (no sample) as null, so that it is valid JSON."""
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
