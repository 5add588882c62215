"""Which decode layout to deploy: EP size and redundant experts, from a user's routing trace, model, card and latency
target (`eplb advise`).

Every redundant expert is a whole expert's weights in every MoE layer on some card: memory taken from the KV cache,
so from the decode batch. More redundancy lowers the expert imbalance, costs batch, and at some point loses
throughput; the EP size moves both again. Node limits (every expert group on one node, DeepSeek's hierarchical rule,
which vLLM and SGLang apply by themselves where the groups are a multiple of the nodes) cost balance and, in prefill,
save the network: a token crosses to fewer nodes. For each candidate layout (`cards` x `slots_per_card`, the
redundant experts `cards x slots_per_card - E`, with or without node limits) the adviser runs the simulator's
capacity mode (`sim.capacity.decode_capacity`, what `eplb sim --capacity` runs) on a config whose
`balance.routing_trace` is the user's trace, so that:

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
from sim.advice_range import MAX_SCREENED
from sim.config import SimConfig, node_limit_problem
from sim.scenarios import TrafficCase, spread
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
        prefill_redundant: the redundant expert counts of a prefill instance to try.
        node_limits: whether to try layouts without node limits (False) and with them (True), decode and prefill;
            with them only where the layout is whole nodes whose count divides the model's expert groups.
        current: the layout serving now, (cards, slots per card, node limits), or None: its row, the pick's gain
            over it and the break-even (`sim.advice_range`).
        cases: the traffic cases (`sim.scenarios`) the pick and the layouts close to it are rerun over: their
            ranges and the ties they leave; none: the central figures alone.
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
    node_limits: tuple[bool, ...] = (False, True)
    current: tuple[int, int, bool] | None = None
    cases: tuple[TrafficCase, ...] = ()


MIN_SCORED_WINDOWS = 2  # a row answers only if its replay scored at least this many fit windows of steps


def node_limits_fit(settings: AdviceSettings, cards: int) -> bool:
    """Whether node limits mean something on `cards` cards: more than one node, each able to keep whole expert
    groups (`node_limit_problem`). On one node they limit nothing."""
    base = settings.base
    per_node = base.cluster.cards_per_node
    return cards > per_node and node_limit_problem(base.model, cards, per_node) is None


def candidates(settings: AdviceSettings) -> list[tuple[int, int, bool]]:
    """(cards, slots per card, node limits) of every candidate, by EP size, slots, then node limits: every expert
    once, and 0 to `max_redundant` redundant ones (of the `redundant` counts, when given); with node limits only
    where they fit the layout (`node_limits_fit`)."""
    experts = settings.base.model.num_routed_experts
    wanted = None if settings.redundant is None else set(settings.redundant)
    return [(cards, slots, limited) for cards in sorted(set(settings.ep_sizes))
            for slots in sorted(set(settings.slots_per_card)) for limited in sorted(set(settings.node_limits))
            if 0 <= cards * slots - experts <= settings.max_redundant
            and (wanted is None or cards * slots - experts in wanted)
            and (not limited or node_limits_fit(settings, cards))]


def candidate_config(settings: AdviceSettings, cards: int, slots: int, policy: str,
                     node_limits: bool = False) -> SimConfig:
    """The simulator config of one candidate under `policy` ("cpsat": the live router; "deepseek": the static equal
    split vLLM, SGLang and DeepSeek's reference dispatch with), with or without `node_limits`: what `eplb sim
    --capacity` runs for its row."""
    base = settings.base
    balance = base.balance.model_copy(update={"policy": policy, "slots_per_card": slots, "node_limits": node_limits,
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


def evaluate(settings: AdviceSettings, cards: int, slots: int, node_limits: bool = False) -> dict:
    """One candidate's row: its shape, each policy's decode capacity (`decode_capacity`: tokens/s per card, batch,
    step, TPOT, imbalance, what binds), the memory per card at the chosen policy's batch, and, where asked, the cards
    a stated load needs and the cost of a million output tokens."""
    experts = settings.base.model.num_routed_experts
    row = {"cards": cards, "slots_per_card": slots, "redundant_experts": cards * slots - experts,
           "node_limits": node_limits}
    for policy in POLICIES:
        config = candidate_config(settings, cards, slots, policy, node_limits)
        try:
            report = decode_capacity(config)
        except ValueError as exc:  # the weights alone do not fit a card: a row marked so
            if "holds no sequence" not in str(exc):
                raise
            report = {"tokens_per_s_per_card": 0.0, "batch_per_card": 0.0, "step_ms": None, "tpot_ms": None,
                      "imbalance": None, "binding": "weights"}
        row[policy] = {key: report.get(key) for key in ("tokens_per_s_per_card", "batch_per_card", "step_ms",
                                                        "tpot_ms", "imbalance", "noise_floor", "basis",
                                                        "micro_batch_tokens_per_card")}
        row[policy]["bound_by"] = BINDINGS[report["binding"]] if report["tokens_per_s_per_card"] or \
            report["binding"] == "weights" else "TPOT"
    row.update(answerable(settings, row[POLICIES[0]]["basis"]))
    chosen = row[POLICIES[0]]
    config = candidate_config(settings, cards, slots, POLICIES[0], node_limits)
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


def answerable(settings: AdviceSettings, basis: dict | None) -> dict:
    """{"answerable", "why"}: whether a row's replay (`basis`: the decode curve's steps, window, refits and scored
    steps at its top load) scored at least `MIN_SCORED_WINDOWS` windows of `balance.window` steps; a row whose
    weights do not fit (no basis) answers (it serves nothing)."""
    needed = MIN_SCORED_WINDOWS * settings.base.balance.window
    if basis is None or basis["scored_steps"] >= needed:
        return {"answerable": True, "why": None}
    return {"answerable": False,
            "why": f"its replay scored {basis['scored_steps']} steps ({basis['steps']} pooled steps, a window of "
                   f"{basis['window']}, {basis['refits']} refits), fewer than {needed} ({MIN_SCORED_WINDOWS} windows "
                   f"of {settings.base.balance.window})"}


def advise(settings: AdviceSettings, progress: Callable[[int, int], None] | None = None) -> dict:
    """Every candidate's row, ranked by the chosen policy's decode tokens/s per card (rows whose weights do not fit
    last), the recommendation (the first answerable row: `answerable`; None when no candidate serves), vLLM's
    (`best_for_vllm`), the rows left unanswered, and with `settings.current` and `settings.cases` what
    `sim.advice_range` adds (the current layout's row, ranges, ties, the gain over the current layout and the
    break-even). `progress(done, total)` is called after each candidate, decode's then prefill's, then each rerun
    over a case."""
    shapes = candidates(settings)
    instances = prefill_candidates(settings) if settings.prefill_nodes else []
    screen = (1 + MAX_SCREENED + (settings.current is not None)) * len(settings.cases)
    total = len(shapes) + len(instances) + screen
    rows = []
    for done, (cards, slots, limited) in enumerate(shapes, 1):
        rows.append(evaluate(settings, cards, slots, limited))
        if progress is not None:
            progress(done, total)
    rows.sort(key=lambda row: (-row[POLICIES[0]]["tokens_per_s_per_card"], row["cards"], row["slots_per_card"],
                               row["node_limits"]))
    best = next((row for row in rows if row["answerable"]), None)
    if best is not None and best[POLICIES[0]]["tokens_per_s_per_card"] <= 0:
        best = None
    if best is not None:
        best.update(readings(settings, best))
    result = {"rows": rows, "recommended": best,
              "vllm_recommended": best_for_vllm(rows, settings.base.model.expert_groups,
                                                settings.base.cluster.cards_per_node),
              "unanswered": [{**{key: row[key] for key in ("cards", "slots_per_card", "node_limits", "why")},
                              "scored_steps": row[POLICIES[0]]["basis"]["scored_steps"]}
                             for row in rows if not row["answerable"]],
              "min_scored_steps": MIN_SCORED_WINDOWS * settings.base.balance.window}
    done = len(shapes)
    if settings.prefill_nodes:
        prefill = advise_prefill(settings, None if progress is None else
                                 lambda step, _: progress(len(shapes) + step, total))
        result["prefill_rows"] = prefill
        result["prefill_recommended"] = prefill[0] if prefill and prefill[0]["tokens_per_s_per_card"] > 0 else None
        done += len(instances)
    ticks = [done]

    def tick() -> None:
        ticks[0] += 1
        if progress is not None:
            progress(ticks[0], total)

    result.update(know(settings, rows, best, tick))
    return result


def readings(settings: AdviceSettings, row: dict) -> dict:
    """{"metrics", "yardsticks"}: the row's decode imbalance read every way (`sim.imbalance_readings`: per card, per
    node, over windows of steps, per routing group) at its micro-batch load under the chosen policy, and its
    yardsticks (noise floor, granularity bound, in-batch bound; the trace carries no expected load, so no oracle)."""
    from sim.imbalance_readings import read_decode_unit

    config = candidate_config(settings, row["cards"], row["slots_per_card"], POLICIES[0], row["node_limits"])
    found = read_decode_unit(config, row[POLICIES[0]]["micro_batch_tokens_per_card"])
    return {"metrics": found.metrics, "yardsticks": found.yardsticks}


def know(settings: AdviceSettings, rows: list[dict], best: dict | None, tick: Callable[[], None]) -> dict:
    """What `sim.advice_range` adds to the ranked rows: `current` (the current layout's row, evaluated if the search
    did not hold it), `break_even_imbalance`, and over `settings.cases` each close row's `range`, the `ties` and the
    pick's `gain_over_current` (a range)."""
    from sim.advice_range import break_even, case_rates, gain_range, screened, ties

    policy = POLICIES[0]
    found: dict = {"current": None, "break_even_imbalance": None, "ties": [], "gain_over_current": None}
    current = None
    if settings.current is not None:
        cards, slots, limited = settings.current
        current = next((row for row in rows if (row["cards"], row["slots_per_card"], row["node_limits"])
                        == (cards, slots, limited)), None) or evaluate(settings, cards, slots, limited)
        found["current"] = current
        if current[policy]["tokens_per_s_per_card"] > 0 and "metrics" not in current:
            current.update(readings(settings, current))
        if best is not None and current[policy]["tokens_per_s_per_card"] > 0:
            found["gain_over_current"] = {"central": best[policy]["tokens_per_s_per_card"]
                                          / current[policy]["tokens_per_s_per_card"] - 1.0}
            found["break_even_imbalance"] = break_even(candidate_config(settings, cards, slots, policy, limited),
                                                       current, best[policy]["tokens_per_s_per_card"], policy)
    if best is None or not settings.cases:
        return found
    close = screened(rows, best, policy)
    reread = close + ([current] if current is not None and current not in close else [])

    def config_of(row: dict) -> SimConfig:
        return candidate_config(settings, row["cards"], row["slots_per_card"], policy, row["node_limits"])

    rates = case_rates(config_of, reread, list(settings.cases), tick)
    for row, row_rates in zip(reread, rates):
        row["range"] = {"tokens_per_s_per_card": spread(row[policy]["tokens_per_s_per_card"], row_rates),
                        "cases": [{"case": case.label, "tokens_per_s_per_card": rate}
                                  for case, rate in zip(settings.cases, row_rates)]}
    found["ties"] = ties(close, rates[:len(close)], policy)
    if current is not None and current[policy]["tokens_per_s_per_card"] > 0:
        found["gain_over_current"] = gain_range(best, current, rates[0], rates[-1] if current not in close else
                                                rates[close.index(current)], policy)
    return found


def vllm_node_limits(cards: int, groups: int, cards_per_node: int) -> bool:
    """Whether vLLM places `cards` cards under node limits: its policy is hierarchical (every group on one node)
    wherever the model's `groups` are a multiple of the nodes; over whole nodes, and on one node that limits
    nothing."""
    nodes = cards // cards_per_node
    return cards % cards_per_node == 0 and nodes > 1 and groups % nodes == 0


def best_for_vllm(rows: list[dict], groups: int, cards_per_node: int) -> dict | None:
    """The best of the ranked `rows` that vLLM can run: its node limits those vLLM's own rule gives its size
    (`vllm_node_limits`); None when no such row serves a sequence."""
    return next((row for row in rows if row[POLICIES[0]]["tokens_per_s_per_card"] > 0
                 and row["node_limits"] == vllm_node_limits(row["cards"], groups, cards_per_node)), None)


def prefill_config(settings: AdviceSettings, nodes: int, redundant: int, node_limits: bool = False) -> SimConfig:
    """The simulator config of one prefill candidate: an instance of `nodes` nodes with `redundant` redundant
    experts, with or without `node_limits`, cpsat with the live router (what `eplb sim --capacity` runs for its
    prefill row)."""
    base = settings.base
    return base.model_copy(update={
        "capacity": base.capacity.model_copy(update={"prefill_instance_nodes": nodes,
                                                     "prefill_redundant_experts": redundant,
                                                     "prefill_node_limits": node_limits}),
        "balance": base.balance.model_copy(update={"policy": "cpsat", "routing": "live"})})


def evaluate_prefill(settings: AdviceSettings, nodes: int, redundant: int, node_limits: bool = False) -> dict:
    """One prefill candidate's row: prompt tokens/s per card within the TTFT target (`prefill_capacity`), the batch,
    the imbalance, what binds (TTFT, the batch cap, or weights that do not fit: the experts of the instance spread
    over its cards beside the replicated weights and the reserve), and the memory that leaves."""
    config = prefill_config(settings, nodes, redundant, node_limits)
    model, hardware = config.model, PROFILES[config.hardware.prefill]
    cards = nodes * config.cluster.cards_per_node
    slots = math.ceil((model.num_routed_experts + redundant) / cards)
    free = hardware.hbm_gb * 1e9 * (1 - RESERVED_FRACTION) - model.replicated_weight_bytes() \
        - slots * model.expert_weight_bytes()
    row = {"cards": cards, "nodes": nodes, "redundant_experts": redundant, "slots_per_card": slots,
           "node_limits": node_limits, "free_gb": free / 1e9}
    if free <= 0:
        return {**row, "tokens_per_s_per_card": 0.0, "prompts_per_batch": 0, "batch_s": None, "imbalance": None,
                "bound_by": "weights"}
    report = prefill_capacity(config)
    return {**row, **{key: report[key] for key in ("tokens_per_s_per_card", "prompts_per_batch", "batch_s",
                                                   "imbalance")},
            "bound_by": {"ttft_slo": "TTFT", "max_prefill_batch_tokens": "batch cap"}[report["binding"]]}


def prefill_candidates(settings: AdviceSettings) -> list[tuple[int, int, bool]]:
    """(nodes, redundant experts, node limits) of every prefill candidate; with node limits where they fit an
    instance of several nodes (on one node they limit nothing)."""
    per_node = settings.base.cluster.cards_per_node
    return [(nodes, redundant, limited) for nodes in sorted(set(settings.prefill_nodes))
            for redundant in sorted(set(settings.prefill_redundant)) for limited in sorted(set(settings.node_limits))
            if not limited or node_limits_fit(settings, nodes * per_node)]


def advise_prefill(settings: AdviceSettings, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Every prefill candidate's row (`prefill_candidates`), ranked by prompt tokens/s per card (rows whose weights
    do not fit last). `progress(done, total)` is called after each."""
    instances = prefill_candidates(settings)
    rows = []
    for done, (nodes, redundant, limited) in enumerate(instances, 1):
        rows.append(evaluate_prefill(settings, nodes, redundant, limited))
        if progress is not None:
            progress(done, len(instances))
    return sorted(rows, key=lambda row: (-row["tokens_per_s_per_card"], row["cards"], row["redundant_experts"],
                                         row["node_limits"]))


def engine_settings(row: dict, experts: int, groups: int | None = None, cards_per_node: int = 8,
                    vllm_row: dict | None = None, model_layers: tuple[int, int] = (61, 3), mtp: bool = False) -> dict:
    """How each engine deploys `row`'s layout: vLLM's flags (this project's policy through its plugin), SGLang's
    and TensorRT-LLM's, their placement files from `eplb place` on the same trace (`--sglang-out`, `--trtllm-out`;
    the layer flags a trace that is not the engine's own dump needs: `model_layers`, the model's decoder layers and
    its leading dense ones, DeepSeek-V3's 61 and 3 by default; with `mtp` TensorRT-LLM's file also keys the MTP
    layer, which it looks up). Node limits
    for a model of `groups` expert groups on nodes of `cards_per_node`: SGLang's `--eplb-algorithm` says which;
    vLLM applies them by itself (`vllm_node_limits`), so where `row` has none and vLLM's rule gives them its line is
    for `vllm_row` (`best_for_vllm`), saying why, or, with none, says what vLLM will run. (A row with node limits
    always has vLLM's: `node_limits_fit` asks all that vLLM's rule does.)"""
    cards, slots, redundant = row["cards"], row["slots_per_card"], row["redundant_experts"]
    limited = row.get("node_limits", False)
    place = f"eplb place --trace TRACE --gpus {cards} --slots-per-gpu {slots}"
    if limited:
        place += f" --groups {groups} --nodes-per-group 1"
    vllm = _vllm_line(row)
    if groups is not None and not limited and vllm_node_limits(cards, groups, cards_per_node):
        rule = (f"vLLM keeps each of the {groups} expert groups on one node at {cards // cards_per_node} nodes "
                f"whatever the policy, so this layout runs there as its row with node limits")
        if vllm_row is not None and vllm_row is not row:
            vllm = (f"{_vllm_line(vllm_row)} ({rule}; vLLM's best is {vllm_row['cards']} GPUs x "
                    f"{vllm_row['slots_per_card']} slots{' with node limits' if vllm_row['node_limits'] else ''}, "
                    f"{vllm_row['cpsat']['tokens_per_s_per_card']:,.0f} tokens/s per GPU)")
        else:
            vllm += f" ({rule})"
    return {
        "vllm": vllm,
        "sglang": f"--ep-size {cards} --enable-eplb --ep-num-redundant-experts {redundant} --eplb-algorithm "
                  f"{'deepseek_hierarchical' if limited else 'deepseek'} --init-expert-location sglang.json, from: "
                  f"{place} --sglang-out sglang.json [--sglang-num-layers {model_layers[0]} --sglang-first-moe-layer "
                  f"{model_layers[1]}]",
        "tensorrt_llm": f"moe_config.load_balancer: moe_load_balancer.yaml (num_slots {cards * slots} = {experts} "
                        f"experts + {redundant}), from: {place} --trtllm-out moe_load_balancer.yaml "
                        f"[--trtllm-layers {model_layers[1]}-{model_layers[0] - 1}]"
                        + (f" --trtllm-mtp-layers {model_layers[0]}" if mtp else ""),
    }


def _vllm_line(row: dict) -> str:
    """vLLM's command for `row`'s layout with this project's policy through its plugin."""
    return (f"EPLB_VLLM_POLICY=cpsat vllm serve MODEL --data-parallel-size {row['cards']} --enable-expert-parallel "
            f"--enable-eplb --eplb-config '{{\"num_redundant_experts\": {row['redundant_experts']}}}'")
