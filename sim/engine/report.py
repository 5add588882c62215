"""The simulator's report: one JSON-ready dict (the contract keys and more, per class and per stage), its text form,
and the figures (throughput, cache hits and imbalance over time, latency CDFs)."""

import math
from pathlib import Path

import numpy as np

from sim import speculative, stage_costs
from sim.engine.stages import SimResult

DESIGNS = ("disk", "memory", "recompute")


def build_report(result: SimResult, wall_seconds: float) -> dict:
    """Every figure of a run; times in seconds, rates per second of simulated time."""
    config, records = result.config, result.records
    duration = config.duration_s
    done = [r for r in records if math.isfinite(r.finish_s)]
    input_tokens = sum(r.request.input_tokens for r in records)
    output_tokens = sum(r.request.output_tokens for r in done)
    cached = sum(r.cached_tokens for r in records)
    window_served = sum(r.cached_tokens for r in records if r.window_hit)
    ttft = np.array([r.first_token_s - r.request.arrival_s for r in records if math.isfinite(r.first_token_s)])
    tpot = np.array([(r.finish_s - r.first_token_s) / (r.request.output_tokens - 1) for r in done
                     if r.request.output_tokens > 1])
    flops = {design: sum(r.decoder_flops.get(design, 0.0) for r in records) for design in (*DESIGNS, "none")}
    cluster = config.cluster
    cards = {"vision": cluster.vision_cards, "prefill": cluster.prefill_nodes * cluster.cards_per_node,
             "decode": cluster.decode_units * cluster.decode_cards}
    peak_blocks = result.prefix_cache.peak_bytes / max(stage_costs.disk_bytes_per_block(config), 1e-9)
    report = {
        "requests": len(records),
        "requests_lost": len(records) - len(done),
        "input_tokens_per_s": input_tokens / duration,
        "output_tokens_per_s": output_tokens / duration,
        "prefill_tokens_per_s_per_card": _rate(result.prefill.tokens, result.prefill.busy_s,
                                               cluster.cards_per_node * cluster.prefill_instance_nodes),
        "prefill_imbalance_mean": result.prefill_imbalance_sum / max(result.prefill.batches, 1),
        "decode_tokens_per_s_per_card": _rate(result.decode.tokens, result.decode.busy_s, cluster.decode_cards),
        "ttft_p50_s": _percentile(ttft, 50),
        "ttft_p99_s": _percentile(ttft, 99),
        "tpot_p50_s": _percentile(tpot, 50),
        "tpot_p99_s": _percentile(tpot, 99),
        "disk_cache_hit_rate": cached / max(input_tokens, 1),
        "window_cache_hit_rate": window_served / max(input_tokens, 1),
        "prefill_decoder_flops_saved": 1.0 - flops[config.cache.window_design] / max(flops["none"], 1e-30),
        "decode_imbalance_mean": result.decode_imbalance_sum / max(result.decode_steps, 1),
        "decode_moe_share_mean": result.decode_moe_share_sum / max(result.decode_steps, 1),
        "decode_batch_mean": result.decode_batch_sum / max(result.decode_steps, 1),
        "decode_kv_tokens_mean": result.decode_kv_tokens_sum / max(result.decode_steps, 1),
        "cards": cards,
        "utilisation": {
            "vision": result.vision.busy_s / max(result.end_s * cluster.vision_cards, 1e-9),
            "prefill": result.prefill.busy_s / max(result.end_s * cluster.prefill_nodes
                                                   / cluster.prefill_instance_nodes, 1e-9),
            "decode": result.decode.busy_s / max(result.end_s * cluster.decode_units, 1e-9),
        },
        "sim_seconds_per_wall_second": result.end_s / max(wall_seconds, 1e-9),
        "simulated_seconds": result.end_s,
        "wall_seconds": wall_seconds,
        "decode_steps": result.decode_steps,
        "window_design": config.cache.window_design,
        "window_designs": {
            design: {"prefill_decoder_flops": flops[design],
                     "flops_vs_full_recompute": flops[design] / max(flops["none"], 1e-30),
                     "disk_bytes_needed": peak_blocks * stage_costs.disk_bytes_per_block(config, design)}
            for design in DESIGNS
        },
        "per_class": _per_class(records),
        "speculative": _speculative(config),
    }
    return report


def text_report(report: dict) -> str:
    """A readable summary of the report."""
    lines = [
        f"{report['requests']} requests ({report['requests_lost']} lost), {report['simulated_seconds']:.0f} s "
        f"simulated in {report['wall_seconds']:.1f} s ({report['sim_seconds_per_wall_second']:.0f}x)",
        f"cards: vision {report['cards']['vision']}, prefill {report['cards']['prefill']}, decode "
        f"{report['cards']['decode']}; utilisation "
        + ", ".join(f"{k} {v:.0%}" for k, v in report["utilisation"].items()),
        f"throughput: {report['input_tokens_per_s']:,.0f} input tok/s, {report['output_tokens_per_s']:,.0f} output "
        f"tok/s; per busy card: prefill {report['prefill_tokens_per_s_per_card']:,.0f}, decode "
        f"{report['decode_tokens_per_s_per_card']:,.0f} tok/s",
        f"latency: TTFT p50 {report['ttft_p50_s']:.3f} s, p99 {report['ttft_p99_s']:.3f} s; TPOT p50 "
        f"{report['tpot_p50_s'] * 1e3:.1f} ms, p99 {report['tpot_p99_s'] * 1e3:.1f} ms",
        f"cache: disk {report['disk_cache_hit_rate']:.1%} of input tokens, sliding-window state in memory "
        f"{report['window_cache_hit_rate']:.1%}; prefill decoder FLOPs saved "
        f"{report['prefill_decoder_flops_saved']:.1%}"
        f" ({report['window_design']} design)",
        f"decode: MoE imbalance {report['decode_imbalance_mean']:.3f}, MoE share of a step "
        f"{report['decode_moe_share_mean']:.1%}",
        "window designs (prefill decoder FLOPs vs full recompute; disk needed):",
    ]
    for design, figures in report["window_designs"].items():
        lines.append(f"  {design:9s} {figures['flops_vs_full_recompute']:.1%}  "
                     f"{figures['disk_bytes_needed'] / 1e12:.2f} TB")
    return "\n".join(lines)


def write_plots(result: SimResult, report: dict, out_dir: str | Path) -> list[Path]:
    """Throughput, cache hits and decode imbalance over time, latency CDFs; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from traces.atomic_file import write_atomically

    out = Path(out_dir)
    seconds = max(1, int(math.ceil(result.end_s)))
    timeline = {name: values[:seconds] for name, values in result.timeline.items()}
    fig, axes = plt.subplots(4, 1, figsize=(8, 12), sharex=False)
    axes[0].plot(timeline["output_tokens"], label="output tok/s")
    axes[0].plot(timeline["input_tokens"], label="input tok/s", alpha=0.6)
    axes[0].set_xlabel("simulated s")
    axes[0].legend()
    hit = timeline["disk_hit_tokens"] / np.maximum(timeline["input_tokens"], 1)
    axes[1].plot(hit)
    axes[1].set_ylabel("disk cache hit share")
    axes[1].set_xlabel("simulated s")
    for name, values in (("TTFT", [r.first_token_s - r.request.arrival_s for r in result.records]),
                         ("TPOT", [(r.finish_s - r.first_token_s) / (r.request.output_tokens - 1)
                                   for r in result.records if r.request.output_tokens > 1])):
        finite = np.sort([v for v in values if math.isfinite(v)])
        if len(finite):
            axes[2].plot(finite, np.linspace(0, 1, len(finite)), label=name)
    axes[2].set_xscale("log")
    axes[2].set_xlabel("seconds")
    axes[2].set_ylabel("CDF")
    axes[2].legend()
    steps = timeline["decode_steps"]
    imbalance = np.divide(timeline["decode_imbalance"], steps, out=np.full_like(steps, np.nan), where=steps > 0)
    axes[3].plot(imbalance)
    axes[3].set_ylabel("decode imbalance (max / mean card)")
    axes[3].set_xlabel("simulated s")
    fig.tight_layout()
    path = out / "sim_timeline.png"
    write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return [path]


def _speculative(config) -> dict | None:
    """The decode units' speculative step (per sequence, the same for every batch size); None when disabled."""
    spec = config.speculative
    if not spec.enabled:
        return None
    step = speculative.expected_step(spec, config.seed)
    return {"policy": spec.policy, "draft_tokens": spec.draft_tokens, "tokens_per_step": step.tokens_per_step,
            "verified_per_step": step.verified_per_step, "drafted_per_step": step.drafted_per_step}


def _per_class(records) -> dict:
    classes = sorted({r.request.traffic_class for r in records})
    result = {}
    for name in classes:
        mine = [r for r in records if r.request.traffic_class == name]
        tokens = sum(r.request.input_tokens for r in mine)
        ttft = np.array([r.first_token_s - r.request.arrival_s for r in mine if math.isfinite(r.first_token_s)])
        result[name] = {"requests": len(mine), "input_tokens": tokens,
                        "disk_cache_hit_rate": sum(r.cached_tokens for r in mine) / max(tokens, 1),
                        "ttft_p50_s": _percentile(ttft, 50), "ttft_p99_s": _percentile(ttft, 99)}
    return result


def _rate(tokens: float, busy_s: float, cards: int) -> float:
    return tokens / busy_s / cards if busy_s > 0 else 0.0


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan
