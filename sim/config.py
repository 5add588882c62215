"""The simulator's configuration: one pydantic model, read from YAML or JSON, every field with a default.

The default (no file) is the embedded run: one minute of synthetic chat and agent traffic through a vision card,
prefill nodes and one decode EP unit of 128 cards, a DeepSeek-V3-like model on H800s.
"""

import json
import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.fleet_config import FleetConfig
from sim.hardware import PROFILES
from sim.model_profile import ModelProfile
from sim.speculative import SpeculativeConfig
from traces.errors import EplbError


class SimConfigError(EplbError):
    """A simulator configuration that cannot be read or is invalid; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SyntheticWorkload(_Strict):
    """Generated traffic: sessions of several turns (each turn resends the history), chat and agent classes."""

    sessions_per_s: float = Field(60.0, gt=0, description="New conversations per second at the daily mean.")
    agent_share: float = Field(0.5, ge=0, le=1, description="Share of sessions that are agent traffic.")
    turns_mean: dict[str, float] = Field({"chat": 3.0, "agent": 8.0},
                                         description="Mean turns per session, per class (geometric).")
    think_time_s: dict[str, float] = Field({"chat": 20.0, "agent": 3.0},
                                           description="Mean seconds between a reply and the next turn, per class.")
    first_input_tokens: dict[str, float] = Field({"chat": 1500.0, "agent": 6000.0},
                                                 description="Mean prompt of a session's first turn, per class.")
    turn_input_tokens: dict[str, float] = Field({"chat": 200.0, "agent": 800.0},
                                                description="Mean new user/tool tokens of each later turn.")
    output_tokens: dict[str, float] = Field({"chat": 400.0, "agent": 250.0},
                                            description="Mean tokens generated per turn, per class.")
    images_per_request: float = Field(0.1, ge=0, description="Mean images attached to a request (Poisson).")
    daily_curve: bool = Field(False, description="Modulate arrivals by a daily load curve (peak in the afternoon).")
    daily_peak_to_mean: float = Field(1.5, ge=1, description="Peak over mean of the daily curve.")


class WorkloadConfig(_Strict):
    """Where requests come from."""

    trace: str | None = Field(None, description="Request trace: Mooncake .jsonl or Azure .csv, relative to the "
                                                "config file (None: synthetic).")
    trace_class: Literal["chat", "agent"] = Field("chat", description="Traffic class of a trace's requests.")
    time_scale: float = Field(1.0, gt=0, description="Divide the trace's arrival times by this (2: twice the rate).")
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

    vision_cards: int = Field(4, ge=1, description="Single-card vision encoder instances.")
    prefill_nodes: int = Field(16, ge=1, description="Prefill instances, one 8-card node each.")
    cards_per_node: int = Field(8, ge=1, description="Cards per prefill node.")
    max_prefill_batch_tokens: int = Field(16384, ge=1, description="New tokens one prefill batch may hold.")
    decode_units: int = Field(1, ge=1, description="Decode EP units.")
    decode_cards: int = Field(128, ge=1, description="Cards per decode EP unit (64-128 in DeepSeek's setup).")
    max_decode_batch_per_card: int = Field(128, ge=1, description="Sequences per decode card at most (besides "
                                                                  "the HBM bound).")


class CacheConfig(_Strict):
    """The KV cache tiers: a persistent SSD tier keyed by prefix blocks, and the sliding-window state."""

    disk_capacity_tb: float = Field(1000.0, gt=0, description="Persistent tier capacity (TB; DeepSeek: ~100 PB "
                                                              "for the whole fleet).")
    retention_days: dict[str, float] = Field({"agent": 3.0, "chat": 7.0},
                                             description="Days a prefix block is kept after its last use, per class.")
    disk_read_gb_s: float = Field(40.0, gt=0, description="Read bandwidth from the storage cluster per prefill node.")
    block_tokens: int = Field(512, ge=1, description="Tokens per prefix block (Mooncake's hash_ids: 512).")
    window_design: Literal["memory", "disk", "recompute"] = Field(
        "memory", description="Sliding-window state: kept in server memory (recompute the tail when missing), "
                              "persisted on disk with the prefix, or never kept (recompute every cached token).")
    window_lifetime_s: float = Field(180.0, gt=0, description="Lifetime of the in-memory sliding-window state.")
    window_recompute_tokens: int = Field(128, ge=0, description="Tokens recomputed when the window state is missing.")


class BalanceConfig(_Strict):
    """Expert load of the decode units: a routing trace replayed through the project's placement policies."""

    routing_trace: str | None = Field(None, description="Decode routing trace (issue 2's formats; None: synthetic "
                                                         "at the model's shape).")
    policy: Literal["cpsat", "deepseek", "none"] = Field("cpsat", description="Placement policy; none = one "
                                                                              "replica per expert, no balancing.")
    slots_per_card: int | None = Field(None, ge=1, description="Expert slots per decode card (None: E / cards + 1).")
    layers: int = Field(4, ge=1, description="Layers of the synthetic routing trace (imbalance is their mean).")
    steps: int = Field(300, ge=10, description="Steps of the synthetic routing trace (replayed cyclically).")
    refit_every: int = Field(50, ge=1, description="Steps between refits, as a live rebalancer would.")
    window: int = Field(50, ge=1, description="Steps each fit sees.")
    time_limit_s: float = Field(1.0, gt=0, description="cpsat budget per fit (all layers).")


class SimConfig(_Strict):
    """One simulation run."""

    seed: int = Field(0, ge=0, description="Seed of every random stream (arrivals, lengths, images, traces).")
    duration_s: float = Field(60.0, gt=0, description="Simulated seconds of arrivals (the run drains after).")
    workload: WorkloadConfig = Field(WorkloadConfig(), description="Requests.")
    model: ModelProfile = Field(ModelProfile(sliding_window_share=0.5), description="The served model (default: "
                                "DeepSeek-V3's shape with half its layers sliding-window, as the post's V4.1).")
    hardware: HardwareConfig = Field(HardwareConfig(), description="Cards per stage.")
    cluster: ClusterConfig = Field(ClusterConfig(), description="Machines per stage.")
    cache: CacheConfig = Field(CacheConfig(), description="KV cache tiers.")
    balance: BalanceConfig = Field(BalanceConfig(), description="Decode expert balance.")
    speculative: SpeculativeConfig = Field(SpeculativeConfig(), description="Speculative decoding on the decode "
                                                                            "units (off by default).")
    fleet: FleetConfig | None = Field(None, description="Run days of a whole fleet on token rates from units "
                                      "costed in detail (sim.fleet) instead of request by request.")

    @property
    def retention_s(self) -> dict[str, float]:
        return {name: days * 86400.0 if math.isfinite(days) else math.inf
                for name, days in self.cache.retention_days.items()}


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
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
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
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        what = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        raise SimConfigError(f"{file}: {where}: {what} ({exc.error_count()} problem(s) in all)") from exc
    return _with_paths_from(config, file.parent)


def _with_paths_from(config: SimConfig, folder: Path) -> SimConfig:
    """Trace paths in a config file are relative to the file's folder."""
    workload, balance = config.workload, config.balance
    if workload.trace is not None and not Path(workload.trace).is_absolute():
        workload = workload.model_copy(update={"trace": str(folder / workload.trace)})
    if balance.routing_trace is not None and not Path(balance.routing_trace).is_absolute():
        balance = balance.model_copy(update={"routing_trace": str(folder / balance.routing_trace)})
    return config.model_copy(update={"workload": workload, "balance": balance})
