"""The simulator's declared calibration: every constant it fits, read from `sim/calibration.yaml`.

Each entry names its value, the anchor it is fitted to (a published figure kept outside the simulator, in
`sim/anchors/anchors.yaml`) and the command that refits it (`eplb sim validate --refit`). Every other
number the simulator uses is a hardware spec (`sim.hardware.PROFILES`, sources in docs/simulator.md), a published model
shape or draft acceptance, or comes from this project's own placement code (the expert imbalance at a stage's
batch); so the only knobs a prediction could be tuned with are the ones listed in that file.
"""

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from traces.atomic_file import write_text_atomically

CALIBRATION_PATH = Path(__file__).with_name("calibration.yaml")

HEADER = """\
# The simulator's fitted constants: each one's value, the anchor it is fitted to and the command that refits it.
# The anchors (published figures, their sources and the operating points they were measured at) live outside the
# simulator, in sim/anchors/anchors.yaml: `eplb sim validate` compares every anchor with the simulator,
# and `eplb sim validate --refit --write` recomputes these values from the fitted anchors and rewrites this file.
# Nothing else in sim/ is fitted: the rest are hardware specs (sim/hardware.py; sources in docs/simulator.md), the
# model's published shape and MTP acceptance, and the expert imbalance this project's placement code gives.
"""


class FittedConstant(BaseModel):
    """One fitted constant: its value and where it comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    value: float = Field(description="The fitted value.")
    anchor: str = Field(min_length=1, description="Name of the anchor in sim/anchors/anchors.yaml it is "
                                                  "fitted to.")
    method: str = Field(min_length=1, description="How the value follows from the anchor, in one sentence.")
    refit: str = Field(min_length=1, description="The command that refits it.")


class CalibrationError(ValueError):
    """The calibration file is missing, unreadable or incomplete."""


REQUIRED = ("efficiency.compute", "efficiency.attention", "efficiency.memory", "efficiency.network",
            "efficiency.all_to_all_floor_us", "efficiency.layer_overhead_us",
            "speculative.draft_cost_share", "speculative.acceptance_decay", "utilisation.day", "store.return_share",
            "traffic.skew")


def load_calibration(path: Path = CALIBRATION_PATH) -> dict[str, FittedConstant]:
    """{name: FittedConstant} of the calibration file; every name in REQUIRED must be there.

    Raises:
        CalibrationError: the file cannot be read or parsed, an entry is malformed, or a required one is missing.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CalibrationError(f"calibration file {path}: cannot read it: {' '.join(str(exc).split())[:200]}") \
            from exc
    if not isinstance(data, dict):
        raise CalibrationError(f"calibration file {path}: expected a mapping of constant names to entries")
    try:
        constants = {str(name): FittedConstant.model_validate(entry) for name, entry in data.items()}
    except ValidationError as exc:
        raise CalibrationError(f"calibration file {path}: {' '.join(str(exc).split())[:300]}") from exc
    missing = [name for name in REQUIRED if name not in constants]
    if missing:
        raise CalibrationError(f"calibration file {path} lacks {missing}; restore them from git or refit with "
                               f"`eplb sim validate --refit --write`")
    return constants


def calibration_text(constants: dict[str, FittedConstant]) -> str:
    """The file's text for `constants` (the header, then one entry per constant, in REQUIRED order first)."""
    order = [name for name in REQUIRED if name in constants] + sorted(set(constants) - set(REQUIRED))
    body = yaml.safe_dump({name: constants[name].model_dump() for name in order}, sort_keys=False, width=118)
    return HEADER + body


def write_calibration(constants: dict[str, FittedConstant], path: Path = CALIBRATION_PATH) -> None:
    """Rewrite the calibration file with `constants`, atomically (the old file stays whole if this fails)."""
    write_text_atomically(Path(path), calibration_text(constants))


CALIBRATION = load_calibration()


def fitted(name: str) -> float:
    """The value of fitted constant `name` (one of REQUIRED)."""
    return CALIBRATION[name].value
