"""Which decode layout to deploy: EP size and redundant experts, from a user's routing trace, model, card and latency
target (`eplb advise`).

Every redundant expert is a whole expert's weights in every MoE layer on some card: memory taken from the KV cache,
so from the decode batch. More redundancy lowers the expert imbalance, costs batch, and at some point loses
throughput; the EP size moves both again. For each candidate layout (`cards` x `slots_per_card`, the redundant
experts `cards x slots_per_card - E`) the adviser runs the simulator's capacity mode (`sim.capacity.decode_capacity`,
what `eplb sim --capacity` runs) on a config whose `balance.routing_trace` is the user's trace, so that:

- the imbalance is held-out: the trace replayed at the candidate's shape with the chosen policy refitted every
  `refit_every` steps on the last `window` (cpsat with the live router, and DeepSeek's greedy with the static equal
  split beside it), its steps pooled or thinned to the candidate's tokens per card (`sim.engine.load_imbalance`);
- the decode batch is the largest that fits the card's memory after the weights and meets the TPOT target;
- the memory per card is accounted: replicated weights (attention, dense part, embedding, head), expert slots, the
  batch's KV cache and the reserve for activations and buffers, the rest free.

Rows are ranked by decode tokens/s per card (the cost of a token, at a price per card-hour); a layout whose weights do
not fit is a row marked so. Where asked, prefill instances are advised the same way: each size in nodes and redundant
experts at the TTFT target (`sim.capacity.prefill_capacity`; their imbalance from the simulator's request-level
prefill traffic, the trace being decode's). What the advice rests on: the trace stands for the traffic to come, and
the simulator's step model and its stated limits (docs/simulator.md).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from sim.capacity import decode_capacity, prefill_capacity
from sim.config import SimConfig
from sim.cost_model import RESERVED_FRACTION
from sim.hardware import PROFILES

POLICIES = ("cpsat", "deepseek")  # the chosen policy (live router) and the greedy beside it (static split)
BINDINGS = {"tpot_slo": "TPOT", "kv_cache": "memory", "max_decode_batch_per_card": "batch cap", "weights": "weights"}


@dataclass(frozen=True)
class AdviceSettings:
    """What the adviser searches and how it judges.

    Attributes:
        base: the simulator config every candidate is built from: its model, `hardware.decode` card,
            `capacity.tpot_slo_ms` and `capacity.decode_context_tokens`, `speculative`, `balance` (routing_trace, the
            user's trace; refit_every, window, work_limit, trace_layers) and `cluster.max_decode_batch_per_card`.
        ep_sizes: the EP sizes (cards of a decode unit) to try.
        slots_per_card: the expert slots per card to try; a pair is a candidate when it holds every expert once and
            at most `max_redundant` more.
        max_redundant: the most redundant experts a candidate may have.
        redundant: the redundant expert counts to try, or None: any count the other choices allow.
        load_tokens_per_s: decode output tokens/s the deployment must serve (cards needed), or None.
        price_per_card_hour: USD a card-hour (cost per million output tokens), or None: the card's profile price.
        prefill_nodes: prefill instance sizes in nodes to try (none: no prefill advice); each with every count of
            `prefill_redundant`, at the base's `capacity.ttft_slo_s`, `prompt_tokens` and `cached_share`.
    """

    base: SimConfig
    ep_sizes: tuple[int, ...]
    slots_per_card: tuple[int, ...]
    max_redundant: int
    redundant: tuple[int, ...] | None = None
    load_tokens_per_s: float | None = None
    price_per_card_hour: float | None = None
    prefill_nodes: tuple[int, ...] = ()
    prefill_redundant: tuple[int, ...] = (0, 32)


def candidates(settings: AdviceSettings) -> list[tuple[int, int]]:
    """(cards, slots per card) of every candidate, by EP size then slots: every expert once, and 0 to
    `max_redundant` redundant ones (of the `redundant` counts, when given)."""
    experts = settings.base.model.num_routed_experts
    wanted = None if settings.redundant is None else set(settings.redundant)
    return [(cards, slots) for cards in sorted(set(settings.ep_sizes)) for slots in sorted(set(settings.slots_per_card))
            if 0 <= cards * slots - experts <= settings.max_redundant
            and (wanted is None or cards * slots - experts in wanted)]


def candidate_config(settings: AdviceSettings, cards: int, slots: int, policy: str) -> SimConfig:
    """The simulator config of one candidate under `policy` ("cpsat": the live router; "deepseek": the static equal
    split vLLM, SGLang and DeepSeek's reference dispatch with): what `eplb sim --capacity` runs for its row."""
    base = settings.base
    balance = base.balance.model_copy(update={"policy": policy, "slots_per_card": slots,
                                              "routing": "live" if policy == "cpsat" else "static"})
    return base.model_copy(update={"cluster": base.cluster.model_copy(update={"decode_cards": cards}),
                                   "balance": balance})


def memory_per_card(config: SimConfig, batch_per_card: float) -> dict:
    """GB (1e9 bytes) of one decode card's HBM: `replicated` weights, `experts` (its slots), `kv` (the batch's caches
    at the context), `reserved` (activations and buffers), `free` (the rest) and `hbm`; the first five add up to
    `hbm`."""
    model, hbm = config.model, PROFILES[config.hardware.decode].hbm_gb * 1e9
    parts = {"replicated": model.replicated_weight_bytes(),
             "experts": config.decode_slots_per_card * model.expert_weight_bytes(),
             "kv": batch_per_card * model.kv_bytes(config.capacity.decode_context_tokens),
             "reserved": hbm * RESERVED_FRACTION}
    parts["free"] = hbm - sum(parts.values())
    return {name: value / 1e9 for name, value in {**parts, "hbm": hbm}.items()}


def evaluate(settings: AdviceSettings, cards: int, slots: int) -> dict:
    """One candidate's row: its shape, each policy's decode capacity (`decode_capacity`: tokens/s per card, batch,
    step, TPOT, imbalance, what binds), the memory per card at the chosen policy's batch, and, where asked, the cards
    a stated load needs and the cost of a million output tokens."""
    experts = settings.base.model.num_routed_experts
    row = {"cards": cards, "slots_per_card": slots, "redundant_experts": cards * slots - experts}
    for policy in POLICIES:
        config = candidate_config(settings, cards, slots, policy)
        try:
            report = decode_capacity(config)
        except ValueError as exc:  # the weights alone do not fit a card: a row marked so
            if "holds no sequence" not in str(exc):
                raise
            report = {"tokens_per_s_per_card": 0.0, "batch_per_card": 0.0, "step_ms": None, "tpot_ms": None,
                      "imbalance": None, "binding": "weights"}
        row[policy] = {key: report[key] for key in ("tokens_per_s_per_card", "batch_per_card", "step_ms", "tpot_ms",
                                                    "imbalance")}
        row[policy]["bound_by"] = BINDINGS[report["binding"]] if report["tokens_per_s_per_card"] or \
            report["binding"] == "weights" else "TPOT"
    chosen = row[POLICIES[0]]
    config = candidate_config(settings, cards, slots, POLICIES[0])
    row["memory_gb"] = memory_per_card(config, chosen["batch_per_card"])
    rate = chosen["tokens_per_s_per_card"]
    price = settings.price_per_card_hour
    if price is None:
        price = PROFILES[config.hardware.decode].price_per_hour_usd
    row["usd_per_million_tokens"] = price * 1e6 / (rate * 3600) if price is not None and rate > 0 else None
    row["cards_needed"] = None
    if settings.load_tokens_per_s is not None and rate > 0:
        row["cards_needed"] = cards * math.ceil(settings.load_tokens_per_s / (rate * cards))
    return row


def advise(settings: AdviceSettings, progress: Callable[[int, int], None] | None = None) -> dict:
    """Every candidate's row, ranked by the chosen policy's decode tokens/s per card (rows whose weights do not fit
    last), and the recommendation (the first row; None when no candidate fits). `progress(done, total)` is called
    after each candidate."""
    shapes = candidates(settings)
    rows = []
    for done, (cards, slots) in enumerate(shapes, 1):
        rows.append(evaluate(settings, cards, slots))
        if progress is not None:
            progress(done, len(shapes))
    rows.sort(key=lambda row: (-row[POLICIES[0]]["tokens_per_s_per_card"], row["cards"], row["slots_per_card"]))
    best = rows[0] if rows and rows[0][POLICIES[0]]["tokens_per_s_per_card"] > 0 else None
    result = {"rows": rows, "recommended": best}
    if settings.prefill_nodes:
        prefill = advise_prefill(settings)
        result["prefill_rows"] = prefill
        result["prefill_recommended"] = prefill[0] if prefill[0]["tokens_per_s_per_card"] > 0 else None
    return result


def prefill_config(settings: AdviceSettings, nodes: int, redundant: int) -> SimConfig:
    """The simulator config of one prefill candidate: an instance of `nodes` nodes with `redundant` redundant
    experts, cpsat with the live router (what `eplb sim --capacity` runs for its prefill row)."""
    base = settings.base
    return base.model_copy(update={
        "capacity": base.capacity.model_copy(update={"prefill_instance_nodes": nodes,
                                                     "prefill_redundant_experts": redundant}),
        "balance": base.balance.model_copy(update={"policy": "cpsat", "routing": "live"})})


def evaluate_prefill(settings: AdviceSettings, nodes: int, redundant: int) -> dict:
    """One prefill candidate's row: prompt tokens/s per card within the TTFT target (`prefill_capacity`), the batch,
    the imbalance, what binds (TTFT, the batch cap, or weights that do not fit: the experts of the instance spread
    over its cards beside the replicated weights and the reserve), and the memory that leaves."""
    config = prefill_config(settings, nodes, redundant)
    model, hardware = config.model, PROFILES[config.hardware.prefill]
    cards = nodes * config.cluster.cards_per_node
    slots = math.ceil((model.num_routed_experts + redundant) / cards)
    free = hardware.hbm_gb * 1e9 * (1 - RESERVED_FRACTION) - model.replicated_weight_bytes() \
        - slots * model.expert_weight_bytes()
    row = {"cards": cards, "nodes": nodes, "redundant_experts": redundant, "slots_per_card": slots,
           "free_gb": free / 1e9}
    if free <= 0:
        return {**row, "tokens_per_s_per_card": 0.0, "prompts_per_batch": 0, "batch_s": None, "imbalance": None,
                "bound_by": "weights"}
    report = prefill_capacity(config)
    return {**row, **{key: report[key] for key in ("tokens_per_s_per_card", "prompts_per_batch", "batch_s",
                                                   "imbalance")},
            "bound_by": {"ttft_slo": "TTFT", "max_prefill_batch_tokens": "batch cap"}[report["binding"]]}


def advise_prefill(settings: AdviceSettings) -> list[dict]:
    """Every prefill candidate's row, ranked by prompt tokens/s per card (rows whose weights do not fit last)."""
    rows = [evaluate_prefill(settings, nodes, redundant) for nodes in sorted(set(settings.prefill_nodes))
            for redundant in sorted(set(settings.prefill_redundant))]
    return sorted(rows, key=lambda row: (-row["tokens_per_s_per_card"], row["cards"], row["redundant_experts"]))


def engine_settings(row: dict, experts: int) -> dict:
    """How each engine deploys `row`'s layout: vLLM's flags (this project's policy through its plugin), SGLang's
    and TensorRT-LLM's, their placement files from `eplb place` on the same trace (`--sglang-out`, `--trtllm-out`;
    the layer flags a trace that is not the engine's own dump needs: DeepSeek-V3's 61 layers, 3 dense)."""
    cards, slots, redundant = row["cards"], row["slots_per_card"], row["redundant_experts"]
    place = f"eplb place --trace TRACE --gpus {cards} --slots-per-gpu {slots}"
    return {
        "vllm": f"EPLB_VLLM_POLICY=cpsat vllm serve MODEL --data-parallel-size {cards} --enable-expert-parallel "
                f"--enable-eplb --eplb-config '{{\"num_redundant_experts\": {redundant}}}'",
        "sglang": f"--ep-size {cards} --enable-eplb --ep-num-redundant-experts {redundant} --init-expert-location "
                  f"sglang.json, from: {place} --sglang-out sglang.json [--sglang-num-layers 61 "
                  f"--sglang-first-moe-layer 3]",
        "tensorrt_llm": f"moe_config.load_balancer: moe_load_balancer.yaml (num_slots {cards * slots} = {experts} "
                        f"experts + {redundant}), from: {place} --trtllm-out moe_load_balancer.yaml "
                        f"[--trtllm-layers 3-60]",
    }
