"""`eplb sim validate`: every published anchor beside the simulator's figure, and the refit of the fitted constants.

The anchors (`sim/anchors/anchors.yaml`) hold each published figure with its source, the conditions it
was measured under (an operating-point config beside it) and its role: `fitted` (a constant of the simulator's
declared calibration, `sim/calibration.yaml`, is fitted to it), `predicted` (never fitted) or `identity` (follows
from fitted figures by arithmetic). The simulator's figure for an anchor comes from the code every user runs:
capacity mode (`sim.capacity`) at the operating point, the fleet run (`sim.fleet.run`), or the fitted constants
themselves.
"""

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from scipy.optimize import brentq

from sim.calibration import FittedConstant, load_calibration
from sim.config import SimConfig, load_sim_config
from sim.hardware import CALIBRATED, PROFILES, Efficiency, efficiency_override
from sim.speculative import SpeculativeConfig, expected_step

ANCHORS_DIR = Path(__file__).with_name("anchors")
ANCHORS_PATH = ANCHORS_DIR / "anchors.yaml"
ROLES = ("fitted", "predicted", "identity")
MEASURES = ("decode", "prefill", "efficiency", "mtp_speedup", "mtp_tokens_per_step", "fleet_nodes")
REFIT_TOLERANCE = 0.002  # relative: a refit within this of the file's value leaves the file as it is


class Anchor(BaseModel):
    """One published figure and what the simulator computes for it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    role: str = Field(pattern="^(fitted|predicted|identity)$")
    published: float = Field(gt=0)
    unit: str = Field(min_length=1)
    source: str = Field(min_length=1)
    conditions: str = Field(min_length=1)
    measure: dict = Field(description="kind (one of MEASURES) and its parameters.")
    config: str | None = Field(None, description="Operating-point config, relative to the anchors file (the Feb-2025 "
                                                 "day is the shipped sim/configs/deepseek-feb2025-day.yaml).")


class AnchorError(ValueError):
    """The anchors file is missing, unreadable or inconsistent."""


def load_anchors(path: Path = ANCHORS_PATH) -> list[Anchor]:
    """The anchors in `path`, checked: unique names, known measure kinds, configs that exist.

    Raises:
        AnchorError: the file cannot be read, or an anchor is malformed (the message names it).
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
        anchors = [Anchor.model_validate(entry) for entry in data["anchors"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValidationError) as exc:
        raise AnchorError(f"anchors file {path}: {' '.join(str(exc).split())[:300]}") from exc
    names = [anchor.name for anchor in anchors]
    for anchor in anchors:
        if names.count(anchor.name) > 1:
            raise AnchorError(f"anchors file {path}: anchor {anchor.name!r} appears {names.count(anchor.name)} times")
        if anchor.measure.get("kind") not in MEASURES:
            raise AnchorError(f"anchor {anchor.name!r}: measure kind {anchor.measure.get('kind')!r} is not one of "
                              f"{MEASURES}")
        if anchor.measure["kind"] in ("decode", "prefill", "fleet_nodes") and \
                (anchor.config is None or not (Path(path).parent / anchor.config).is_file()):
            raise AnchorError(f"anchor {anchor.name!r}: its config {anchor.config!r} is missing beside {path}")
    return anchors


def anchor_config(anchor: Anchor, anchors_path: Path = ANCHORS_PATH, speculative: dict | None = None) -> SimConfig:
    """The operating point of `anchor` as a SimConfig; `speculative` (SpeculativeConfig fields) replaces the
    calibrated ones where the operating point decodes speculatively."""
    config = load_sim_config(Path(anchors_path).parent / anchor.config)
    if speculative and config.speculative.enabled:
        config = config.model_copy(update={"speculative": config.speculative.model_copy(update=speculative)})
    return config


def simulate(anchor: Anchor, anchors_path: Path = ANCHORS_PATH, efficiency: Efficiency | None = None,
             speculative: dict | None = None) -> float:
    """The simulator's figure for `anchor`, in the anchor's unit; `efficiency` and `speculative` (SpeculativeConfig
    fields) replace the calibrated ones (the refit searches with them)."""
    from sim.capacity import decode_capacity, prefill_capacity

    kind, measure = anchor.measure["kind"], anchor.measure
    if kind == "efficiency":
        profile_name, field = measure["spec"].split(".")
        factor = getattr(efficiency or CALIBRATED, measure["factor"])
        return factor * getattr(PROFILES[profile_name], field) * measure.get("scale", 1.0)
    if kind in ("mtp_speedup", "mtp_tokens_per_step"):
        spec = SpeculativeConfig(enabled=True, policy="all", draft_tokens=measure.get("draft_tokens", 1),
                                 **(speculative or {}))
        tokens = expected_step(spec, 0).tokens_per_step
        return tokens / (1.0 + spec.draft_cost_share) if kind == "mtp_speedup" else tokens
    config = anchor_config(anchor, anchors_path, speculative)
    with efficiency_override(efficiency or CALIBRATED):
        if kind == "decode":
            rate = decode_capacity(config)["tokens_per_s_per_card"]
        elif kind == "prefill":
            rate = prefill_capacity(config)["tokens_per_s_per_card"]
        else:
            from sim.fleet.run import run_fleet

            return run_fleet(config)["policies"][measure["policy"]]["nodes_mean"]
    return rate * (config.cluster.cards_per_node if measure.get("per") == "node" else 1)


def command(anchor: Anchor) -> str:
    """The command line that prints the simulator's figure for `anchor` (and the key to read in its JSON)."""
    kind = anchor.measure["kind"]
    config = shlex.quote(_repository_path(anchor.config)) if anchor.config else None
    if kind in ("decode", "prefill"):
        per = " x cluster.cards_per_node" if anchor.measure.get("per") == "node" else ""
        return f"eplb sim --config {config} --capacity --json  # {kind}.tokens_per_s_per_card{per}"
    if kind == "fleet_nodes":
        return f"eplb sim --config {config} --json  # policies.{anchor.measure['policy']}.nodes_mean"
    return "eplb sim validate --json  # from sim/calibration.yaml"


def _repository_path(config: str) -> str:
    """An anchor's config path as written from the repository root (where the commands run)."""
    root = ANCHORS_DIR.resolve().parents[1]
    return str((ANCHORS_DIR / config).resolve().relative_to(root))


def validation_rows(anchors: list[Anchor] | None = None, anchors_path: Path = ANCHORS_PATH) -> list[dict]:
    """One row per anchor: name, role, source, conditions, unit, published, simulated, error (simulated / published
    - 1) and the command behind the simulated figure."""
    anchors = load_anchors(anchors_path) if anchors is None else anchors
    rows = []
    for anchor in anchors:
        value = simulate(anchor, anchors_path)
        rows.append({"name": anchor.name, "role": anchor.role, "source": anchor.source,
                     "conditions": anchor.conditions, "unit": anchor.unit, "published": anchor.published,
                     "simulated": value, "error": value / anchor.published - 1.0, "command": command(anchor)})
    return rows


def validation_text(rows: list[dict]) -> str:
    """The rows as a table, fitted rows first."""
    lines = [f"{'anchor':34} {'role':9} {'published':>11} {'simulated':>11} {'error':>7}  unit"]
    for role in ROLES:
        for row in (r for r in rows if r["role"] == role):
            lines.append(f"{row['name']:34} {row['role']:9} {_figure(row['published']):>11} "
                         f"{_figure(row['simulated']):>11} {row['error']:+7.1%}  {row['unit']}")
    predicted = [abs(r["error"]) for r in rows if r["role"] == "predicted"]
    if predicted:
        lines.append(f"predicted rows within 15%: {sum(e <= 0.15 for e in predicted)} of {len(predicted)}")
    return "\n".join(lines)


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


# ---- the refit -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refit:
    """A fitted constant's value in the file and as refitted now from its anchor."""

    name: str
    anchor: str
    current: float
    refitted: float

    @property
    def change(self) -> float:
        return self.refitted / self.current - 1.0


def refit(anchors_path: Path = ANCHORS_PATH) -> list[Refit]:
    """Refit every constant of the declared calibration from its fitted anchor (none of them reads a predicted
    anchor): the ratios directly, the MTP constants by bisection on `sim.speculative`, and the compute factor by
    root-finding on the decode capacity at DeepSeek's operating point, the expert imbalance of that batch from the
    placement code (balance-free)."""
    constants = load_calibration()
    anchors = {anchor.name: anchor for anchor in load_anchors(anchors_path)}
    refitted: dict[str, float] = {}
    # the compute factor last: its fit runs the decode anchor with every other constant as refitted
    for name, constant in sorted(constants.items(), key=lambda item: item[0] == "efficiency.compute"):
        anchor = anchors.get(constant.anchor)
        if anchor is None or anchor.role != "fitted":
            raise AnchorError(f"sim/calibration.yaml: {name} is fitted to {constant.anchor!r}, which is not a "
                              f"fitted anchor in {anchors_path}")
        refitted[name] = _refit_one(name, anchor, anchors_path, refitted)
    return [Refit(name, constants[name].anchor, constants[name].value, refitted[name]) for name in constants]


def _refit_one(name: str, anchor: Anchor, anchors_path: Path, done: dict[str, float]) -> float:
    kind = anchor.measure["kind"]
    if kind == "efficiency":
        profile_name, field = anchor.measure["spec"].split(".")
        return anchor.published / (getattr(PROFILES[profile_name], field) * anchor.measure.get("scale", 1.0))
    if name == "speculative.draft_cost_share":
        tokens = expected_step(SpeculativeConfig(enabled=True, policy="all", draft_tokens=1), 0).tokens_per_step
        return tokens / anchor.published - 1.0
    if name == "speculative.acceptance_decay":
        return brentq(lambda decay: simulate(anchor, anchors_path, speculative={"acceptance_decay": decay})
                      - anchor.published, 0.3, 1.0, xtol=1e-5)
    if name == "efficiency.compute":
        memory = done.get("efficiency.memory", CALIBRATED.memory)
        network = done.get("efficiency.network", CALIBRATED.network)
        speculative = {"draft_cost_share": done["speculative.draft_cost_share"]} \
            if "speculative.draft_cost_share" in done else None

        return _refit_compute(anchor, anchors_path, memory, network, speculative)
    raise AnchorError(f"no refit is defined for {name}")


def _refit_compute(anchor: Anchor, anchors_path: Path, memory: float, network: float,
                   speculative: dict | None) -> float:
    """The compute factor at which the decode anchor's capacity is the published one: root-finding at a fixed
    expert imbalance, then the imbalance the placement code gives at the batch found, until it settles."""
    from sim.capacity import decode_capacity

    if anchor.measure["kind"] != "decode":
        raise AnchorError(f"efficiency.compute is refitted on a decode anchor; {anchor.name!r} is "
                          f"{anchor.measure['kind']}")
    config = anchor_config(anchor, anchors_path, speculative)
    per = config.cluster.cards_per_node if anchor.measure.get("per") == "node" else 1
    imbalance, compute = 1.0, CALIBRATED.compute
    for _ in range(6):
        def gap(factor: float) -> float:
            with efficiency_override(Efficiency(compute=factor, memory=memory, network=network)):
                rate = decode_capacity(config, imbalance)["tokens_per_s_per_card"] * per
            return math.log(rate / anchor.published)

        compute = brentq(gap, 0.05, 1.0, xtol=1e-5)
        with efficiency_override(Efficiency(compute=compute, memory=memory, network=network)):
            settled = decode_capacity(config)["imbalance"]
        if abs(settled - imbalance) < 1e-4:
            break
        imbalance = settled
    return compute


def refitted_constants(refits: list[Refit]) -> dict[str, FittedConstant]:
    """The calibration with every refitted value that moved by more than REFIT_TOLERANCE, rounded to 4 digits."""
    constants = load_calibration()
    for item in refits:
        if abs(item.change) > REFIT_TOLERANCE:
            constants[item.name] = constants[item.name].model_copy(update={"value": float(f"{item.refitted:.4g}")})
    return constants
