"""Settings of the fleet-scale run: a day (or several) of a whole serving fleet, from units costed in detail.

A request-by-request simulation cannot run a day of a fleet that serves hundreds of billions of tokens, so the
fleet run works per time step (a minute by default) on token rates: each stage's capacity is its units' capacity
(a prefill instance of a few 8-card nodes, a decode EP unit), computed by the same cost model that times every
batch and step of the detailed run, at the traffic's operating point; an autoscaler moves nodes between the stages
and grows or shrinks the fleet; faults take cards away; prices turn the tokens served into revenue and the nodes
held into cost. Every field has a default; the traffic's and the prices' are DeepSeek's published Feb-2025 day
(`sim/configs/deepseek-feb2025-day.yaml` sets the rest of that day's assumptions; figures: docs/simulator.md,
'Fleet calibration').

Every number has a finite range (NaN and infinity are refused), wide enough for a fleet of a million nodes serving
a thousand times DeepSeek's published day for a year; what a whole run would cost (its steps and card failures) is
estimated before it starts (`sim.work_budget`).
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOKENS_PER_DAY = 1e15  # over a thousand times the default day (DeepSeek's published one)
MAX_NODES = 1_000_000  # nodes of a fleet (quota, minimums, fixed split, spares)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class DailyTraffic(_Strict):
    """The day's tokens and their shape over the hours."""

    input_tokens_per_day: float = Field(608e9, gt=0, le=MAX_TOKENS_PER_DAY,
                                        description="Prompt tokens per day, cache hits included (at most 1e15).")
    cache_hit_share: float = Field(0.563, ge=0, lt=1, description="Share of prompt tokens served from the "
                                                                  "persistent KV cache.")
    output_tokens_per_day: float = Field(168e9, gt=0, le=MAX_TOKENS_PER_DAY,
                                         description="Generated tokens per day (at most 1e15).")
    output_tokens_per_request: float = Field(600.0, gt=0, le=1e6, description="Mean generated tokens per request "
                                                                              "(turns tokens into requests).")
    kv_tokens_per_sequence: float = Field(4989.0, gt=0, le=1e7, description="Mean context of a decoding sequence "
                                                                            "(default: DeepSeek's published one).")
    prompt_tokens: float = Field(4989.0, gt=0, le=1e7, description="Mean prompt of a prefill batch's requests.")
    prompt_length_spread: float = Field(1.0, ge=1, le=100, description="E[P^2] / E[P]^2 of the prompts' lengths "
                                        "(1: all prompt_tokens long; capacity.prompt_length_spread).")
    peak_to_mean: float = Field(1.25, ge=1, lt=2, description="Peak over mean of the daily load curve (a cosine).")
    peak_hour: float = Field(15.0, ge=0, lt=24, description="Hour of the daily peak (local time of the prices).")
    noise: float = Field(0.01, ge=0, lt=1, description="Relative minute-to-minute noise of the load (log-normal).")
    mix_swing: float = Field(0.0, ge=0, lt=1, description="Relative swing over the day of generated over prompt "
                             "tokens (0: a fixed mix), which moves load between decode and prefill.")
    mix_peak_hour: float = Field(21.0, ge=0, lt=24, description="Hour the mix is most reply-heavy.")
    bursts_per_day: float = Field(2.0, ge=0, le=1000, description="Sudden bursts per day (Poisson).")
    burst_size: float = Field(0.3, ge=0, le=100, description="Extra load during a burst, as a share of the curve.")
    burst_minutes: float = Field(20.0, gt=0, le=1440, description="Length of a burst.")


class AutoscalerConfig(_Strict):
    """The controller that moves nodes between prefill and decode and grows or shrinks the fleet."""

    enabled: bool = Field(True, description="Autoscale (False: the fixed split of `fixed_*_nodes`).")
    interval_s: float = Field(300.0, ge=1, le=86400, description="Seconds between decisions.")
    target_utilisation: float = Field(1.0, ge=0.05, le=1, description="Load over capacity each stage is sized for. "
                                      "1.0 with the calibrated cost model: its capacities are DeepSeek's day "
                                      "averages, which already carry its headroom.")
    move_s: float = Field(300.0, ge=0, le=86400, description="Seconds a node takes to switch stage (drain, load "
                                                             "weights).")
    grow_s: float = Field(600.0, ge=0, le=86400, description="Seconds a node added to the fleet takes to serve.")
    quota_nodes: int = Field(320, ge=1, le=MAX_NODES, description="Nodes the fleet may hold at most (its quota).")
    shrink_quota_threshold: float = Field(0.8, gt=0, le=1, description="Never shrink the fleet while quota use "
                                          "(nodes the load needs now, spares included, over quota_nodes) is above "
                                          "this.")
    shrink_after_s: float = Field(900.0, ge=0, le=7 * 86400.0, description="Release nodes only after the surplus "
                                                                           "lasted this long.")
    granularity: Literal["unit", "node"] = Field("unit", description="unit: a stage serves in whole units (a "
                                                 "prefill instance, a decode EP unit); node: capacity per node, "
                                                 "pro rata (units of any size).")
    min_prefill_nodes: int = Field(4, ge=1, le=MAX_NODES, description="Prefill nodes kept at least.")
    min_decode_nodes: int = Field(18, ge=1, le=MAX_NODES, description="Decode nodes kept at least.")
    fixed_prefill_nodes: int | None = Field(None, ge=1, le=MAX_NODES, description="Prefill nodes of the fixed "
                                            "split (None: the autoscaled run's mean, so both hold the same "
                                            "node-hours).")
    fixed_decode_nodes: int | None = Field(None, ge=1, le=MAX_NODES, description="Decode nodes of the fixed split "
                                           "(None: as above).")


class Prices(_Strict):
    """What the tokens are billed and what the cards cost."""

    input_cache_hit_per_m_usd: float = Field(0.14, ge=0, le=1000, description="$ per million prompt tokens served "
                                             "from cache (default: DeepSeek-R1's list prices throughout).")
    input_cache_miss_per_m_usd: float = Field(0.55, ge=0, le=1000, description="$ per million prompt tokens "
                                                                               "computed.")
    output_per_m_usd: float = Field(2.19, ge=0, le=1000, description="$ per million generated tokens.")
    valley_hours: tuple[float, float] | None = Field((0.5, 8.5), description="Off-peak ('valley') hours [start, "
                                                     "end), local time; None: one price all day.")
    valley_price_factor: float = Field(1.0, ge=0, le=1, description="Prices times this in the valley hours "
                                       "(1.0: list price all day).")
    card_hour_usd: float | None = Field(None, ge=0, le=1000, description="$ per card-hour of every card (None: "
                                                                         "each stage's card profile price).")

    @field_validator("valley_hours", mode="before")
    @classmethod
    def _pair_from_a_list(cls, value):
        return tuple(value) if isinstance(value, list) else value  # YAML and JSON write a pair as a list

    @model_validator(mode="after")
    def _valley_within_the_day(self) -> "Prices":
        if self.valley_hours is not None and not all(0 <= hour <= 24 for hour in self.valley_hours):
            raise ValueError(f"valley_hours must be two hours in [0, 24] (start, end); got {self.valley_hours}")
        return self


class FaultConfig(_Strict):
    """Card failures and how the fleet rides them out (the default rate's source: docs/simulator.md, 'Faults')."""

    card_failures_per_hour: float = Field(1.97e-5, ge=0, le=1, description="Failures per card-hour (default: the "
                                          "interruption rate of Llama 3's training run).")
    repair_hours: float = Field(4.0, gt=0, le=8784, description="Hours until a failed card serves again.")
    handling: Literal["reroute", "restart"] = Field(
        "reroute", description="reroute: the unit goes on without the card (its experts and sequences move to "
        "survivors, a spare takes its place); restart: the whole unit restarts.")
    spare_nodes: dict[str, int] = Field({"prefill": 1, "decode": 1}, description="Idle nodes held per stage to "
                                        "replace failed cards (billed).")
    spare_swap_s: float = Field(60.0, ge=0, le=86400, description="Seconds until a spare takes a failed card's "
                                                                  "place.")
    restart_s: float = Field(600.0, ge=0, le=86400, description="Seconds a unit restart takes (handling = "
                                                                "restart).")
    failure_multiplier: float = Field(1.0, ge=0, le=1000, description="Scales the failure rate (stress tests).")

    @model_validator(mode="after")
    def _stages(self) -> "FaultConfig":
        unknown = set(self.spare_nodes) - {"prefill", "decode"}
        if unknown:
            raise ValueError(f"spare_nodes has unknown stage(s) {sorted(unknown)}; use prefill and decode")
        negative = {stage: nodes for stage, nodes in self.spare_nodes.items() if nodes < 0}
        if negative:
            raise ValueError(f"spare_nodes must be >= 0 per stage; got {negative}")
        huge = {stage: nodes for stage, nodes in self.spare_nodes.items() if nodes > MAX_NODES}
        if huge:
            raise ValueError(f"spare_nodes must be <= {MAX_NODES:,} per stage (the largest quota); got {huge}")
        return self


class PrefixStoreConfig(_Strict):
    """How prompts re-read earlier prefixes, for the fleet's cache hits to come from its prefix store
    (`sim.fleet.prefix_store`); the store's capacity and each class's retention are the config's `cache` section, the
    same store the request-level engine models. The reuse figures are assumptions where no source gives them; the
    share of prompt tokens re-read after a session is fitted (`store.return_share`, declared calibration) so that
    DeepSeek's Feb-2025 day gets its published hit share."""

    agent_share: float = Field(0.5, ge=0, le=1, description="Share of prompt tokens from agent traffic (assumed).")
    session_share: float = Field(0.374, ge=0, lt=1, description="Share of prompt tokens that re-read a prefix within "
                                 "their session (minutes; kept by any retention): the disk hit share of Mooncake's "
                                 "conversation hour as the request-level engine replays it (docs/simulator.md).")
    return_median_days: float = Field(1.0, gt=0, le=365, description="Median days after which a returning prompt "
                                      "re-reads a prefix (log-normal; assumed).")
    return_sigma: float = Field(1.5, gt=0, le=5, description="Log-normal sigma of that interval (assumed: hours to "
                                                             "weeks).")
    start_empty: bool = Field(False, description="The store starts the run empty: each day's hit share is the "
                              "store's on that day (False: its steady state throughout, a store in service).")


class FleetConfig(_Strict):
    """A fleet run: days of traffic through prefill instances and decode units."""

    days: float = Field(1.0, gt=0, le=366, description="Days simulated.")
    step_s: float = Field(60.0, ge=1, le=3600, description="Seconds per time step.")
    tokens_per_s_per_user: float = Field(21.0, gt=0, le=10_000, description="Decode speed each sequence is served "
                                                                            "at (default: DeepSeek's published one).")
    prefill_instance_nodes: int = Field(4, ge=1, le=1024, description="Nodes per prefill instance (default: "
                                                                      "DeepSeek's).")
    decode_imbalance: float | None = Field(None, ge=1, le=100, description="Busiest card's routed tokens over the "
                                           "mean in the decode units (None: what balance.policy gives at the units' "
                                           "batch per card, from the placement code).")
    prefill_imbalance: float | None = Field(None, ge=1, le=100, description="The same in the prefill instances "
                                            "(None: from the placement code at their batch).")
    compare_policies: list[Literal["cpsat", "deepseek", "none"]] = Field(
        [], max_length=3, description="Placement policies the same traffic also runs under, autoscaled, for nodes "
                                      "and cost per policy (report key policies; cost_saved_usd_per_day when cpsat "
                                      "and deepseek are both there).")
    drain_s: float = Field(3600.0, ge=0, le=7 * 86400.0, description="Seconds after the last arrival to serve what "
                                                                     "is queued (at most a week); what is left is "
                                                                     "lost.")
    traffic: DailyTraffic = Field(DailyTraffic(), description="The day's traffic.")
    autoscaler: AutoscalerConfig = Field(AutoscalerConfig(), description="Node placement over time.")
    prices: Prices = Field(Prices(), description="Billing and card cost.")
    faults: FaultConfig = Field(FaultConfig(), description="Card failures.")
    store: PrefixStoreConfig | None = Field(None, description="Take the cache hit share from the prefix store "
                                            "(capacity and retention: the cache section) instead of "
                                            "traffic.cache_hit_share (None).")

    @model_validator(mode="after")
    def _comparison_is_autoscaled(self) -> "FleetConfig":
        if self.compare_policies and not self.autoscaler.enabled:
            raise ValueError("compare_policies runs each policy autoscaled; it needs autoscaler.enabled (a fixed "
                             "split holds the same nodes under every policy)")
        if len(set(self.compare_policies)) != len(self.compare_policies):
            raise ValueError(f"compare_policies={self.compare_policies} names a policy twice; list each once")
        return self
