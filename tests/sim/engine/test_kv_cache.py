"""The KV-cache tiers: leading-block hits, LRU eviction, per-class expiry, bytes held, window lifetime, and the
prefix hit share of the real Mooncake conversation trace checked against an independent count."""

import json
import math
from pathlib import Path

import pytest

from sim.engine.kv_cache import DEEPSEEK_RETENTION_S, PrefixCache, WindowCache

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "requests"
MOONCAKE = DATA / "mooncake_conversation_trace.jsonl"


def unbounded(retention_s=math.inf, block_tokens=512) -> PrefixCache:
    return PrefixCache(math.inf, 1.0, retention_s, block_tokens=block_tokens)


def test_lookup_counts_only_the_leading_run_of_stored_blocks():
    cache = unbounded()
    cache.insert(0.0, [1, 2, 3], "chat")
    assert cache.lookup(1.0, [1, 2, 3, 4], "chat") == 3
    assert cache.lookup(1.0, [1, 9, 3], "chat") == 1  # block 3 is stored, but the prefix broke at 9
    assert cache.lookup(1.0, [9, 2, 3], "chat") == 0
    assert cache.lookup(1.0, [], "chat") == 0


def test_hit_tokens_are_capped_at_the_prompt_length_and_counted_per_class():
    cache = unbounded()
    cache.insert(0.0, [1, 2], "chat")
    cache.lookup(1.0, [1, 2], "chat", input_tokens=700)  # the second block holds only 188 tokens
    cache.lookup(1.0, [1, 5], "agent")
    assert cache.hit_tokens == {"chat": 700, "agent": 512}
    assert cache.looked_up_tokens == {"chat": 700, "agent": 1024}
    assert cache.hit_share("agent") == 0.5
    assert cache.hit_share() == pytest.approx(1212 / 1724)


def test_lookup_leaves_recency_alone_and_insert_evicts_least_recently_used_blocks_at_capacity():
    cache = PrefixCache(capacity_bytes=3 * 100, bytes_per_block=100, retention_s=math.inf)
    cache.insert(0.0, [1, 2], "chat")  # touched last to first: 2 is older than 1
    cache.insert(1.0, [3], "chat")
    cache.lookup(2.0, [1, 2], "chat")  # not a use: 2 stays the oldest
    cache.insert(3.0, [4], "chat")
    assert [cache.lookup(3.0, [b], "chat") for b in (1, 2, 3, 4)] == [1, 0, 1, 1]
    assert (cache.stored_bytes, cache.peak_bytes, cache.evicted_blocks) == (300, 300, 1)
    cache.insert(4.0, [1], "chat")  # refresh 1: now 3 is the oldest
    cache.insert(5.0, [5], "chat")
    assert [cache.lookup(5.0, [b], "chat") for b in (1, 2, 3, 4, 5)] == [1, 0, 0, 1, 1]


def test_a_prompt_larger_than_capacity_keeps_its_leading_blocks():
    cache = PrefixCache(capacity_bytes=2, bytes_per_block=1, retention_s=math.inf)
    cache.insert(0.0, [7, 8, 9, 10], "chat")
    assert cache.lookup(0.0, [7, 8, 9, 10], "chat") == 2
    assert cache.stored_blocks == 2 and cache.evicted_blocks == 2


def test_blocks_expire_after_the_retention_of_the_class_that_last_used_them():
    cache = unbounded({"chat": 10.0, "agent": 4.0})
    cache.insert(0.0, [1], "chat")
    cache.insert(0.0, [2], "agent")
    cache.insert(1.0, [3], "chat")
    cache.insert(2.0, [3], "agent")  # last used by agent: now expires at 2 + 4
    assert cache.lookup(3.999, [2], "chat") == 1
    assert cache.lookup(4.0, [2], "chat") == 0  # alive while now < last use + retention
    assert cache.stored_bytes == 2.0
    assert cache.lookup(5.999, [3], "chat") == 1 and cache.lookup(6.0, [3], "chat") == 0
    assert cache.lookup(9.999, [1], "chat") == 1 and cache.lookup(10.0, [1], "chat") == 0
    assert (cache.stored_bytes, cache.peak_bytes, cache.expired_blocks) == (0.0, 3.0, 3)


def test_refresh_extends_expiry_and_expire_updates_stored_bytes_without_a_lookup():
    cache = PrefixCache(math.inf, 2.5, 10.0)
    cache.insert(0.0, [1, 2], "chat")
    cache.insert(8.0, [2], "chat")
    cache.expire(10.0)
    assert cache.stored_bytes == 2.5 and cache.lookup(17.9, [2], "agent") == 1
    cache.expire(18.0)
    assert cache.stored_bytes == 0.0 and cache.peak_bytes == 5.0


def test_many_refreshes_keep_the_expiry_heap_near_the_live_set():
    cache = unbounded(100.0)
    for step in range(20_000):
        cache.insert(float(step), [step % 50, 1000 + step % 7], "chat")
    assert cache.stored_blocks == 57
    assert len(cache._heap) <= 2 * 57 + 1024


def test_deepseek_retention_keeps_chat_seven_days_and_agent_three():
    cache = unbounded(DEEPSEEK_RETENTION_S)
    cache.insert(0.0, [1], "chat")
    cache.insert(0.0, [2], "agent")
    assert cache.lookup(3 * 86400.0, [1], "chat") == 1 and cache.lookup(3 * 86400.0, [2], "agent") == 0
    with pytest.raises(ValueError, match="traffic_class='batch' has no retention"):
        cache.lookup(3 * 86400.0, [1], "batch")


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        (dict(capacity_bytes=0, bytes_per_block=1, retention_s=1), "capacity_bytes"),
        (dict(capacity_bytes=1, bytes_per_block=2, retention_s=1), "capacity_bytes"),
        (dict(capacity_bytes=1, bytes_per_block=math.inf, retention_s=1), "bytes_per_block"),
        (dict(capacity_bytes=1, bytes_per_block=1, retention_s=-1), "retention_s"),
        (dict(capacity_bytes=1, bytes_per_block=1, retention_s={"chat": math.nan}), "retention_s['chat']"),
        (dict(capacity_bytes=1, bytes_per_block=1, retention_s={}), "retention_s"),
        (dict(capacity_bytes=1, bytes_per_block=1, retention_s=1, block_tokens=0), "block_tokens"),
    ],
    ids=["zero-capacity", "capacity-below-a-block", "infinite-block", "negative-retention", "nan-class-retention",
         "empty-retention", "zero-block-tokens"],
)
def test_prefix_cache_refuses_bad_settings_naming_the_parameter(kwargs, parameter):
    with pytest.raises(ValueError, match=f"^{parameter.replace('[', '.').replace(']', '.')}"):
        PrefixCache(**kwargs)


def test_time_going_backwards_is_refused():
    cache = unbounded()
    cache.insert(5.0, [1], "chat")
    with pytest.raises(ValueError, match="non-decreasing"):
        cache.lookup(4.0, [1], "chat")
    window = WindowCache(1.0)
    window.store(5.0, "k")
    with pytest.raises(ValueError, match="non-decreasing"):
        window.lookup(4.0, "k")


def test_window_entry_lives_until_its_lifetime_after_the_last_store():
    window = WindowCache(180.0)
    window.store(0.0, "a")
    window.store(100.0, "b")
    assert window.lookup(179.999, "a") and not window.lookup(180.0, "a")
    assert len(window) == 1
    window.store(200.0, "b")  # a store, not a lookup, restarts the lifetime
    assert window.lookup(379.999, "b") and not window.lookup(380.0, "b")
    assert not window.lookup(380.0, "never")
    assert (window.hits, window.misses) == (2, 3)


@pytest.mark.parametrize("lifetime", [0, -1.0, math.nan, "180"], ids=["zero", "negative", "nan", "string"])
def test_window_cache_refuses_bad_lifetime(lifetime):
    with pytest.raises(ValueError, match="^lifetime_s"):
        WindowCache(lifetime)


def independent_hit_share(rows: list[dict], retention_s: float) -> float:
    """Share of input tokens whose leading 512-token blocks were used less than `retention_s` earlier, counted with
    a plain dict of last-use times (ms): a block is alive while now < last use + retention."""
    last_use_s: dict[int, float] = {}
    hit = total = 0
    for row in rows:
        now = row["timestamp"] / 1000.0
        leading = 0
        for block in row["hash_ids"]:
            if block not in last_use_s or now >= last_use_s[block] + retention_s:
                break
            leading += 1
        hit += min(leading * 512, row["input_length"])
        total += row["input_length"]
        for block in row["hash_ids"]:
            last_use_s[block] = now
    return hit / total


@pytest.mark.parametrize("retention_s, expected", [(math.inf, 0.37), (180.0, 0.24)], ids=["unbounded", "180s"])
def test_mooncake_conversation_hit_share_matches_an_independent_count(retention_s, expected):
    if not MOONCAKE.is_file():
        pytest.skip(f"{MOONCAKE} is absent (real request traces live outside the repository)")
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda row: row["timestamp"])
    cache = unbounded(retention_s)
    for row in rows:
        now = row["timestamp"] / 1000.0
        cache.lookup(now, row["hash_ids"], "chat", input_tokens=row["input_length"])
        cache.insert(now, row["hash_ids"], "chat")
    share = cache.hit_share("chat")
    assert share == pytest.approx(independent_hit_share(rows, retention_s), abs=1e-12)
    assert share == pytest.approx(expected, abs=0.03)
