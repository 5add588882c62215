"""What each subcommand reads and writes, checked before any work: no output may destroy an input.

One rule for every command, refused with exit 2 before anything is computed or written: an input that does not
exist; an output path that names an input (the same file after symbolic links, or a hard link to it) or lies inside
an input folder (a TensorRT-LLM dump directory); two outputs that name one file; an output that exists but is not a
regular file; an output whose folder cannot be written; and an output that exists and holds another kind of file than
the one it would be replaced with (a placement only over a placement, and an SGLang map, `--sglang-out`, is one,
under every command; a PNG only over a PNG, a trace only over a trace, JSON only over JSON, a TensorRT-LLM
load-balancer YAML only over one: never README.md). To replace such a file on purpose, remove it first. The inputs
are the files the flags name (`--model` and `--request-trace` among them) and, for `eplb sim`, every file its config
names (the request trace, the routing trace): the config is read here for them.
"""

import argparse
import json
import os
from pathlib import Path

from eplb.cli.arg_types import holds_png
from traces import EplbError
from traces.atomic_file import resolve_target

# Flags naming files a subcommand reads, by argparse destination.
INPUT_FLAGS = {"trace": "--trace", "placement": "--placement", "current": "--current", "config": "--config",
               "model": "--model", "request_trace": "--request-trace"}
# Flags naming files a subcommand writes, by argparse destination.
OUTPUT_FLAGS = {"out": "--out", "sglang_out": "--sglang-out", "trtllm_out": "--trtllm-out", "plot": "--plot"}
# Files written into --out-dir, per subcommand: the name and whether another flag must be set for it.
OUT_DIR_FILES = {
    "plot": (("load_heatmap.png", None), ("gpu_loads.png", "placement")),
    "demo": (("trace.npz", None), ("placement.json", None), ("load_heatmap.png", None), ("gpu_loads.png", None),
             ("replay.png", None)),
    "sim": (("report.json", None), ("sim_timeline.png", None), ("fleet_timeline.png", None)),  # the one it runs
}


def inputs_of(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(flag, path) of every file the command reads: the flags' files, and for `eplb sim` the files its config
    names (labelled by their config keys).

    Raises:
        EplbError: a file a flag names does not exist, or is a directory where only a trace may be one (named by its
            flag, before any work).
    """
    found = [(flag, Path(getattr(args, dest))) for dest, flag in INPUT_FLAGS.items() if getattr(args, dest, None)]
    for flag, path in found:
        if not os.path.exists(path):
            raise EplbError(f"{flag} {path} not found; give the path of an existing file")
        if flag != "--trace" and os.path.isdir(path):  # only a trace may be a directory (a TensorRT-LLM dump)
            raise EplbError(f"{flag} {path} is a directory; give the path of a file")
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


KIND_NAMES = {"placement": "placement", "json": "JSON", "png": "PNG", "trace": "routing trace",
              "trtllm": "TensorRT-LLM load-balancer YAML"}


def output_kind(command: str, flag: str, path: Path) -> str:
    """The kind of file `flag` of `command` writes at `path`: placement, json, png, trace or trtllm."""
    if flag == "--trtllm-out":
        return "trtllm"
    if flag == "--sglang-out" or flag == "--out" and command == "place" or path.name == "placement.json":
        return "placement"
    if flag == "--out" and command == "synth" or path.suffix in (".npz", ".npy"):
        return "trace"
    return "png" if flag == "--plot" or path.suffix == ".png" else "json"


def holds_kind(kind: str, path: Path) -> bool:
    """Whether the existing file at `path` is of `kind` (what a command may replace)."""
    if kind == "png":
        return holds_png(path)
    if kind == "trtllm":
        return holds_trtllm_config(path)
    try:
        if kind == "trace":
            with open(path, "rb") as handle:
                head = handle.read(6)
            return head[:4] == b"PK\x03\x04" or head == b"\x93NUMPY"
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return kind == "json" or isinstance(data, dict) and "physical_to_logical_map" in data


def holds_trtllm_config(path: Path) -> bool:
    """Whether `path` holds a TensorRT-LLM load-balancer YAML: a mapping of `MoeLoadBalancerConfig`'s keys alone
    (num_slots, initial_global_assignments, layer_updates_per_iter), with num_slots or the assignments."""
    import yaml  # imported here: only --trtllm-out reads YAML

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False
    keys = {"num_slots", "initial_global_assignments", "layer_updates_per_iter"}
    return isinstance(data, dict) and data.keys() <= keys and bool(data.keys() & (keys - {"layer_updates_per_iter"}))


def check_paths(args: argparse.Namespace) -> None:
    """Raise `EplbError` unless every input exists and every output can be written without touching an input (or a
    file inside an input folder), another output, or a file of another kind."""
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
            folder = Path(os.path.realpath(in_path))
            if folder.is_dir() and folder in target.parents:
                raise EplbError(f"{flag} {path} is inside the input folder {in_flag} {in_path}: writing there would "
                                f"change the input; give {flag} a path outside it")
        _check_writable(flag, path, target)
        for other_flag, other_path, other_target in seen:
            if target == other_target:
                raise EplbError(
                    f"{other_flag} {other_path} and {flag} {path} name the same file; give each output its own path"
                )
        kind = output_kind(args.command, flag.split(" ")[0], path)
        if target.is_file() and target.stat().st_size and not holds_kind(kind, target):
            raise EplbError(f"{flag} {path} exists and is not a {KIND_NAMES[kind]} file; give a new path, or remove "
                            f"it first to replace it on purpose")
        seen.append((flag, path, target))


def _check_writable(flag: str, path: Path, target: Path) -> None:
    """Raise `EplbError` unless the folder `target` goes in (or the nearest existing folder above it, which the
    write creates the rest of) can be written."""
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise EplbError(f"cannot write {flag} {path}: folder {folder} is not writable; give a path you can write")


def _same_file(target: Path, input_path: Path) -> bool:
    if target == Path(os.path.realpath(input_path)):
        return True
    try:
        return target.exists() and input_path.exists() and os.path.samefile(target, input_path)
    except OSError:
        return False
