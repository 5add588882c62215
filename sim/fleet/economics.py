"""Money: what tokens are billed at each hour of the day, and what held cards cost."""

from sim.config import SimConfig
from sim.fleet.config import Prices
from sim.hardware import PROFILES


def price_factor(hour_of_day: float, prices: Prices) -> float:
    """Multiplier of every price at `hour_of_day` (local time, [0, 24)): valley_price_factor in the valley hours."""
    if prices.valley_hours is None:
        return 1.0
    start, end = prices.valley_hours
    hour = hour_of_day % 24.0
    inside = start <= hour < end if start <= end else (hour >= start or hour < end)
    return prices.valley_price_factor if inside else 1.0


def revenue_usd(hit_tokens: float, miss_tokens: float, output_tokens: float, hour_of_day: float,
                prices: Prices) -> float:
    """Billing of tokens served at one hour: cache-hit and cache-miss prompt tokens and generated tokens."""
    listed = (hit_tokens * prices.input_cache_hit_per_m_usd + miss_tokens * prices.input_cache_miss_per_m_usd
              + output_tokens * prices.output_per_m_usd) / 1e6
    return listed * price_factor(hour_of_day, prices)


def card_hour_usd(config: SimConfig, stage: str) -> float:
    """$ per card-hour of `stage`'s cards ("prefill" or "decode"): the fleet's prices.card_hour_usd, else the
    stage's card profile price.

    Raises:
        ValueError: neither is set (the profile has no published price).
    """
    price = config.fleet.prices.card_hour_usd
    if price is not None:
        return price
    profile = PROFILES[getattr(config.hardware, stage)]
    if profile.price_per_hour_usd is None:
        raise ValueError(f"hardware profile {profile.name} ({stage}) has no price; set fleet.prices.card_hour_usd")
    return profile.price_per_hour_usd
