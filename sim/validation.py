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

from sim.calibration import FittedConstant, fitted, load_calibration
from sim.config import SimConfig, load_sim_config
from sim.hardware import CALIBRATED, PROFILES, Efficiency, efficiency_override
from sim.speculative import SpeculativeConfig, expected_step

ANCHORS_DIR = Path(__file__).with_name("anchors")
ANCHORS_PATH = ANCHORS_DIR / "anchors.yaml"
ROLES = ("fitted", "predicted", "identity", "open")
MEASURES = ("decode", "prefill", "efficiency", "all_to_all_latency", "mtp_speedup", "mtp_tokens_per_step",
            "fleet_nodes", "store_hit_share", "imbalance", "decode_imbalance")
IMBALANCE_MEASURES = ("imbalance", "decode_imbalance")
REFIT_TOLERANCE = 0.002  # relative: a refit within this of the file's value leaves the file as it is


class Anchor(BaseModel):
    """One published figure and what the simulator computes for it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    role: str = Field(pattern="^(fitted|predicted|identity|open)$", description="fitted (a constant of the "
                      "calibration is fitted to it), predicted (never fitted), identity (follows from fitted figures "
                      "by arithmetic), open (its source names no metric: every definition shown, counted neither "
                      "way)")
    published: float = Field(gt=0)
    unit: str = Field(min_length=1)
    source: str = Field(min_length=1)
    conditions: str = Field(min_length=1)
    measure: dict = Field(description="kind (one of MEASURES) and its parameters.")
    config: str | None = Field(None, description="Operating-point config, relative to the anchors file (the Feb-2025 "
                                                 "day is the shipped sim/configs/deepseek-feb2025-day.yaml).")
    metric: str | None = Field(None, description="An imbalance's metric as its source measured it: a name of "
                               "placement.imbalance_metrics (card_step, ...), or 'unstated' where the source names "
                               "none (role open).")


class AnchorError(ValueError):
    """The anchors file is missing, unreadable or inconsistent."""


def load_anchors(path: Path = ANCHORS_PATH) -> list[Anchor]:
    """The anchors in `path`, checked: unique names, known measure kinds, configs that exist.

    Raises:
        AnchorError: the file cannot be read, or an anchor is malformed (the message names it).
    """
    expected = "a YAML mapping whose `anchors` is a list of anchors (name, role, published, unit, source, " \
               "conditions, measure, config), as sim/anchors/anchors.yaml"
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AnchorError(f"anchors file {path}: cannot read it ({' '.join(str(exc).split())[:200]}); expected "
                          f"{expected}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("anchors"), list):
        if data is None:
            found = "an empty file"
        elif not isinstance(data, dict):
            found = f"a {type(data).__name__}"
        else:
            found = "no `anchors` key" if "anchors" not in data else f"`anchors` a {type(data['anchors']).__name__}"
        raise AnchorError(f"anchors file {path}: found {found}; expected {expected}")
    try:
        anchors = [Anchor.model_validate(entry) for entry in data["anchors"]]
    except ValidationError as exc:
        raise AnchorError(f"anchors file {path}: {' '.join(str(exc).split())[:300]}") from exc
    names = [anchor.name for anchor in anchors]
    for anchor in anchors:
        if names.count(anchor.name) > 1:
            raise AnchorError(f"anchors file {path}: anchor {anchor.name!r} appears {names.count(anchor.name)} times")
        if anchor.measure.get("kind") not in MEASURES:
            raise AnchorError(f"anchor {anchor.name!r}: measure kind {anchor.measure.get('kind')!r} is not one of "
                              f"{MEASURES}")
        if anchor.measure["kind"] in ("decode", "prefill", "fleet_nodes", "store_hit_share", "decode_imbalance") and \
                (anchor.config is None or not (Path(path).parent / anchor.config).is_file()):
            raise AnchorError(f"anchor {anchor.name!r}: its config {anchor.config!r} is missing beside {path}")
        if anchor.measure["kind"] in IMBALANCE_MEASURES and anchor.metric is None:
            raise AnchorError(f"anchor {anchor.name!r}: an imbalance anchor names its source's metric (metric: "
                              f"card_step, node_step, ..., or unstated with role open)")
        if (anchor.role == "open") != (anchor.metric == "unstated"):
            raise AnchorError(f"anchor {anchor.name!r}: role open is for a source that names no metric (metric: "
                              f"unstated), and only for it")
        if anchor.role == "open" and anchor.measure["kind"] != "decode_imbalance":
            raise AnchorError(f"anchor {anchor.name!r}: an open anchor reads a decode unit's imbalance (measure kind "
                              f"decode_imbalance)")
        band = anchor.measure.get("band")
        if band is not None and not _valid_band(band):
            raise AnchorError(f"anchor {anchor.name!r}: band must be {{field: SECTION.FIELD of the simulator config, "
                              f"values: [{{trace: NAME, value: NUMBER}}, ...]}}; found {band!r:.200}")
    return anchors


def _valid_band(band) -> bool:
    if not isinstance(band, dict) or not isinstance(band.get("field"), str) or band["field"].count(".") != 1:
        return False
    section, field = band["field"].split(".")
    model = SimConfig.model_fields.get(section)
    values = band.get("values")
    return (model is not None and field in getattr(model.annotation, "model_fields", {}) and isinstance(values, list)
            and bool(values) and all(isinstance(v, dict) and isinstance(v.get("trace"), str)
                                     and isinstance(v.get("value"), (int, float)) for v in values))


def anchor_config(anchor: Anchor, anchors_path: Path = ANCHORS_PATH, speculative: dict | None = None) -> SimConfig:
    """The operating point of `anchor` as a SimConfig; `speculative` (SpeculativeConfig fields) replaces the
    calibrated ones where the operating point decodes speculatively."""
    config = load_sim_config(Path(anchors_path).parent / anchor.config)
    if speculative and config.speculative.enabled:
        config = config.model_copy(update={"speculative": config.speculative.model_copy(update=speculative)})
    return config


def simulate(anchor: Anchor, anchors_path: Path = ANCHORS_PATH, efficiency: Efficiency | None = None,
             speculative: dict | None = None, utilisation: float | None = None,
             return_share: float | None = None, skew: float | None = None, config: SimConfig | None = None) -> float:
    """The simulator's figure for `anchor`, in the anchor's unit; `efficiency`, `speculative` (SpeculativeConfig
    fields), `utilisation` (of a day-average anchor), `return_share` (of the prefix store) and `skew` (of the
    request-level traffic's popularity) replace the calibrated ones (the refit searches with them); `config`
    replaces the anchor's operating point (a band's values)."""
    from sim.capacity import decode_capacity, prefill_capacity

    kind, measure = anchor.measure["kind"], anchor.measure
    if kind == "imbalance":
        from sim.traffic_anchor import request_imbalance

        return request_imbalance(measure, fitted("traffic.skew") if skew is None else skew)
    if kind == "efficiency":
        profile_name, field = measure["spec"].split(".")
        factor = getattr(efficiency or CALIBRATED, measure["factor"])
        return factor * getattr(PROFILES[profile_name], field) * measure.get("scale", 1.0)
    if kind == "all_to_all_latency":
        return all_to_all_latency_us(measure, efficiency or CALIBRATED)
    if kind in ("mtp_speedup", "mtp_tokens_per_step"):
        spec = SpeculativeConfig(enabled=True, policy="all", draft_tokens=measure.get("draft_tokens", 1),
                                 **(speculative or {}))
        tokens = expected_step(spec, 0).tokens_per_step
        return tokens / (1.0 + spec.draft_cost_share) if kind == "mtp_speedup" else tokens
    config = config or anchor_config(anchor, anchors_path, speculative)
    if kind == "store_hit_share":
        return _store_hit_share(config, return_share)
    imbalance = measure.get("imbalance")  # a balance the source states (perfect), else the placement code's
    with efficiency_override(efficiency or CALIBRATED):
        if kind == "decode_imbalance":
            return decode_capacity(config)["imbalance"]
        if kind == "decode":
            rate = decode_capacity(config, imbalance)["tokens_per_s_per_card"]
        elif kind == "prefill":
            rate = prefill_capacity(config, imbalance)["tokens_per_s_per_card"]
        else:
            from sim.fleet.run import run_fleet

            return run_fleet(config)["policies"][measure["policy"]]["nodes_mean"]
    if measure.get("day_average"):  # a day's average over deployed nodes: the capacity times the day's utilisation
        rate *= utilisation if utilisation is not None else fitted("utilisation.day")
    return rate * (config.cluster.cards_per_node if measure.get("per") == "node" else 1)


def all_to_all_latency_us(measure: dict, efficiency: Efficiency) -> float:
    """The mean modelled latency, microseconds per call, of a dispatch and combine benchmark's entries (`measure`:
    hardware, tokens_per_card, cards, dispatch_us, combine_us) on the default model's shape (DeepSeek-V3's hidden size,
    top-8, FP8 dispatch, BF16 combine): `sim.cost_model.all_to_all_latency_seconds` at each group size."""
    from sim.cost_model import all_to_all_latency_seconds
    from sim.model_profile import ModelProfile

    model, hardware = ModelProfile(), PROFILES[measure["hardware"]]
    calls = [all_to_all_latency_seconds(model, hardware, cards, measure["tokens_per_card"], efficiency)
             for cards in measure["cards"]]
    return 1e6 * sum(dispatch + combine for dispatch, combine in calls) / (2 * len(calls))


def _store_hit_share(config: SimConfig, return_share: float | None) -> float:
    """The steady-state hit share of the config's prefix store (`sim.fleet.prefix_store`)."""
    from sim.fleet.prefix_store import store_of, store_state

    if config.fleet is None or config.fleet.store is None:
        raise AnchorError("a store_hit_share anchor needs a config with fleet.store")
    return store_state(config.fleet.store, *store_of(config), return_share=return_share).hit_share


def command(anchor: Anchor) -> str:
    """The command line that prints the simulator's figure for `anchor` (and the key to read in its JSON)."""
    kind = anchor.measure["kind"]
    config = shlex.quote(_repository_path(anchor.config)) if anchor.config else None
    if kind in ("decode", "prefill"):
        per = " x cluster.cards_per_node" if anchor.measure.get("per") == "node" else ""
        return f"eplb sim --config {config} --capacity --json  # {kind}.tokens_per_s_per_card{per}"
    if kind == "fleet_nodes":
        return f"eplb sim --config {config} --json  # policies.{anchor.measure['policy']}.nodes_mean"
    if kind == "store_hit_share":
        return f"eplb sim --config {config} --json  # prefix_store.hit_share"
    if kind == "decode_imbalance":
        return f"eplb sim validate --json  # from sim.imbalance_readings at the batch of: eplb sim --config {config} " \
               f"--capacity --json"
    if kind == "imbalance":
        return "python scripts/bench_request_traffic.py anchors  # sim.traffic_anchor.request_imbalance"
    return "eplb sim validate --json  # from sim/calibration.yaml"


def _repository_path(config: str) -> str:
    """An anchor's config path as written from the repository root (where the commands run)."""
    root = ANCHORS_DIR.resolve().parents[1]
    return str((ANCHORS_DIR / config).resolve().relative_to(root))


def band_values(anchor: Anchor, anchors_path: Path = ANCHORS_PATH) -> list[float]:
    """The anchor's figure at each value of its `band` (a config field the source does not state, set to each
    measured real trace's value in turn: `measure.band.field`, `measure.band.values[*].value`)."""
    band = anchor.measure["band"]
    section, field = band["field"].split(".")
    figures = []
    for entry in band["values"]:
        config = anchor_config(anchor, anchors_path)
        updated = getattr(config, section).model_copy(update={field: entry["value"]})
        figures.append(simulate(anchor, anchors_path, config=config.model_copy(update={section: updated})))
    return figures


def anchor_error(anchor: Anchor, value: float) -> float:
    """The simulated figure's relative error: on the excess over 1.0 for an imbalance (a max / mean of 1.10 against
    a published 1.05 is twice the published excess, not 5% off), on the figure itself for anything else."""
    if anchor.measure["kind"] in IMBALANCE_MEASURES and anchor.published > 1.0:
        return (value - 1.0) / (anchor.published - 1.0) - 1.0
    return value / anchor.published - 1.0


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
    anchor): first the popularity skew of request-level traffic, by bisection on TensorRT-LLM's no-balancing
    imbalance (the others read it through the placement code's imbalance as the file holds it, so a moved skew takes
    a second refit to settle them), then memory and network as ratios of a kernel's published figure to its line
    rate, the MTP constants by bisection on `sim.speculative`, the two compute factors together on DeepSeek's
    saturated, balanced profile (`_refit_compute_factors`), and last the day's utilisation as DeepSeek's published day
    average over the decode capacity at the post's operating point (the expert imbalance at that batch from the
    placement code)."""
    constants = load_calibration()
    anchors = {anchor.name: anchor for anchor in load_anchors(anchors_path)}
    refitted: dict[str, float] = {}
    # the compute factors after the ratios, the day's utilisation last: each fit runs capacity mode with every
    # constant before it as refitted
    def order(item: tuple[str, FittedConstant]) -> int:
        if item[0] == "traffic.skew":
            return -1  # first: every imbalance from the placement code reads it
        if item[0] == "efficiency.all_to_all_floor_us":
            return 0.5  # after the network factor: the floor is what the bandwidth leaves of the latencies
        return 2 if item[0] == "utilisation.day" else int(item[0] in COMPUTE_FACTORS)

    for name, constant in sorted(constants.items(), key=order):
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
    if name == "efficiency.all_to_all_floor_us":  # the floor adds to every call: the mean's gap is the floor
        return anchor.published - simulate(anchor, anchors_path, _efficiency(done, all_to_all_floor_us=0.0))
    if name == "speculative.draft_cost_share":
        tokens = expected_step(SpeculativeConfig(enabled=True, policy="all", draft_tokens=1), 0).tokens_per_step
        return tokens / anchor.published - 1.0
    if name == "speculative.acceptance_decay":
        return brentq(lambda decay: simulate(anchor, anchors_path, speculative={"acceptance_decay": decay})
                      - anchor.published, 0.3, 1.0, xtol=1e-5)
    if name in COMPUTE_FACTORS:
        if name not in done:
            done.update(_refit_compute_factors(anchors_path, done))
        return done[name]
    if name == "store.return_share":
        room = 1.0 - anchor_config(anchor, anchors_path).fleet.store.session_share
        return brentq(lambda share: simulate(anchor, anchors_path, return_share=share) - anchor.published, 0.0,
                      room, xtol=1e-7)
    if name == "traffic.skew":
        return brentq(lambda skew: simulate(anchor, anchors_path, skew=skew) - anchor.published, 0.2, 3.0, xtol=1e-3)
    if name == "utilisation.day":
        if not anchor.measure.get("day_average"):
            raise AnchorError(f"utilisation.day is fitted to a day-average anchor; {anchor.name!r} is not one")
        speculative = {"draft_cost_share": done["speculative.draft_cost_share"]} \
            if "speculative.draft_cost_share" in done else None
        return anchor.published / simulate(anchor, anchors_path, _efficiency(done), speculative, utilisation=1.0)
    raise AnchorError(f"no refit is defined for {name}")


COMPUTE_FACTORS = ("efficiency.compute", "efficiency.layer_overhead_us")
SEARCH_RANGES = {"efficiency.compute": (0.02, 1.0), "efficiency.layer_overhead_us": (0.0, 2000.0)}


def _efficiency(done: dict[str, float], **factors: float) -> Efficiency:
    """The calibrated factors with the ones refitted so far (`done`) and then `factors` in their place."""
    values = {factor: done.get(f"efficiency.{factor}", getattr(CALIBRATED, factor))
              for factor in Efficiency.model_fields}
    return Efficiency(**{**values, **factors})


def _refit_compute_factors(anchors_path: Path, done: dict[str, float]) -> dict[str, float]:
    """efficiency.compute and efficiency.layer_overhead_us solved together on their two saturated anchors (each
    rate moves with both): alternate one-dimensional roots until neither moves, every other factor as refitted."""
    constants = load_calibration()
    anchors = {anchor.name: anchor for anchor in load_anchors(anchors_path)}
    fitted_to = {name: anchors[constants[name].anchor] for name in COMPUTE_FACTORS}
    factors = {name: getattr(CALIBRATED, name.split(".")[1]) for name in COMPUTE_FACTORS}
    for _ in range(20):
        moved = 0.0
        for name, anchor in fitted_to.items():
            def gap(value: float) -> float:
                trial = {key.split(".")[1]: factor for key, factor in {**factors, name: value}.items()}
                return math.log(simulate(anchor, anchors_path, _efficiency(done, **trial)) / anchor.published)

            solved = brentq(gap, *SEARCH_RANGES[name], xtol=1e-6)
            moved = max(moved, abs(solved - factors[name]) / max(abs(factors[name]), 1e-3))
            factors[name] = solved
        if moved < 1e-5:
            break
    return factors


def refitted_constants(refits: list[Refit]) -> dict[str, FittedConstant]:
    """The calibration with every refitted value that moved by more than REFIT_TOLERANCE, rounded to 4 digits."""
    constants = load_calibration()
    for item in refits:
        if abs(item.change) > REFIT_TOLERANCE:
            constants[item.name] = constants[item.name].model_copy(update={"value": float(f"{item.refitted:.4g}")})
    return constants
