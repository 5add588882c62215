"""`eplb advise`'s readable output: the ranked table with what each row rests on, what the advice holds across, the
user's current layout against the pick, each engine's settings, and the prefill table."""

from placement.imbalance_metrics import metrics_line
from placement.yardsticks import yardsticks_line


def advice_text(result: dict) -> str:
    """The ranked table, the rows left unanswered, the recommendation (with its ties and its gain over --current),
    each engine's settings and the prefill rows, readable."""
    settings = result["settings"]
    lines = [f"{settings['card']}, TPOT {settings['tpot_slo_ms']:g} ms, {settings['context_tokens']:,}-token contexts, "
             f"MTP {'on' if settings['mtp'] else 'off'}; trace: {settings['trace']} ({settings['trace_mix']}; "
             f"{settings['trace_layers']} layers replayed, refit every {settings['refit_every']} steps on the last "
             f"{settings['window']})",
             "  rank | GPUs x slots | limits | redundant | tok/s per GPU (range) | batch per GPU | imbalance (noise "
             "floor) | bound by | greedy tok/s (imbalance) | memory GB: weights + experts + KV (free) | $ per M "
             "tokens | steps: pooled, scored, refits"]
    for rank, row in enumerate(result["rows"], 1):
        lines.append(_row_line(f"{rank:4d}", row))
    current = result.get("current")
    if current is not None and current not in result["rows"]:
        lines.append(_row_line("now ", current))
    unanswered = result["unanswered"]
    if unanswered:
        scored = sorted(row["scored_steps"] for row in unanswered)
        span = f"{scored[0]}" if scored[0] == scored[-1] else f"{scored[0]}-{scored[-1]}"
        shapes = ", ".join(map(_shape, unanswered))
        lines.append(f"not answered, left out of the pick: {len(unanswered)} rows ({shapes}): their replays scored "
                     f"{span} steps at their top load, fewer than {result['min_scored_steps']} (2 fit windows); a "
                     f"trace of more steps, or a smaller --window, answers them")
    best = result["recommended"]
    if best is None:
        lines.append(no_pick(result))
        return "\n".join(lines)
    needed = f", {best['cards_needed']:,} GPUs for the stated load" if best["cards_needed"] is not None else ""
    limits = ", each expert group on one node" if best["node_limits"] else ""
    lines += [f"recommended: {best['cards']} GPUs x {best['slots_per_card']} slots ({best['redundant_experts']} "
              f"redundant experts{limits}): {best['cpsat']['tokens_per_s_per_card']:,.0f} tokens/s per GPU at "
              f"{best['cpsat']['batch_per_card']:.1f} sequences per GPU{needed}"]
    if "metrics" in best:
        lines.append(f"  its imbalance read every way at {best['cpsat']['micro_batch_tokens_per_card']:.1f} tokens a "
                     f"GPU a micro-batch: {metrics_line(best['metrics'])}")
        lines.append(f"  its yardsticks there: {yardsticks_line(best['yardsticks'])}")
    lines += _knowledge_lines(result, best)
    lines += [f"  {engine}: {flags}" for engine, flags in result["engines"].items()]
    lines += [f"wrote {result[key]}: {what}, the recommended layout fitted on the trace's last steps"
              for key, what in (("sglang_out", "SGLang's --init-expert-location file"),
                                ("trtllm_out", "TensorRT-LLM's moe_load_balancer.yaml")) if key in result]
    if "prefill_rows" in result:
        lines += _prefill_lines(result, settings)
    return "\n".join(lines)


def _shape(row: dict) -> str:
    return f"{row['cards']} x {row['slots_per_card']}{' (groups)' if row['node_limits'] else ''}"


def _row_line(rank: str, row: dict) -> str:
    chosen, greedy, memory = row["cpsat"], row["deepseek"], row["memory_gb"]
    imbalance = f"{chosen['imbalance']:.3f} ({chosen['noise_floor']:.3f})" if chosen["imbalance"] is not None else "-"
    greedy_imbalance = f"{greedy['imbalance']:.3f}" if greedy["imbalance"] is not None else "-"
    cost = f"{row['usd_per_million_tokens']:.3f}" if row["usd_per_million_tokens"] is not None else "-"
    rate = f"{chosen['tokens_per_s_per_card']:,.0f}"
    if "range" in row:
        found = row["range"]["tokens_per_s_per_card"]
        rate += f" ({found['min']:,.0f}-{found['max']:,.0f})"
    basis = chosen.get("basis")
    steps = f"{basis['steps']}, {basis['scored_steps']}, {basis['refits']}" if basis else "-"
    if not row.get("answerable", True):
        steps += " (too few)"
    return (f"  {rank} | {row['cards']:4d} x {row['slots_per_card']:<5d} | {'groups' if row['node_limits'] else '-':6} "
            f"| {row['redundant_experts']:9d} | {rate:>21} | {chosen['batch_per_card']:13.1f} | {imbalance:>21} | "
            f"{chosen['bound_by']:8} | {greedy['tokens_per_s_per_card']:8,.0f} ({greedy_imbalance}) | "
            f"{memory['replicated']:.1f} + {memory['experts']:.1f} + {memory['kv']:.1f} ({memory['free']:.1f}) | "
            f"{cost} | {steps}")


def _knowledge_lines(result: dict, best: dict) -> list[str]:
    """What the pick holds across (its ties over the traffic cases) and how it compares with --current."""
    lines = []
    cases = len(best.get("range", {}).get("cases", ()))
    if cases:
        if result["ties"]:
            tied = ", ".join(f"{_shape(row)} (matches or beats it in {row['wins_in']} of {row['cases']})"
                             for row in result["ties"])
            lines.append(f"  a tie within the spread, not a pick over: {tied}; the traffic cases "
                         f"({cases}, plus the trace) do not separate them")
        else:
            lines.append(f"  it holds across the trace and {cases} traffic cases: no layout within 5% of it matches it "
                         f"in any")
    current = result.get("current")
    if current is None:
        return lines
    rate = current["cpsat"]["tokens_per_s_per_card"]
    gain = result["gain_over_current"]
    text = f"  current {_shape(current)}: {rate:,.0f} tokens/s per GPU (imbalance " \
           f"{_imbalance(current['cpsat']['imbalance'])}" + \
           ("" if current.get("answerable", True) else "; its replay scored too few steps, so read this with care") + ")"
    if gain is not None:
        text += f"; the pick serves {gain['central']:+.1%}"
        if "min" in gain:
            text += f" ({gain['min']:+.1%} to {gain['max']:+.1%} over {cases} traffic cases)"
    even = result["break_even_imbalance"]
    if even is not None:
        text += f"; break-even: the current layout matches the pick at imbalance {even:.3f}"
    elif gain is not None and gain["central"] > 0:
        text += "; break-even: none, even perfectly balanced it serves less than the pick"
    lines.append(text)
    if "metrics" in current:
        lines.append(f"  the current layout's imbalance read every way at "
                     f"{current['cpsat']['micro_batch_tokens_per_card']:.1f} tokens a GPU a micro-batch: "
                     f"{metrics_line(current['metrics'])}")
    return lines


def _imbalance(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def no_pick(result: dict) -> str:
    """Why no row is recommended: weights that overflow, a TPOT target nothing meets, or no answerable row."""
    rows = result["rows"]
    if rows and all(row["cpsat"]["bound_by"] == "weights" for row in rows):
        return "no layout serves a sequence: every candidate's weights overflow the card (add GPUs, or lower --context)"
    if rows and not any(row.get("answerable", True) for row in rows):
        return "no layout answers: every replay scored too few steps (see above); give a trace of more steps"
    return ("no layout serves a sequence within the TPOT target: even one sequence per GPU takes longer (loosen "
            "--tpot-ms or --tokens-per-user, or lower --context)")


def _prefill_lines(result: dict, settings: dict) -> list[str]:
    lines = [f"prefill instances at TTFT {settings['ttft_s']:g} s ({settings['prompt_tokens']:,}-token prompts, "
             f"{settings['cached_share']:.0%} cached):",
             "  rank | GPUs (nodes) | limits | redundant | prompt tok/s per GPU | prompts per batch | batch s | "
             "imbalance | bound by"]
    for rank, row in enumerate(result["prefill_rows"], 1):
        batch = f"{row['batch_s']:.2f}" if row["batch_s"] is not None else "-"
        lines.append(f"  {rank:4d} | {row['cards']:4d} ({row['nodes']}) | "
                     f"{'groups' if row['node_limits'] else '-':6} | {row['redundant_experts']:9d} | "
                     f"{row['tokens_per_s_per_card']:20,.0f} | {row['prompts_per_batch']:17d} | {batch:>7} | "
                     f"{_imbalance(row['imbalance']):>9} | {row['bound_by']}")
    return lines
