"""Figures of a fleet run: the split of nodes between prefill and decode over time, and the queue wait."""

from pathlib import Path

from traces.atomic_file import write_atomically


def write_fleet_plots(report: dict, out_dir: Path) -> Path:
    """Write fleet_timeline.png (nodes per stage and held, output rate, queue wait over the hours) into out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = report["timeline"]
    hours = timeline["hour"]
    figure, (nodes, rate, wait) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    nodes.stackplot(hours, timeline["prefill_nodes"], timeline["decode_nodes"], labels=["prefill", "decode"],
                    alpha=0.7)
    nodes.plot(hours, timeline["nodes_held"], color="black", linewidth=1, label="held (moving, arriving, spares)")
    nodes.set_ylabel("8-card nodes")
    nodes.legend(loc="upper left", fontsize=8)
    fixed = report.get("fixed_split")
    title = f"autoscaled: mean {report['nodes_mean']:.1f} nodes, peak {report['nodes_peak']:.0f}"
    if fixed:
        title += f"; fixed split {fixed['prefill_nodes']} + {fixed['decode_nodes']}"
    nodes.set_title(title)
    rate.plot(hours, [value / 1e6 for value in timeline["output_tokens_per_s"]], color="tab:green")
    rate.set_ylabel("output M tok/s")
    wait.plot(hours, [max(value, 0.0) for value in timeline["queue_wait_s"]], color="tab:red")
    wait.set_ylabel("queue wait (s)")
    wait.set_xlabel("hour")
    figure.tight_layout()
    path = Path(out_dir) / "fleet_timeline.png"
    try:
        write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)
    return path
