"""The event engine (SimPy): requests through a vision stage, prefill nodes with KV cache tiers, and decode EP units.

Stages, each a SimPy process:
- vision: `vision_cards` single-card encoders (a SimPy resource); a request with images queues for one;
- prefill: each instance of `prefill_instance_nodes` nodes (of the `prefill_nodes`) takes the waiting requests in
  arrival order into one batch of at most `max_prefill_batch_tokens` new tokens per node; at the batch's start each
  prompt looks up the persistent prefix tier (the leading blocks found are read from disk at `disk_read_gb_s`
  instead of computed) and, when part of it hit, the sliding-window state (per `window_design`); the batch takes
  the cost model's prefill time (at the instance's expert imbalance from the placement code, when it spans nodes)
  plus the disk reads, then its prompts' blocks are stored and the first tokens are out (time to first token);
- decode: each EP unit runs continuous batching: before every step it admits waiting sequences while the batch and
  its final KV fit (cards x per-card cap, HBM after weights), the step takes the cost model's time with the MoE
  imbalance of the replayed routing trace at that step, every sequence gains a token, finished ones leave.
The engine keeps its own counters; `run()` returns a `SimResult` and writes nothing.
"""

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim import speculative, stage_costs
from sim.config import SimConfig
from sim.engine.kv_cache import PrefixCache, WindowCache
from traces.request_trace import Request


@dataclass
class RequestRecord:
    """What happened to one request (times in simulated seconds; nan until reached)."""

    request: Request
    prefill_start_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    cached_tokens: int = 0
    window_hit: bool = False
    recomputed_tokens: int = 0
    decoder_flops: dict[str, float] = field(default_factory=dict)  # per window design, and "none" (no cache)


@dataclass
class StageUse:
    """Busy seconds and work of one stage."""

    busy_s: float = 0.0
    batches: int = 0
    tokens: int = 0


@dataclass
class SimResult:
    """Everything a report needs."""

    config: SimConfig
    records: list[RequestRecord]
    end_s: float
    vision: StageUse
    prefill: StageUse
    decode: StageUse
    decode_steps: int
    decode_imbalance_sum: float
    decode_moe_share_sum: float
    decode_batch_sum: int
    decode_kv_tokens_sum: int
    prefix_cache: PrefixCache
    window_cache: WindowCache
    timeline: dict[str, np.ndarray]  # per simulated second: output_tokens, input_tokens, disk_hit_tokens,
    # decode_steps and decode_imbalance (the sum of the steps' imbalance, over all units)
    prefill_imbalance_sum: float = 0.0  # over prefill batches


class Simulation:
    """One run of `config` over `requests`; `imbalance_T` [T] is the decode units' MoE imbalance per step."""

    def __init__(self, config: SimConfig, requests: list[Request], imbalance_T: np.ndarray) -> None:
        self.config, self.requests = config, requests
        self.imbalance_T = np.asarray(imbalance_T, dtype=float) if len(imbalance_T) else np.ones(1)
        self.env = simpy.Environment()
        cache = config.cache
        self.prefix_cache = PrefixCache(capacity_bytes=cache.disk_capacity_tb * 1e12,
                                        bytes_per_block=stage_costs.disk_bytes_per_block(config),
                                        retention_s=config.retention_s, block_tokens=cache.block_tokens)
        self.window_cache = WindowCache(lifetime_s=cache.window_lifetime_s)
        self.records = [RequestRecord(r) for r in requests]
        self.vision_cards = simpy.Resource(self.env, capacity=config.cluster.vision_cards)
        self.prefill_queue: deque[RequestRecord] = deque()
        self.prefill_instances = config.cluster.prefill_nodes // config.cluster.prefill_instance_nodes
        self.prefill_wake = [self.env.event() for _ in range(self.prefill_instances)]
        self.prefill_imbalance_sum = 0.0
        self.units = [_DecodeUnit(self, index) for index in range(config.cluster.decode_units)]
        self.use = {"vision": StageUse(), "prefill": StageUse(), "decode": StageUse()}
        horizon = int(config.duration_s * 4 + 3600)
        self.timeline = {name: np.zeros(horizon) for name in ("output_tokens", "input_tokens", "disk_hit_tokens",
                                                              "decode_steps", "decode_imbalance")}
        self.done = 0

    def run(self, progress: Callable[[float, float], None] | None = None) -> SimResult:
        """Simulate until every request finished (or 4 x duration + 1 h: later ones count as lost)."""
        env, config = self.env, self.config
        env.process(self._arrivals())
        for instance in range(self.prefill_instances):
            env.process(self._prefill_node(instance))
        for unit in self.units:
            env.process(unit.run())
        limit = len(self.timeline["output_tokens"])
        chunk = max(1.0, config.duration_s / 100)
        while env.now < limit and self.done < len(self.records):
            env.run(until=min(limit, env.now + chunk))
            if progress is not None:
                progress(env.now, config.duration_s)
        decode_steps = sum(unit.steps for unit in self.units)
        return SimResult(config, self.records, env.now, self.use["vision"], self.use["prefill"], self.use["decode"],
                         decode_steps, sum(u.imbalance_sum for u in self.units),
                         sum(u.moe_share_sum for u in self.units), sum(u.batch_sum for u in self.units),
                         sum(u.kv_tokens_sum for u in self.units), self.prefix_cache, self.window_cache,
                         self.timeline, self.prefill_imbalance_sum)

    # ----- arrivals and vision -----

    def _arrivals(self):
        now = 0.0
        for record in self.records:
            yield self.env.timeout(record.request.arrival_s - now)
            now = record.request.arrival_s
            self.env.process(self._vision_then_prefill(record))

    def _vision_then_prefill(self, record: RequestRecord):
        images = record.request.images
        if images:
            with self.vision_cards.request() as card:
                yield card
                seconds = stage_costs.vision_seconds(self.config, images)
                self.use["vision"].busy_s += seconds
                self.use["vision"].batches += 1
                yield self.env.timeout(seconds)
        self.prefill_queue.append(record)
        for wake in self.prefill_wake:
            if not wake.triggered:
                wake.succeed()

    # ----- prefill -----

    def _prefill_node(self, node: int):
        env, config = self.env, self.config
        while True:
            if not self.prefill_queue:
                self.prefill_wake[node] = env.event()
                yield self.prefill_wake[node]
                continue
            batch, new_tokens = [], 0
            while self.prefill_queue:
                record = self.prefill_queue[0]
                work = self._look_up_caches(record)
                if batch and new_tokens + work > config.cluster.max_prefill_batch_tokens * \
                        config.cluster.prefill_instance_nodes:
                    break
                self.prefill_queue.popleft()
                batch.append(record)
                new_tokens += work
            for record in batch:
                record.prefill_start_s = env.now
            seconds, imbalance = stage_costs.prefill_batch_seconds(config, batch)
            self.prefill_imbalance_sum += imbalance
            self.use["prefill"].busy_s += seconds
            self.use["prefill"].batches += 1
            self.use["prefill"].tokens += sum(r.request.input_tokens for r in batch)
            yield env.timeout(seconds)
            second = min(int(env.now), len(self.timeline["input_tokens"]) - 1)
            for record in batch:
                request = record.request
                self.prefix_cache.insert(env.now, request.block_hashes, request.traffic_class)
                full = request.input_tokens // config.cache.block_tokens
                if full:
                    self.window_cache.store(env.now, request.block_hashes[full - 1])
                record.first_token_s = env.now
                self.timeline["output_tokens"][second] += 1  # the first token comes out of prefill
                self.timeline["input_tokens"][second] += request.input_tokens
                self.timeline["disk_hit_tokens"][second] += record.cached_tokens
                if request.output_tokens <= 1:
                    record.finish_s = env.now
                    self.done += 1
                else:
                    min(self.units, key=lambda unit: unit.load).admit(record)

    def _look_up_caches(self, record: RequestRecord) -> int:
        """Fill the record's cache outcome (once) and return the tokens its prefill computes."""
        if record.decoder_flops:
            return record.request.input_tokens - record.cached_tokens + record.recomputed_tokens
        config, request = self.config, record.request
        blocks = self.prefix_cache.lookup(self.env.now, request.block_hashes, request.traffic_class,
                                          input_tokens=request.input_tokens)
        cached = min(blocks * config.cache.block_tokens, request.input_tokens - 1)
        record.cached_tokens = max(0, cached)
        if record.cached_tokens and config.cache.window_design == "memory":
            record.window_hit = self.window_cache.lookup(self.env.now, request.block_hashes[blocks - 1])
            if not record.window_hit:
                record.recomputed_tokens = min(config.cache.window_recompute_tokens, record.cached_tokens)
        record.decoder_flops = stage_costs.decoder_flops_by_design(config, request.input_tokens, record.cached_tokens,
                                                             record.window_hit)
        if config.cache.window_design == "recompute":
            record.recomputed_tokens = stage_costs.recompute_equivalent_tokens(config, record.cached_tokens)
        return request.input_tokens - record.cached_tokens + record.recomputed_tokens


class _DecodeUnit:
    """One decode EP unit with continuous batching.

    Under speculative decoding (`config.speculative.enabled`) each step yields `tau` tokens per sequence on average
    (1 + accepted draft tokens, from `sim.speculative` for the configured policy, once per run from the config's
    seed) and costs the target's pass over 1 + mean verified tokens plus the draft's passes; a sequence leaves
    after ceil((output_tokens - 1) / tau) steps, and its last step yields only what it still needed.
    """

    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim, self.index = sim, index
        config = sim.config
        self.cards = config.cluster.decode_cards
        self.max_batch = config.cluster.max_decode_batch_per_card * self.cards
        self.kv_capacity_tokens = stage_costs.decode_kv_capacity_tokens(config)
        self.waiting: deque[RequestRecord] = deque()
        self.active: list[tuple[int, int, int, RequestRecord]] = []  # (finish step, seq, final context, record)
        self.kv_tokens = 0  # context tokens of the batch now (fractional under speculative decoding)
        self.reserved_tokens = 0  # final contexts of the batch (admission keeps them within HBM)
        self.steps = 0
        self.imbalance_sum = 0.0
        self.moe_share_sum = 0.0
        self.batch_sum = 0
        self.kv_tokens_sum = 0
        self.wake = sim.env.event()
        self.sequence = itertools.count()
        spec = config.speculative
        self.speculation = speculative.expected_step(spec, config.seed) if spec.enabled else None
        self.token_carry = 0.0  # speculative tokens produced but not yet counted in the (integer) decode tokens

    @property
    def load(self) -> int:
        return len(self.active) + len(self.waiting)

    def admit(self, record: RequestRecord) -> None:
        self.waiting.append(record)
        if not self.wake.triggered:
            self.wake.succeed()

    def run(self):
        sim, env = self.sim, self.sim.env
        timeline = sim.timeline["output_tokens"]
        while True:
            while self.waiting and len(self.active) < self.max_batch:
                record = self.waiting[0]
                final = record.request.input_tokens + record.request.output_tokens
                if self.active and self.reserved_tokens + final > self.kv_capacity_tokens:
                    break
                self.waiting.popleft()
                heapq.heappush(self.active, (self.steps + self._steps_for(record), next(self.sequence), final,
                                             record))
                self.kv_tokens += record.request.input_tokens + 1
                self.reserved_tokens += final
            if not self.active:
                self.wake = env.event()
                yield self.wake
                continue
            imbalance = float(sim.imbalance_T[self.steps % len(sim.imbalance_T)])
            batch = len(self.active)
            if self.speculation is None:
                seconds, moe_share = stage_costs.decode_step(sim.config, batch, self.kv_tokens, imbalance)
                sim.use["decode"].tokens += batch
            else:
                seconds, moe_share = stage_costs.speculative_decode_step(sim.config, self.speculation, batch,
                                                                   self.kv_tokens, imbalance)
            sim.use["decode"].busy_s += seconds
            sim.use["decode"].batches += 1
            yield env.timeout(seconds)
            self.steps += 1
            self.imbalance_sum += imbalance
            self.moe_share_sum += moe_share
            self.batch_sum += batch
            self.kv_tokens_sum += self.kv_tokens
            finished = []
            while self.active and self.active[0][0] <= self.steps:
                finished.append(heapq.heappop(self.active)[2:])
            produced = batch if self.speculation is None else self._speculative_tokens(batch, finished)
            second = min(int(env.now), len(timeline) - 1)
            timeline[second] += produced
            sim.timeline["decode_steps"][second] += 1
            sim.timeline["decode_imbalance"][second] += imbalance
            self.kv_tokens += produced
            for final, record in finished:
                record.finish_s = env.now
                self.kv_tokens -= final
                self.reserved_tokens -= final
                sim.done += 1

    def _steps_for(self, record: RequestRecord) -> int:
        """Decode steps the record's sequence takes (its first token came out of prefill)."""
        if self.speculation is None:
            return record.request.output_tokens - 1
        return speculative.steps_to_finish(record.request.output_tokens, self.speculation.tokens_per_step)

    def _speculative_tokens(self, batch: int, finished: list[tuple[int, RequestRecord]]) -> float:
        """Tokens a speculative step produced: tau per sequence, less what the finishing ones did not need; counts
        them into the decode stage's tokens (whole tokens, the fraction carried to the next step)."""
        tau = self.speculation.tokens_per_step
        produced = batch * tau
        for _, record in finished:
            needed = record.request.output_tokens - 1
            produced -= speculative.steps_to_finish(record.request.output_tokens, tau) * tau - needed
        self.token_carry += produced
        whole = math.floor(self.token_carry + 1e-6)
        self.token_carry -= whole
        self.sim.use["decode"].tokens += whole
        return produced
