"""The one line `eplb` prints for bad input: which exceptions are the user's input and which are bugs, and the
library's parameter names turned into the flags that set them (library errors name parameters; only the command line
speaks of flags)."""

import os
import re
from pathlib import Path

from pydantic import ValidationError

from placement import PlacementFormatError
from traces import EplbError
from traces.trtllm_statistics import TrtllmDumpError

# Library errors name parameters; the command line speaks of the flags a user types.
FLAG_OF_PARAMETER = {
    "num_gpus": "--gpus", "slots_per_gpu": "--slots-per-gpu", "gpus_per_node": "--gpus-per-node",
    "tokens_per_step": "--tokens-per-step", "num_experts": "--num-experts", "tasks": "--task",
    "time_limit_s": "--time-limit", "work_limit": "--work-limit", "nodes_per_group": "--nodes-per-group",
    "num_groups": "--groups", "groups": "--groups",
    "migration_cost": "--migration-cost", "drift_ratio": "--refit-on-drift", "every": "--every",
    "window": "--window", "lag": "--lag", "workers": "--workers",
}
# `eplb synth` names the trace's shape by other flags than the readers do.
SYNTH_FLAG_OF_PARAMETER = {
    "num_steps": "--steps", "num_layers": "--layers", "num_experts": "--experts", "top_k": "--top-k",
    "tokens_per_step": "--tokens-per-step", "zipf_exponent": "--zipf-exponent", "skew": "--skew",
    "tokens_per_request": "--tokens-per-request", "concentration": "--concentration",
    "prompt_tokens": "--prompt-tokens", "output_tokens": "--output-tokens", "request_trace": "--request-trace",
}


PROJECT_ROOTS = tuple(str(Path(__file__).resolve().parents[2] / package) + os.sep
                      for package in ("eplb", "placement", "traces", "collectives", "sim"))


def message(exc: Exception, command: str) -> str:
    """The one line that tells the user what was wrong with the input behind `exc`."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    message = one_line(exc)
    # The simulator's errors name its config keys, and a placement file's or a TensorRT-LLM dump's errors their keys,
    # which no flag sets.
    if command != "sim" and not isinstance(exc, (PlacementFormatError, TrtllmDumpError)):
        message = as_flags(message, command)
    return message


def is_input_error(exc: Exception) -> bool:
    """Whether `exc` reports bad input: one of the project's typed errors, a pydantic validation of a file or
    config, an OSError, or a ValueError the project's own checks raised. A ValueError raised inside a library the
    project calls is a bug to report with its traceback, not a message for the user."""
    if isinstance(exc, (EplbError, ValidationError, OSError)):
        return True
    if not isinstance(exc, ValueError):
        return False
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is None or frame.tb_frame.f_code.co_filename.startswith(PROJECT_ROOTS)


def as_flags(message: str, command: str) -> str:
    """`message` with each parameter name (`num_gpus`, `window=3`) replaced by the flag that sets it."""
    table = SYNTH_FLAG_OF_PARAMETER if command in ("synth", "demo") else FLAG_OF_PARAMETER
    # A name with an underscore is a parameter wherever it stands, except inside brackets or quotes (a shape such as
    # `[num_experts]`, a file's key such as `'num_experts'`); a plain word (`window`) only right before `=`, or
    # before `:` opening the message (pydantic's "field: reason").
    pattern = r"(?<![\w-])(%s)(?==)|^(%s)(?=:)|(?<![\w\-\['\"])(%s)(?![\w\]'\"])" % (
        "|".join(re.escape(k) for k in table if "_" not in k),
        "|".join(re.escape(k) for k in table if "_" not in k),
        "|".join(re.escape(k) for k in table if "_" in k),
    )
    return re.sub(pattern, lambda m: table[m.group(1) or m.group(2) or m.group(3)], message)


def one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        # A validator's own ValueError reads better without pydantic's "Value error, " prefix.
        msg = str(first.get("ctx", {}).get("error", first["msg"])) if first["type"] == "value_error" else first["msg"]
        return f"{where}: {msg}" if where else msg
    return " ".join(str(exc).split())
