"""The persistent prefix store behind a fleet's cache hits: the share of its prompt tokens that a store of a given
capacity, keeping each traffic class's prefixes for its retention, serves from cache, in steady state and day by
day from empty.

The model, on a day's token rates:

- A prompt token hits when it re-reads a prefix still stored. A share `session_share` of prompt tokens re-reads a
  prefix written minutes before in its own session (kept by any retention); a share `return_share` (fitted,
  `store.return_share`) re-reads one after an interval drawn log-normally (`return_median_days`, `return_sigma`);
  the rest is never re-read.
- Every miss writes its tokens' KV to the store (the model's bytes per token as the request-level engine stores a
  block). A prefix stays its class's `cache.retention_days` after its last use unless the store
  (`cache.disk_capacity_tb`) fills first: with
  least-recently-used eviction a store behaves as one time to live for everything (Che's approximation), the age
  at which what both classes wrote, each kept for the shorter of that age and its retention, fills the capacity.
  So a class's prefixes live min(retention, that age, the store's own age).
- A class's hit share is session_share + return_share x P(interval < lifetime); the day's, the token-weighted mean.

The writes depend on the hit share and the hit share on how long the writes live: a fixed point, reached by
iteration from the session share (each round can only raise both).
"""

import math
from dataclasses import dataclass

from sim.calibration import fitted
from sim.config import SimConfig
from sim.fleet.config import PrefixStoreConfig

CLASSES = ("chat", "agent")
MAX_HIT_SHARE = 0.999  # the traffic's hit share is below 1 (one token of every prompt is computed)


@dataclass(frozen=True)
class StoreState:
    """The store on one day (or in steady state).

    Attributes:
        hit_share: prompt tokens served from the store, over all prompt tokens.
        class_hit_share: the same per traffic class.
        lifetime_days: days a prefix of each class stays in the store.
        capacity_days: the age at which the store fills (inf: it never does; retention binds).
        written_pb_per_day: PB of misses written per day.
        bytes_per_token: KV bytes a stored prompt token takes.
    """

    hit_share: float
    class_hit_share: dict[str, float]
    lifetime_days: dict[str, float]
    capacity_days: float
    written_pb_per_day: float
    bytes_per_token: float

    @property
    def binding(self) -> str:
        """What limits the lifetimes: "capacity" when the store fills before the longest retention ends, else
        "retention"."""
        return "capacity" if math.isfinite(self.capacity_days) else "retention"


def store_state(store: PrefixStoreConfig, capacity_pb: float, retention_days: dict[str, float],
                input_tokens_per_day: float, bytes_per_token: float, age_days: float = math.inf,
                return_share: float | None = None) -> StoreState:
    """A store of `capacity_pb` PB keeping each class's prefixes `retention_days`, after `age_days` days of traffic
    from empty (inf: steady state); `return_share` replaces the fitted one (the refit searches with it)."""
    returning = fitted("store.return_share") if return_share is None else return_share
    tokens = {"chat": input_tokens_per_day * (1.0 - store.agent_share),
              "agent": input_tokens_per_day * store.agent_share}
    capacity_tokens = capacity_pb * 1e15 / bytes_per_token
    hits = dict.fromkeys(CLASSES, store.session_share)
    capacity_days = math.inf
    for _ in range(200):
        writes = {name: tokens[name] * (1.0 - hits[name]) for name in CLASSES}
        capacity_days = _fill_age(writes, retention_days, age_days, capacity_tokens)
        lifetimes = {name: min(retention_days[name], capacity_days, age_days) for name in CLASSES}
        updated = {name: store.session_share + returning * _returned_by(store, lifetimes[name]) for name in CLASSES}
        moved = max(abs(updated[name] - hits[name]) for name in CLASSES)
        hits = updated
        if moved < 1e-12:
            break
    total = sum(tokens.values())
    share = sum(tokens[name] * hits[name] for name in CLASSES) / total if total > 0 else 0.0
    written = sum(tokens[name] * (1.0 - hits[name]) for name in CLASSES) * bytes_per_token / 1e15
    return StoreState(share, hits, lifetimes, capacity_days, written, bytes_per_token)


def days_from_empty(store: PrefixStoreConfig, capacity_pb: float, retention_days: dict[str, float],
                    input_tokens_per_day: float, bytes_per_token: float, days: int) -> list[StoreState]:
    """The store on each of the first `days` days from empty, each at its middle."""
    return [store_state(store, capacity_pb, retention_days, input_tokens_per_day, bytes_per_token, day + 0.5)
            for day in range(days)]


def _returned_by(store: PrefixStoreConfig, lifetime_days: float) -> float:
    """P(a returning prompt comes back within `lifetime_days`): the log-normal interval's CDF."""
    if lifetime_days <= 0:
        return 0.0
    if math.isinf(lifetime_days):
        return 1.0
    z = (math.log(lifetime_days) - math.log(store.return_median_days)) / store.return_sigma
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _fill_age(writes_per_day: dict[str, float], retention_days: dict[str, float], age_days: float,
              capacity_tokens: float) -> float:
    """The age T at which the tokens written per day, each class's kept min(T, its retention, the store's age),
    fill `capacity_tokens`; inf when even the longest lifetime fits."""
    def stored(ttl: float) -> float:
        return sum(rate * min(ttl, retention_days[name], age_days) for name, rate in writes_per_day.items())

    longest = min(max(retention_days.values()), age_days)
    if stored(longest) <= capacity_tokens:
        return math.inf
    low, high = 0.0, longest
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if stored(middle) <= capacity_tokens else (low, middle)
    return low


def store_of(config: SimConfig) -> tuple[float, dict[str, float], float, float]:
    """(capacity PB, retention days per class, prompt tokens a day, bytes per stored token) of `config`'s store and
    fleet traffic: the `cache` section's capacity and retention, the model's KV per token as the engine stores it."""
    from sim.stage_costs import disk_bytes_per_block

    cache = config.cache
    return (cache.disk_capacity_tb / 1000.0, dict(cache.retention_days), config.fleet.traffic.input_tokens_per_day,
            disk_bytes_per_block(config) / cache.block_tokens)


def daily_hit_shares(config: SimConfig, days: int) -> list[float]:
    """The hit share of each of the first `days` days of `config.fleet.store` from empty, for the fleet's traffic."""
    states = days_from_empty(config.fleet.store, *store_of(config), days)
    return [min(state.hit_share, MAX_HIT_SHARE) for state in states]


def with_hit_share(config: SimConfig, share: float) -> SimConfig:
    """`config` with its fleet traffic's cache hit share set to `share` (at most MAX_HIT_SHARE)."""
    traffic = config.fleet.traffic.model_copy(update={"cache_hit_share": min(share, MAX_HIT_SHARE)})
    return config.model_copy(update={"fleet": config.fleet.model_copy(update={"traffic": traffic})})


def fleet_store(config: SimConfig) -> tuple[StoreState | None, list[StoreState]]:
    """(steady state, the first week or the run's days from empty, whichever is longer) of the fleet's prefix store;
    (None, []) without `config.fleet.store`."""
    store = config.fleet.store
    if store is None:
        return None, []
    held = store_of(config)
    return store_state(store, *held), days_from_empty(store, *held, max(7, math.ceil(config.fleet.days)))


def store_report(steady: StoreState, from_empty: list[StoreState]) -> dict:
    """The `prefix_store` key of a fleet report."""
    return {"hit_share": steady.hit_share, "class_hit_share": steady.class_hit_share,
            "lifetime_days": steady.lifetime_days,
            "capacity_days": steady.capacity_days if math.isfinite(steady.capacity_days) else None,
            "binding": steady.binding, "written_pb_per_day": steady.written_pb_per_day,
            "bytes_per_token": steady.bytes_per_token,
            "hit_share_by_day_from_empty": [state.hit_share for state in from_empty]}
