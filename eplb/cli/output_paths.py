"""What each subcommand reads and writes, checked before any work: no output may destroy an input.

An output path that names an input (the same file after symbolic links, or a hard link to it), two outputs that
name one file, and an output that exists but is not a regular file are refused with exit 2 before anything is
computed or written. The inputs are the files the flags name and, for `eplb sim`, every file its config names
(the request trace, the routing trace): the config is read here for them.
"""

import argparse
import os
from pathlib import Path

from traces import EplbError
from traces.atomic_file import resolve_target

# Flags naming files a subcommand reads, by argparse destination.
INPUT_FLAGS = {"trace": "--trace", "placement": "--placement", "current": "--current", "config": "--config"}
# Flags naming files a subcommand writes, by argparse destination.
OUTPUT_FLAGS = {"out": "--out", "sglang_out": "--sglang-out", "plot": "--plot"}
# Files written into --out-dir, per subcommand: the name and whether another flag must be set for it.
OUT_DIR_FILES = {
    "plot": (("load_heatmap.png", None), ("gpu_loads.png", "placement")),
    "demo": (("trace.npz", None), ("placement.json", None), ("load_heatmap.png", None), ("gpu_loads.png", None),
             ("replay.png", None)),
    "sim": (("report.json", None), ("sim_timeline.png", None), ("fleet_timeline.png", None)),  # the one it runs
}


def inputs_of(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(flag, path) of every file the command reads: the flags' files, and for `eplb sim` the files its config
    names (labelled by their config keys)."""
    found = [(flag, Path(getattr(args, dest))) for dest, flag in INPUT_FLAGS.items() if getattr(args, dest, None)]
    if args.command == "sim" and getattr(args, "config", None):
        found += _named_by_sim_config(args.config)
    return found


def _named_by_sim_config(path: str) -> list[tuple[str, Path]]:
    """(label, path) of the files a simulator config names: its request trace, its routing trace.

    Raises:
        SimConfigError: the config cannot be read or is invalid (the message names the key).
    """
    from sim import load_sim_config  # imported here: the other subcommands start without the simulator

    return [(f"{key} (in --config)", file) for key, file in load_sim_config(path).input_files()]


def outputs_of(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(flag, path) of every file the command writes."""
    found = [(flag, Path(getattr(args, dest))) for dest, flag in OUTPUT_FLAGS.items() if getattr(args, dest, None)]
    for name, needs in OUT_DIR_FILES.get(args.command, ()) if getattr(args, "out_dir", None) else ():
        if needs is None or getattr(args, needs, None):
            found.append((f"--out-dir ({name})", Path(args.out_dir) / name))
    return found


def check_paths(args: argparse.Namespace) -> None:
    """Raise `EplbError` unless every output can be written without touching an input or another output."""
    inputs = inputs_of(args)
    seen: list[tuple[str, Path, Path]] = []
    for flag, path in outputs_of(args):
        target = resolve_target(path)
        for in_flag, in_path in inputs:
            if _same_file(target, in_path):
                raise EplbError(
                    f"{flag} {path} is the input {in_flag} {in_path}: writing it would destroy the input; "
                    f"give {flag} another path"
                )
        for other_flag, other_path, other_target in seen:
            if target == other_target:
                raise EplbError(
                    f"{other_flag} {other_path} and {flag} {path} name the same file; give each output its own path"
                )
        seen.append((flag, path, target))


def _same_file(target: Path, input_path: Path) -> bool:
    if target == Path(os.path.realpath(input_path)):
        return True
    try:
        return target.exists() and input_path.exists() and os.path.samefile(target, input_path)
    except OSError:
        return False
