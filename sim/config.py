"""The simulator's configuration: one pydantic model, read from YAML or JSON, every field with a default.

The default (no file) is the embedded run: one minute of synthetic chat and agent traffic through a vision card,
prefill nodes and one decode EP unit of 128 cards, a DeepSeek-V3-like model on H800s.

Every number has a finite range (NaN and infinity are refused): wide enough for the shapes in service (up to
`MAX_GPUS` cards per decode unit, a day of arrivals, a million-token prompt), narrow enough that no single value
can make a run hang or exhaust memory. What a whole run would cost is estimated separately, before it starts
(`sim.work_budget`). A bad value is one `SimConfigError` naming the dotted key, what was found and the range.
"""

import json
import re
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin

import annotated_types
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from placement.cluster import MAX_GPUS, MAX_SLOTS, MAX_SLOTS_PER_GPU
from sim.fleet.config import FleetConfig
from sim.hardware import PROFILES
from sim.model_profile import ModelProfile
from sim.speculative import SpeculativeConfig
from traces.errors import EplbError
from traces.request_traffic import ESFT_CONCENTRATION

MAX_DURATION_S = 86_400.0  # a day of arrivals request by request; longer spans are the fleet run's (`fleet`)
MAX_MEAN_TOKENS = 1_000_000.0  # mean prompt, turn or reply of a class
TRAFFIC_CLASSES = ("chat", "agent")


class SimConfigError(EplbError):
    """A simulator configuration that cannot be read or is invalid; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


def _both_classes(values: dict[str, float]) -> dict[str, float]:
    """`values` once it holds every traffic class: a class left out would fail only when its first session comes."""
    missing = [name for name in TRAFFIC_CLASSES if name not in values]
    if missing:
        raise ValueError(f"needs a value for each traffic class, chat and agent; {' and '.join(missing)} is missing")
    return values


def _per_class(low: float, high: float, *, low_open: bool = False):
    """A {chat: value, agent: value} mapping, both classes required, each value within [low, high] (or (low,
    high] when `low_open`)."""
    bound = Field(gt=low, le=high) if low_open else Field(ge=low, le=high)
    return Annotated[dict[Literal["chat", "agent"], Annotated[float, bound]], AfterValidator(_both_classes)]


class SyntheticWorkload(_Strict):
    """Generated traffic: sessions of several turns (each turn resends the history), chat and agent classes."""

    sessions_per_s: float = Field(60.0, gt=0, le=100_000, description="New conversations per second at the daily "
                                  "mean (at most 100,000; the run's total is bounded by `sim.work_budget`).")
    agent_share: float = Field(0.5, ge=0, le=1, description="Share of sessions that are agent traffic.")
    turns_mean: _per_class(1, 1000) = Field({"chat": 3.0, "agent": 8.0},
                                            description="Mean turns per session, per class (geometric), 1 to 1,000.")
    think_time_s: _per_class(0, MAX_DURATION_S) = Field(
        {"chat": 20.0, "agent": 3.0}, description="Mean seconds between a reply and the next turn, per class.")
    first_input_tokens: _per_class(1, MAX_MEAN_TOKENS) = Field(
        {"chat": 1500.0, "agent": 6000.0}, description="Mean prompt of a session's first turn, per class.")
    turn_input_tokens: _per_class(0, MAX_MEAN_TOKENS) = Field(
        {"chat": 200.0, "agent": 800.0}, description="Mean new user/tool tokens of each later turn.")
    output_tokens: _per_class(1, MAX_MEAN_TOKENS) = Field(
        {"chat": 400.0, "agent": 250.0}, description="Mean tokens generated per turn, per class.")
    images_per_request: float = Field(0.1, ge=0, le=100, description="Mean images attached to a request "
                                                                     "(Poisson).")
    daily_curve: bool = Field(False, description="Modulate arrivals by a daily load curve (peak in the afternoon).")
    daily_peak_to_mean: float = Field(1.5, ge=1, le=10, description="Peak over mean of the daily curve.")


class WorkloadConfig(_Strict):
    """Where requests come from."""

    trace: str | None = Field(None, description="Request trace: Mooncake .jsonl or Azure .csv, relative to the "
                                                "config file (None: synthetic).")
    trace_class: Literal["chat", "agent"] = Field("chat", description="Traffic class of a trace's requests.")
    time_scale: float = Field(1.0, ge=0.001, le=1000, description="Divide the trace's arrival times by this (2: "
                                                                  "twice the rate).")
    synthetic: SyntheticWorkload = Field(SyntheticWorkload(), description="The generator, when no trace is given.")


class HardwareConfig(_Strict):
    """Which card each stage runs on (names of `sim.hardware.PROFILES`)."""

    prefill: str = Field("H800", description="Card of the prefill nodes.")
    decode: str = Field("H800", description="Card of the decode EP units.")
    vision: str = Field("L20", description="Cheap single card of the vision encoders.")

    @model_validator(mode="after")
    def _known(self) -> "HardwareConfig":
        for stage in ("prefill", "decode", "vision"):
            name = getattr(self, stage)
            if name not in PROFILES:
                raise ValueError(f"hardware.{stage}={name!r} is not a known profile; choose one of "
                                 f"{', '.join(sorted(PROFILES))}")
        return self


class ClusterConfig(_Strict):
    """How many machines each stage has and how it batches."""

    vision_cards: int = Field(4, ge=1, le=4096, description="Single-card vision encoder instances.")
    prefill_nodes: int = Field(16, ge=1, le=1024, description="Prefill instances, one node of "
                                                                "cards_per_node cards each.")
    cards_per_node: int = Field(8, ge=1, le=384, description="Cards per prefill node (and per node of the fleet).")
    max_prefill_batch_tokens: int = Field(16384, ge=1, le=1 << 24, description="New tokens one prefill batch may "
                                                                                "hold, per node of its instance.")
    prefill_instance_nodes: int = Field(1, ge=1, le=128, description="Nodes per prefill instance: 1, a node alone "
                                        "with its experts taken as balanced; more (4: DeepSeek's EP32), experts "
                                        "spread over the instance's cards with the placement code's imbalance and "
                                        "capacity.prefill_redundant_experts. Must divide prefill_nodes.")
    decode_units: int = Field(1, ge=1, le=256, description="Decode EP units.")
    decode_cards: int = Field(128, ge=1, le=MAX_GPUS, description="Cards per decode EP unit (at most the "
                                                                  f"placement's {MAX_GPUS:,}).")
    max_decode_batch_per_card: int = Field(128, ge=1, le=4096, description="Sequences per decode card at most "
                                                                           "(besides the HBM bound).")


    @model_validator(mode="after")
    def _whole_instances(self) -> "ClusterConfig":
        if self.prefill_nodes % self.prefill_instance_nodes:
            raise ValueError(f"prefill_nodes={self.prefill_nodes} is not a whole number of instances of "
                             f"prefill_instance_nodes={self.prefill_instance_nodes}; use a multiple")
        return self


class CacheConfig(_Strict):
    """The KV cache tiers: a persistent SSD tier keyed by prefix blocks, and the sliding-window state (the
    defaults' sources: docs/simulator.md, 'KV cache tiers')."""

    disk_capacity_tb: float = Field(1000.0, gt=0, le=1e6, description="Persistent tier capacity (TB).")
    retention_days: _per_class(0, 3650, low_open=True) = Field(
        {"agent": 3.0, "chat": 7.0}, description="Days a prefix block is kept after its last use, per class (at "
                                                 "most 3,650, which keeps every block of any run).")
    disk_read_gb_s: float = Field(40.0, gt=0, le=1e5, description="Read bandwidth from the storage cluster per "
                                  "prefill node (GB/s; default: 3FS's KV-cache client peak, about 40 GiB/s per "
                                  "node, rounded down).")
    block_tokens: int = Field(512, ge=1, le=65536, description="Tokens per prefix block (Mooncake's hash_ids: "
                                                               "512).")
    window_design: Literal["memory", "disk", "recompute"] = Field(
        "memory", description="Sliding-window state: kept in server memory (recompute the tail when missing), "
                              "persisted on disk with the prefix, or never kept (recompute every cached token).")
    window_lifetime_s: float = Field(180.0, gt=0, le=3650 * 86400.0, description="Lifetime of the in-memory "
                                                                                 "sliding-window state (seconds).")
    window_recompute_tokens: int = Field(128, ge=0, le=1_000_000, description="Tokens recomputed when the window "
                                                                             "state is missing.")


class BalanceConfig(_Strict):
    """Expert load of the decode units: a routing trace replayed through the project's placement policies."""

    routing_trace: str | None = Field(None, description="Decode routing trace, a file `eplb replay` reads, with "
                                      "model.num_routed_experts experts per layer (None: synthetic at the model's "
                                      "shape).")
    policy: Literal["cpsat", "deepseek", "none"] = Field("cpsat", description="Placement policy; none = one "
                                                                              "replica per expert, no balancing.")
    slots_per_card: int | None = Field(None, ge=1, le=MAX_SLOTS_PER_GPU, description="Expert slots per decode "
                                       "card (None: E / cards + 1, or E / cards under policy none).")
    layers: int = Field(4, ge=1, le=256, description="Layers of the synthetic routing trace (imbalance is their "
                                                     "mean).")
    trace_layers: int | None = Field(None, ge=1, le=512, description="With routing_trace: evenly spaced layers of "
                                     "the trace replayed, its first and last included (None: all of them).")
    steps: int = Field(300, ge=10, le=100_000, description="Steps of the synthetic routing trace (replayed "
                                                           "cyclically).")
    routing: Literal["live", "static"] = Field("live", description="How a step splits a replicated expert's tokens: "
                                             "the project's live router, or a fixed equal split (the static "
                                             "dispatch of SGLang, vLLM and DeepSeek's reference).")
    traffic: Literal["requests", "tokens"] = Field("requests", description="Synthetic routing: requests that keep "
                                                  "their own experts (traces.request_traffic: prefill batches of "
                                                  "whole prompts, decode under continuous batching), or tokens "
                                                  "drawn independently (traces.synthetic).")
    skew: float | None = Field(None, ge=0, le=20, description="Sigma of the lognormal expert popularity (None: the "
                               "fitted traffic.skew under requests, traces.synthetic's 0.8 under tokens).")
    concentration: float = Field(ESFT_CONCENTRATION, gt=0, le=1e9, description="Requests only: Dirichlet "
                                 "concentration of a request's expert preferences (default: measured on ESFT).")
    output_tokens: float = Field(512.0, ge=1, le=1e6, description="Requests only: mean output length of a decoding "
                                 "request (lognormal, sigma 1): how long a request keeps its experts in the batch.")
    burst_rate: float = Field(2.0, ge=0, le=1000, description="Bursts per layer per 1,000 steps of the synthetic "
                              "routing (an expert's weight x4 for about 50 steps); fitted to nothing: a scenario "
                              "axis (sim.scenarios), 0 for none.")
    node_limits: bool = Field(False, description="Keep every expert group's replicas on one node of "
                              "cluster.cards_per_node cards (DeepSeek's hierarchical rule, which vLLM and SGLang "
                              "apply where the groups are a multiple of the nodes): needs model.expert_groups a "
                              "multiple of the decode unit's nodes.")
    refit_every: int = Field(50, ge=1, le=100_000, description="Steps between refits, as a live rebalancer would.")
    window: int = Field(50, ge=1, le=100_000, description="Steps each fit sees.")
    work_limit: float = Field(1.0, gt=0, le=3600, description="cpsat's deterministic budget per fit (all layers), "
                              "work units of about a second of one core: the same config gives the same run.")
    reading_steps: int = Field(1000, ge=10, le=100_000, description="Scored steps behind the decode unit's "
                               "imbalance read every way (`eplb sim --capacity`, `validate`, `advise`): the "
                               "1,000-step window needs 1,000; fewer read faster and leave that window out.")


class CapacityConfig(_Strict):
    """The operating point of `eplb sim --capacity`: what each sequence and prompt holds, the latency targets, and
    the prefill instance (the decode unit is `cluster`'s)."""

    decode_context_tokens: int = Field(4096, ge=1, le=1_000_000, description="Tokens in each decoding sequence's "
                                       "KV cache (the mean context a published decode figure states).")
    prompt_tokens: int = Field(4096, ge=1, le=1_000_000, description="Mean tokens of a prompt in a prefill batch.")
    cached_share: float = Field(0.0, ge=0, lt=1, description="Share of each prompt read from the KV cache tiers "
                                "instead of computed.")
    prompt_length_spread: float = Field(1.0, ge=1, le=100, description="E[P^2] / E[P]^2 of the prompt lengths P "
                                        "in a batch: 1, every prompt prompt_tokens long; above, log-normal lengths of "
                                        "mean prompt_tokens with that spread (a served day's mix: attention grows "
                                        "with the square of a prompt's length).")
    prefill_instance_nodes: int = Field(4, ge=1, le=128, description="Nodes of one prefill instance (DeepSeek's "
                                        "EP32: 4 nodes of 8 cards).")
    prefill_redundant_experts: int = Field(32, ge=0, le=4096, description="Expert replicas of a prefill instance "
                                           "beyond one per expert (none under balance.policy none).")
    prefill_node_limits: bool = Field(False, description="Keep every expert group's replicas on one node of the "
                                      "prefill instance (as balance.node_limits for decode): a token crosses fewer "
                                      "nodes. Needs model.expert_groups a multiple of prefill_instance_nodes.")
    tpot_slo_ms: float = Field(50.0, gt=0, le=10_000, description="Time per output token a decode batch must meet, "
                                                                  "ms (the step, over tokens per step).")
    decode_batch_per_card: float | None = Field(None, gt=0, le=4096, description="Sequences per decode card at a "
                                                "fixed batch (a figure published at a stated batch); None: the "
                                                "largest batch that meets tpot_slo_ms.")
    ttft_slo_s: float | None = Field(None, gt=0, le=3600, description="Seconds a prefill batch may take (None: "
                                     "batches as large as cluster.max_prefill_batch_tokens allows).")


class SimConfig(_Strict):
    """One simulation run."""

    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of every random stream (arrivals, lengths, images, "
                                                          "traces).")
    duration_s: float = Field(60.0, gt=0, le=MAX_DURATION_S, description="Simulated seconds of arrivals (the run "
                              "drains after); at most a day (86,400 s): longer spans are the fleet run's.")
    workload: WorkloadConfig = Field(WorkloadConfig(), description="Requests.")
    model: ModelProfile = Field(ModelProfile(sliding_window_share=0.5), description="The served model (default: "
                                "DeepSeek-V3's shape with half its layers sliding-window).")
    hardware: HardwareConfig = Field(HardwareConfig(), description="Cards per stage.")
    cluster: ClusterConfig = Field(ClusterConfig(), description="Machines per stage.")
    cache: CacheConfig = Field(CacheConfig(), description="KV cache tiers.")
    balance: BalanceConfig = Field(BalanceConfig(), description="Decode expert balance.")
    speculative: SpeculativeConfig = Field(SpeculativeConfig(), description="Speculative decoding on the decode "
                                                                            "units (off by default).")
    capacity: CapacityConfig = Field(CapacityConfig(), description="The operating point of `eplb sim "
                                     "--capacity`.")
    fleet: FleetConfig | None = Field(None, description="Run days of a whole fleet on token rates from units "
                                      "costed in detail (sim.fleet.run) instead of request by request.")

    @model_validator(mode="after")
    def _decode_slots_fit(self) -> "SimConfig":
        """The decode unit's expert slots, checked here in the config's own terms: the placement code would
        refuse them later, in its own."""
        cards, experts = self.cluster.decode_cards, self.model.num_routed_experts
        slots, given = self.decode_slots_per_card, self.balance.slots_per_card is not None
        how = f"balance.slots_per_card={slots}" if given else (f"{slots} slots per card (model.num_routed_experts="
                                                                f"{experts} over cluster.decode_cards={cards})")
        if slots > MAX_SLOTS_PER_GPU:
            least = -(-experts // (MAX_SLOTS_PER_GPU - 1))
            raise ValueError(f"{how} exceeds the placement's {MAX_SLOTS_PER_GPU} slots per card; use "
                             f"cluster.decode_cards >= {least}")
        if cards * slots > MAX_SLOTS:
            raise ValueError(f"cluster.decode_cards={cards} x {how} = {cards * slots} expert slots exceeds the "
                             f"placement's {MAX_SLOTS:,}; lower balance.slots_per_card or cluster.decode_cards")
        if cards * slots < experts:
            raise ValueError(f"cluster.decode_cards={cards} x balance.slots_per_card={slots} = {cards * slots} "
                             f"slots cannot hold model.num_routed_experts={experts} experts; use "
                             f"balance.slots_per_card >= {-(-experts // cards)} (or leave it unset)")
        return self

    @model_validator(mode="after")
    def _node_limits_fit(self) -> "SimConfig":
        """Node limits only where every node can hold whole groups: refused here, in the config's terms."""
        cards_per_node = self.cluster.cards_per_node
        decode = [("balance.node_limits", "cluster.decode_cards", self.cluster.decode_cards)] \
            if self.balance.node_limits else []
        prefill = [("capacity.prefill_node_limits", f"{section}.prefill_instance_nodes", nodes * cards_per_node)
                   for section, nodes in (("capacity", self.capacity.prefill_instance_nodes),
                                          ("cluster", self.cluster.prefill_instance_nodes))
                   if self.capacity.prefill_node_limits]  # the instance capacity mode sizes, and the engine's
        asked = decode + prefill
        for field, size, cards in asked:
            problem = node_limit_problem(self.model, cards, cards_per_node)
            if problem:
                raise ValueError(f"{field}: {problem}; set {field}: false, or change {size}")
        domain = PROFILES[self.hardware.prefill].scale_up_domain_cards  # what prefill's all-to-all prices as a node
        for field, _, cards in prefill:
            problem = node_limit_problem(self.model, cards, domain) if cards > domain else None
            if problem:
                raise ValueError(f"{field}: {problem} of hardware.prefill's scale-up domain ({self.hardware.prefill}: "
                                 f"{domain} cards), which its all-to-all crosses; set cluster.cards_per_node: "
                                 f"{domain}, or {field}: false")
        if asked and self.balance.policy == "none":
            raise ValueError("node limits need a balancing policy; balance.policy none places one replica per expert")
        return self

    @property
    def decode_slots_per_card(self) -> int:
        """S: expert slots on each decode card: `balance.slots_per_card`, else one per expert spread over the cards
        plus one redundant slot (none without a balancing policy)."""
        if self.balance.slots_per_card is not None:
            return self.balance.slots_per_card
        experts, cards = self.model.num_routed_experts, self.cluster.decode_cards
        return -(-experts // cards) + (0 if self.balance.policy == "none" else 1)

    @property
    def retention_s(self) -> dict[str, float]:
        """Seconds a prefix block is kept after its last use, per traffic class."""
        return {name: days * 86400.0 for name, days in self.cache.retention_days.items()}

    def input_files(self) -> list[tuple[str, Path]]:
        """(config key, path) of every file the run reads besides the config itself."""
        named = (("workload.trace", self.workload.trace), ("balance.routing_trace", self.balance.routing_trace))
        return [(key, Path(path)) for key, path in named if path is not None]


def node_limit_problem(model: ModelProfile, cards: int, cards_per_node: int) -> str | None:
    """Why `cards` cards in nodes of `cards_per_node` cannot keep each of `model`'s expert groups on one node (whole
    nodes, whole groups a node, groups that split the experts evenly), or None when they can."""
    if cards % cards_per_node:
        return f"{cards} cards are not whole nodes of {cards_per_node}"
    nodes = cards // cards_per_node
    if model.expert_groups % nodes:
        return f"model.expert_groups={model.expert_groups} is not a multiple of the {nodes} nodes"
    if model.num_routed_experts % model.expert_groups:
        return (f"model.expert_groups={model.expert_groups} does not divide the {model.num_routed_experts} "
                f"experts")
    return None


class _ConfigLoader(yaml.SafeLoader):
    """YAML as `yaml.safe_load` reads it, except that a plain number with an exponent and no sign in it (608.0e9,
    1e6) is a number, as YAML 1.2 and JSON read it, not the string YAML 1.1 makes of it. A quoted value stays a
    string, which the config's strict fields refuse where they expect a number."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_sim_config(path: str | Path | None) -> SimConfig:
    """The config in a YAML or JSON file (None: the embedded default).

    Raises:
        SimConfigError: unreadable file, bad syntax, or an invalid field (the message names it and says why).
    """
    if path is None:
        return SimConfig()
    file = Path(path)
    if not file.is_file():
        raise SimConfigError(f"simulator config not found: {file}; pass a YAML or JSON file, or no --config for "
                             f"the embedded default")
    try:
        text = file.read_text()
        data = json.loads(text) if file.suffix == ".json" else yaml.load(text, Loader=_ConfigLoader)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SimConfigError(f"{file}: cannot parse it as {'JSON' if file.suffix == '.json' else 'YAML'}: "
                             f"{' '.join(str(exc).split())[:200]}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SimConfigError(f"{file}: expected a mapping of settings at the top level; found {type(data).__name__}")
    try:
        config = SimConfig.model_validate(data)
    except ValidationError as exc:
        more = f" ({exc.error_count()} problems in all)" if exc.error_count() > 1 else ""
        raise SimConfigError(f"{file}: {_config_problem(exc, SimConfig)}{more}") from exc
    return _with_paths_from(config, file.parent)


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}


def _config_problem(exc: ValidationError, model: type[BaseModel]) -> str:
    """The first problem of `exc` (from validating `model`) in one phrase: the dotted key, what was wrong, and for a
    number out of range the value found and the range allowed."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    if first["type"] == "extra_forbidden":
        return f"{'.'.join(loc)}: unknown field"
    if loc and loc[-1] == "[key]":
        return f"{'.'.join(loc[:-2])}: key {loc[-2]!r}: {first['msg']}"
    message = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
    where = ".".join(loc)
    if first["type"] in _RANGE_ERRORS:
        value = first["input"]
        found = f"{value:g}" if isinstance(value, float) else str(value)
        allowed = _allowed_range(model, first["loc"])
        message += f" (found {found}{'; allowed: ' + allowed if allowed else ''})"
    return f"{where}: {message}" if where else message


def _allowed_range(model: type[BaseModel], loc: tuple) -> str:
    """The bounds of the field at `loc` inside `model` ('> 0 and <= 86400'), or '' when they cannot be found."""
    annotation, metadata = model, []
    for part in loc:
        annotation = _without_none(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
            field = annotation.model_fields[part]
            annotation, metadata = field.annotation, list(field.metadata)
        elif get_origin(annotation) is dict:
            annotation, metadata = get_args(annotation)[1], []
            if get_origin(annotation) is Annotated:
                annotation, *metadata = get_args(annotation)
        else:
            return ""
    symbols = {annotated_types.Gt: ("gt", ">"), annotated_types.Ge: ("ge", ">="), annotated_types.Lt: ("lt", "<"),
               annotated_types.Le: ("le", "<=")}
    flat = [inner for item in metadata for inner in (item.metadata if isinstance(item, FieldInfo) else [item])]
    bounds = [f"{symbols[type(item)][1]} {getattr(item, symbols[type(item)][0]):g}" for item in flat
              if type(item) in symbols]
    return " and ".join(bounds)


def _without_none(annotation):
    """`X` for `X | None`, else the annotation itself."""
    args = get_args(annotation)
    if len(args) == 2 and type(None) in args:
        return next(arg for arg in args if arg is not type(None))
    return annotation


def _with_paths_from(config: SimConfig, folder: Path) -> SimConfig:
    """Trace paths in a config file are relative to the file's folder."""
    workload, balance = config.workload, config.balance
    if workload.trace is not None and not Path(workload.trace).is_absolute():
        workload = workload.model_copy(update={"trace": str(folder / workload.trace)})
    if balance.routing_trace is not None and not Path(balance.routing_trace).is_absolute():
        balance = balance.model_copy(update={"routing_trace": str(folder / balance.routing_trace)})
    return config.model_copy(update={"workload": workload, "balance": balance})
