"""The two KV-cache tiers of the serving simulator.

- `PrefixCache`, the persistent tier: attention state of earlier prompts on an SSD storage cluster, keyed by prefix
  blocks of `block_tokens` tokens (Mooncake `hash_ids`). A returning conversation skips the prefill of its cached
  leading blocks. A block is kept for a retention per traffic class after its last use (default
  `DEEPSEEK_RETENTION_S`, DeepSeek's published one: docs/simulator.md, 'KV cache tiers'); capacity is bounded by
  evicting the least recently used blocks.
- `WindowCache`, the host-memory tier: state of the sliding-window attention layers, kept for a lifetime
  (default `WINDOW_LIFETIME_S`); when it is missing the last `WINDOW_RECOMPUTE_TOKENS` tokens are recomputed.

Time convention (both tiers): an entry last used (stored) at `t` with lifetime `r` is alive while `now_s < t + r` and
gone from `now_s >= t + r` on; `math.inf` = never expires. Calls must come in non-decreasing `now_s`, as a
simulator's clock does; an earlier time raises `ValueError`.
"""

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence

DEEPSEEK_RETENTION_S = {"chat": 7 * 86400.0, "agent": 3 * 86400.0}
WINDOW_LIFETIME_S = 180.0
WINDOW_RECOMPUTE_TOKENS = 128


def _check_positive(name: str, value: float, *, finite: bool) -> float:
    """`value` as a float > 0 (and finite when `finite`), else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be a number > 0{' and finite' if finite else ' (math.inf: unbounded)'}; "
                         f"found {value!r}")
    if finite and math.isinf(value):
        raise ValueError(f"{name} must be finite; found {value!r}")
    return float(value)


class _Clock:
    """The latest `now_s` seen; refuses time going backwards."""

    def __init__(self) -> None:
        self.now_s = -math.inf

    def advance(self, now_s: float) -> float:
        if not math.isfinite(now_s) or now_s < self.now_s:
            raise ValueError(
                f"now_s={now_s!r} is not a finite time >= the last call's now_s={self.now_s}; "
                f"call the cache in non-decreasing simulated time"
            )
        self.now_s = float(now_s)
        return self.now_s


class PrefixCache:
    """Persistent (SSD) tier keyed by prefix blocks of `block_tokens` tokens each.

    A block is a hit only if it is stored, not expired, and every block before it in the prompt hit too: the KV state
    of block i depends on all tokens before it. Each use (`insert`) sets a block's expiry to `now_s` plus the retention
    of the traffic class that used it, and makes it the most recently used. Eviction at capacity removes least
    recently used blocks first; `insert` touches a prompt's blocks from last to first, so when a prompt must lose
    blocks it loses its tail and keeps its (more widely shared) leading blocks.

    Expired blocks are purged lazily, in order of expiry through a heap, at the start of every call, so `lookup`
    never counts one and `stored_bytes` is exact as of the latest `now_s` given to any method (`expire` advances it
    without a lookup). Cost: O(blocks of the prompt + blocks purged) per call, amortised.
    """

    def __init__(
        self,
        capacity_bytes: float,
        bytes_per_block: float,
        retention_s: dict[str, float] | float,
        block_tokens: int = 512,
    ) -> None:
        """Check and keep the settings; the cache starts empty.

        Args:
            capacity_bytes: bytes the tier holds (math.inf: unbounded); at least one block.
            bytes_per_block: bytes of KV state of one full block (all layers), > 0.
            retention_s: seconds a block lives after its last use, per traffic class ({"chat": ..., "agent": ...})
                or one value for every class; math.inf: never expires.
            block_tokens: tokens per block (Mooncake: 512).
        """
        self.capacity_bytes = _check_positive("capacity_bytes", capacity_bytes, finite=False)
        self.bytes_per_block = _check_positive("bytes_per_block", bytes_per_block, finite=True)
        if self.capacity_bytes < self.bytes_per_block:
            raise ValueError(
                f"capacity_bytes={capacity_bytes} holds no block of bytes_per_block={bytes_per_block}; "
                f"give at least one block's bytes (math.inf: unbounded)"
            )
        if isinstance(retention_s, dict):
            if not retention_s:
                raise ValueError("retention_s is an empty dict; give seconds per traffic class, e.g. {'chat': 604800}")
            self._retention_s: dict[str, float] | None = {
                str(cls): _check_positive(f"retention_s[{cls!r}]", value, finite=False)
                for cls, value in retention_s.items()
            }
            self._default_retention_s = math.nan
        else:
            self._retention_s = None
            self._default_retention_s = _check_positive("retention_s", retention_s, finite=False)
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens must be a positive integer; found {block_tokens!r}")
        self.block_tokens = block_tokens
        self._clock = _Clock()
        # _expiry_s[h]: when block h expires; its order is least recently used first.
        self._expiry_s: OrderedDict[Hashable, float] = OrderedDict()
        # _heap: (expiry, seq, h) per finite expiry ever set; an entry whose expiry no longer matches is stale.
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self.peak_bytes = 0.0
        self.evicted_blocks = 0
        self.expired_blocks = 0
        self._looked_up_tokens: dict[str, int] = {}
        self._hit_tokens: dict[str, int] = {}

    @property
    def stored_blocks(self) -> int:
        """Blocks held, as of the latest `now_s` given to any method."""
        return len(self._expiry_s)

    @property
    def stored_bytes(self) -> float:
        """Bytes held, as of the latest `now_s` given to any method: stored_blocks * bytes_per_block."""
        return len(self._expiry_s) * self.bytes_per_block

    @property
    def looked_up_tokens(self) -> dict[str, int]:
        """Per traffic class: prompt tokens looked up (input_tokens, or blocks * block_tokens when not given)."""
        return dict(self._looked_up_tokens)

    @property
    def hit_tokens(self) -> dict[str, int]:
        """Per traffic class: tokens served from the cache (hit blocks * block_tokens, capped at input_tokens)."""
        return dict(self._hit_tokens)

    def hit_share(self, traffic_class: str | None = None) -> float:
        """Hit tokens / looked-up tokens, for one class or all (None); 0.0 before any lookup."""
        if traffic_class is None:
            looked, hit = sum(self._looked_up_tokens.values()), sum(self._hit_tokens.values())
        else:
            looked, hit = self._looked_up_tokens.get(traffic_class, 0), self._hit_tokens.get(traffic_class, 0)
        return hit / looked if looked else 0.0

    def retention_of(self, traffic_class: str) -> float:
        """Seconds a block lives after a use by `traffic_class`; ValueError for a class the cache was not given."""
        if self._retention_s is None:
            return self._default_retention_s
        try:
            return self._retention_s[traffic_class]
        except KeyError:
            raise ValueError(
                f"traffic_class={traffic_class!r} has no retention; this cache knows {sorted(self._retention_s)}"
            ) from None

    def expire(self, now_s: float) -> None:
        """Advance the cache's clock to `now_s` and drop every block expired by then."""
        now_s = self._clock.advance(now_s)
        heap, expiry_s = self._heap, self._expiry_s
        while heap and heap[0][0] <= now_s:
            expiry, _, block = heapq.heappop(heap)
            if expiry_s.get(block) == expiry:
                del expiry_s[block]
                self.expired_blocks += 1

    def lookup(
        self, now_s: float, block_hashes: Sequence[int], traffic_class: str, input_tokens: int | None = None
    ) -> int:
        """Number of leading blocks of a prompt held and alive at `now_s` (a block counts only if all before it do).

        Counts the lookup in `looked_up_tokens` / `hit_tokens` of `traffic_class`; the blocks' recency and expiry
        are left as they were (call `insert` once the prompt is served).

        Args:
            block_hashes: [blocks] the prompt's block ids in order.
            input_tokens: the prompt's length in tokens; caps the hit tokens (the last block may be partial) and is
                the looked-up amount. None: blocks * block_tokens.
        """
        self.retention_of(traffic_class)
        self.expire(now_s)
        hit = 0
        expiry_s = self._expiry_s
        for block in block_hashes:
            if block not in expiry_s:
                break
            hit += 1
        tokens = len(block_hashes) * self.block_tokens if input_tokens is None else input_tokens
        self._looked_up_tokens[traffic_class] = self._looked_up_tokens.get(traffic_class, 0) + tokens
        self._hit_tokens[traffic_class] = self._hit_tokens.get(traffic_class, 0) + min(hit * self.block_tokens, tokens)
        return hit

    def insert(self, now_s: float, block_hashes: Sequence[int], traffic_class: str) -> None:
        """Store or refresh every block of a prompt used at `now_s` by `traffic_class`, then evict LRU blocks while
        over capacity. A block's expiry becomes `now_s` + the retention of this class (the class that last used it).
        """
        expiry = now_s + self.retention_of(traffic_class)
        self.expire(now_s)
        expiry_s, heap, finite = self._expiry_s, self._heap, math.isfinite(expiry)
        # Last block first, so the leading blocks end up most recently used and are evicted last.
        for block in reversed(block_hashes):
            if block in expiry_s:
                expiry_s.move_to_end(block)
            expiry_s[block] = expiry
            if finite:
                heapq.heappush(heap, (expiry, next(self._seq), block))
        while len(expiry_s) * self.bytes_per_block > self.capacity_bytes:
            expiry_s.popitem(last=False)
            self.evicted_blocks += 1
        self.peak_bytes = max(self.peak_bytes, self.stored_bytes)
        if len(heap) > 2 * len(expiry_s) + 1024:
            # Drop stale entries (refreshed or evicted blocks) so the heap stays within a constant of the live set.
            self._heap = [entry for entry in heap if expiry_s.get(entry[2]) == entry[0]]
            heapq.heapify(self._heap)


class WindowCache:
    """Sliding-window attention state in host memory, keyed by any hashable key (e.g. the hash of the prompt's last
    cached block), alive for `lifetime_s` after its last `store`.

    Entries are kept in store order, which is also expiry order (one lifetime, non-decreasing time), so expired ones
    are dropped from the front at every call: O(1) amortised, and `len()` is exact as of the latest `now_s`.
    """

    def __init__(self, lifetime_s: float) -> None:
        """Check and keep the lifetime; the cache starts empty.

        Args:
            lifetime_s: seconds an entry lives after its last store; math.inf: forever.
        """
        self.lifetime_s = _check_positive("lifetime_s", lifetime_s, finite=False)
        self._clock = _Clock()
        # _stored_s[key]: when key was last stored; oldest first.
        self._stored_s: OrderedDict[Hashable, float] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._stored_s)

    def _expire(self, now_s: float) -> float:
        now_s = self._clock.advance(now_s)
        stored_s = self._stored_s
        while stored_s:
            key, stored = next(iter(stored_s.items()))
            if now_s < stored + self.lifetime_s:
                break
            del stored_s[key]
        return now_s

    def lookup(self, now_s: float, key: Hashable) -> bool:
        """True if `key` was stored less than `lifetime_s` before `now_s` (`now_s < stored + lifetime_s`); counts a
        hit or a miss. Does not refresh the entry."""
        self._expire(now_s)
        found = key in self._stored_s
        if found:
            self.hits += 1
        else:
            self.misses += 1
        return found

    def store(self, now_s: float, key: Hashable) -> None:
        """Store (or refresh) `key` at `now_s`; it lives until `now_s + lifetime_s`."""
        now_s = self._expire(now_s)
        self._stored_s[key] = now_s
        self._stored_s.move_to_end(key)
