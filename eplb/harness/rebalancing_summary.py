"""The figures of a rebalancing loop (`rebalancing_loop.run_rebalancing_loop`) over its ranks: imbalance before and
after, tokens lost, bytes moved, recovery, and decode step time while a rebalance is in progress against without.

A step's time is its slowest rank's (the group waits for it). The p99 ratio of one run of a hundred steps rests on
its few slowest steps; `p99_ratio_interval` shows how far it moves with which of them fall in the run, and
`pooled_p99_ratio` pools the steps of several runs, resampling whole runs, for a figure that does not.
"""

import numpy as np
import torch

from eplb.harness.rebalancing_loop import LoopReport
from eplb.live.replica_assignment import ReplicaTables, slot_quotas_EX, slot_quotas_P
from eplb.harness.synthetic_decode import DecodeSetup


def group_step_times(reports: list) -> list[dict]:
    """Per step served, in step order: {"step", "seconds" (slowest rank that reported it), "rebalancing" (a
    rebalance was in progress on some rank before or after its work), "phase" (the rebalancer's phase before >
    after, on the lowest original rank that reported it), "world_size"}. `reports`: one per original rank, a killed
    rank's entry its error."""
    served = [r for r in reports if isinstance(r, LoopReport)]
    steps = sorted(set().union(*(r.steps for r in served)))
    rows = []
    for step in steps:
        ranks = [r.steps[step] for r in served if step in r.steps]
        rows.append({"step": step, "seconds": max(rank["seconds"] for rank in ranks),
                     "rebalancing": any(rank["rebalancing"] for rank in ranks), "phase": ranks[0]["phase"],
                     "world_size": ranks[0]["world_size"]})
    return rows


def summarize_rebalancing(reports: list, setup: DecodeSetup, failed_rank: int | None = None) -> dict:
    """The demo's figures over every rank that finished (`reports` in original rank order; a killed rank's entry
    is its error). Imbalance is max / mean over the group's ranks of the rows each computed, mean over layers,
    then over steps; tokens lost = picks the quotas left out plus rows a reporting rank did not compute; before =
    the start placement routed on the traffic of the steps after the last switch (of a refit, a load or a burst
    patch; on its own group size, also when the group has shrunk since); after = as measured after the last
    switch."""
    finished = [r for r in reports if isinstance(r, LoopReport) and not r.drained]
    served = [r for r in reports if isinstance(r, LoopReport)]
    steps = sorted(set().union(*(r.steps for r in finished)))
    served_by = {step: [r for r in served if step in r.steps] for step in steps}
    measured, lost = _measured_and_lost(served_by)
    times = {row["step"]: row for row in group_step_times(reports) if row["step"] in served_by}
    stats = finished[0].stats
    switches = stats["switch_steps"]
    last_switch = max(switches + stats["patch_steps"], default=None)  # of a refit, a load or a burst patch
    after_steps = [s for s in steps if last_switch is not None and s >= last_switch]
    before, basis = _imbalance_before(setup, finished[0], after_steps, steps)
    first_switch = _first_switch(setup, finished[0], switches, measured, steps)
    patched = _patched(setup, finished[0], measured, steps)
    recoveries = finished[0].recoveries
    return {
        "steps": len(steps),
        "world_size": setup.placement.cluster.num_gpus,
        "world_size_at_end": len(finished[0].final_members),
        "routing": setup.routing,
        "max_abs_err_vs_dense": max(r.max_abs_err for r in finished),
        "imbalance_before": before,
        "imbalance_before_basis": basis,
        "imbalance_after": float(np.mean([measured[s] for s in after_steps])) if after_steps else None,
        "rebalances": stats["rebalances"],
        "rebalance_failures": stats["failures"],
        "rebalances_kept": stats["kept"],
        "patches": stats["patches"],
        "patch_steps": stats["patch_steps"],
        "patch_lag_steps": stats["patch_lag_steps"],
        "patch_early_layers": stats["patch_early_layers"],
        "bytes_moved": int(sum(r.stats["bytes_received"] for r in finished)),
        "tokens_lost": lost,
        "requests_requeued": finished[0].requeued,
        "failed_rank": failed_rank,
        "recoveries": [{k: v for k, v in rec.items() if k not in ("detected_at", "killed_at")} for rec in recoveries],
        "seconds_from_kill_to_first_step": _kill_to_first_step(finished),
        **_step_times(times, served_by),
        "step_time_ms_by_phase": _by_phase(finished[0], {step: row["seconds"] for step, row in times.items()}),
        "switch_steps": switches,
        "first_switch": first_switch,
        "burst_patches": patched,
        "lag_steps": stats["lag_steps"],
        "lag_seconds": [round(x, 3) for x in stats["lag_seconds"]],
        "slots_match_placement": all(r.slots_match_placement for r in finished),
        "host_copies_match_placement": all(r.host_copies_match_placement for r in finished),
        "survivors": finished[0].final_members,
        "failures_tolerated": finished[0].failures_tolerated,
        "host_copy_bytes_max": max(r.host_copy_bytes for r in finished),
    }


def _step_times(times: dict[int, dict], served_by: dict[int, list[LoopReport]]) -> dict:
    """The step-time figures: steps whose start the rebalancer delayed by more than a whole quiet step (median), the
    p99 ratio of rebalancing steps to quiet ones (and its interval), and their milliseconds."""
    quiet = [row["seconds"] for row in times.values() if not row["rebalancing"]]
    busy = [row["seconds"] for row in times.values() if row["rebalancing"]]
    median_quiet = float(np.median(quiet)) if quiet else 0.0
    waited = sum(any(r.steps[step]["pause_seconds"] > median_quiet for r in ranks) for step, ranks in served_by.items())
    return {"decode_steps_waiting_on_rebalance": int(waited), "step_time_p99_ratio": p99_ratio(busy, quiet),
            "step_time_p99_ratio_interval": p99_ratio_interval(busy, quiet),
            "step_time_ms": {"p50_quiet": _ms(quiet, 50), "p99_quiet": _ms(quiet, 99),
                             "p50_rebalancing": _ms(busy, 50), "p99_rebalancing": _ms(busy, 99),
                             "steps_rebalancing": len(busy)}}


def _measured_and_lost(served_by: dict[int, list[LoopReport]]) -> tuple[dict[int, float], int]:
    """Per step, the imbalance measured (max / mean rows over the group's ranks, mean over layers), and the tokens
    lost over all steps (picks the quotas left out plus rows a reporting rank did not compute). `served_by`: step ->
    the reports of the ranks that served it."""
    measured, lost = {}, 0
    for step, ranks in served_by.items():
        # Rows per GPU: as computed by the ranks that reported the step, as planned for a rank that died later
        # (every survivor's rows equal its plan, which `tokens_lost` checks).
        planned_LG = np.array(ranks[0].steps[step]["planned_gpu_LG"], dtype=float)
        rows_LG = planned_LG.copy()
        for r in ranks:
            rows_LG[:, r.steps[step]["group_rank"]] = r.steps[step]["computed_L"]
        measured[step] = float(np.mean(rows_LG.max(1) / np.maximum(rows_LG.mean(1), 1e-12)))
        lost += int(np.sum(ranks[0].steps[step]["counts_LE"]) - rows_LG.sum())
    return measured, lost


def _kill_to_first_step(finished: list[LoopReport]) -> float | None:
    """Seconds from the first kill to the end of the first step served after it (None without a kill)."""
    recoveries = finished[0].recoveries
    if not (recoveries and recoveries[0].get("killed_at")):
        return None
    resume = recoveries[0]["resume_step"]
    done = [r.steps[resume]["completed_at"] for r in finished if resume in r.steps]
    return max(done) - recoveries[0]["killed_at"] if done else None


def _first_switch(setup: DecodeSetup, report: LoopReport, switches: list[int], measured: dict[int, float],
                  steps: list[int]) -> dict | None:
    """What the first switch bought while it served: on the steps from it to the next switch or the first recovery
    (a smaller group), the start placement routed on their traffic (`before`) against the imbalance measured
    (`after`). None without a switch."""
    if not switches:
        return None
    ends = switches[1:] + [rec["resume_step"] for rec in report.recoveries if rec["resume_step"] > switches[0]]
    end = min(ends, default=max(steps) + 1)
    served = [s for s in steps if switches[0] <= s < end]
    if not served:
        return None
    before, _ = _imbalance_before(setup, report, served, steps)
    return {"from_step": switches[0], "to_step": end, "before": before,
            "after": float(np.mean([measured[s] for s in served]))}


def _patched(setup: DecodeSetup, report: LoopReport, measured: dict[int, float], steps: list[int]) -> dict | None:
    """What burst patches bought while they served: on the steps a patch served (from its switch to the next switch
    of any kind or recovery), the start placement routed on their traffic (`before`) against the imbalance measured
    (`after`). None when no patch served."""
    stats = report.stats
    events = sorted([(step, "patch") for step in stats["patch_steps"]] + [(step, "refit") for step in
                    stats["switch_steps"]] + [(rec["resume_step"], "recovery") for rec in report.recoveries])
    serving, served, next_event = "start", [], 0
    for step in sorted(steps):  # what serves a step is what switched last at or before it (a step measured or not)
        while next_event < len(events) and events[next_event][0] <= step:
            serving = events[next_event][1]
            next_event += 1
        if serving == "patch":
            served.append(step)
    if not served:
        return None
    before, _ = _imbalance_before(setup, report, served, steps)
    return {"steps": len(served), "before": before, "after": float(np.mean([measured[s] for s in served]))}


def _imbalance_before(setup: DecodeSetup, report: LoopReport, after_steps: list[int],
                      steps: list[int]) -> tuple[float | None, str]:
    """The start placement routed (as the layers route) on the expert counts of the steps after the last switch
    (all steps when there was none): what serving would have seen without rebalancing, on the same traffic."""
    start = setup.placement
    tables = [ReplicaTables.build(start, layer) for layer in range(start.num_layers)]
    values = []
    for step in after_steps or steps:
        per_layer = []
        for layer, counts in enumerate(report.steps[step]["counts_LE"]):
            quota_EX = slot_quotas_EX(torch.as_tensor(counts), tables[layer], setup.routing)
            gpu = slot_quotas_P(quota_EX, tables[layer]).view(start.cluster.num_gpus, -1).sum(1).double()
            per_layer.append(float(gpu.max() / gpu.mean().clamp_min(1e-9)))
        values.append(float(np.mean(per_layer)))
    basis = "after the last switch" if after_steps else "every step (no switch)"
    return (float(np.mean(values)) if values else None), f"start placement routed on the steps {basis}"


PHASES = {  # a step's rebalancer phase before > after its work -> what the step carried
    "idle>idle": "quiet",
    "idle>solving": "start (the window taken, the solve submitted)",
    "solving>solving": "solving in the background",
    "solving>moving": "answer broadcast, staging allocated, the first round posted",
    "solving>idle": "solve done, nothing worth moving (or the solve failed)",
    "moving>moving": "a round of weights moved (or a patch's switch and the next one's answer broadcast)",
    "moving>solving": "a patch's switch, the next one's job still solving",
    "moving>idle": "switch (or a failed move)",
}


def _by_phase(report: LoopReport, worst_time: dict[int, float]) -> dict[str, dict]:
    """Step time (slowest rank) by what the rebalancer did before the step, on one rank's record of the phases."""
    groups: dict[str, list[float]] = {}
    for step, seconds in worst_time.items():
        if step in report.steps:
            groups.setdefault(PHASES.get(report.steps[step]["phase"], report.steps[step]["phase"]), []).append(seconds)
    return {name: {"steps": len(values), "p50": _ms(values, 50), "p90": _ms(values, 90)}
            for name, values in groups.items()}


def p99_ratio(busy: list[float], quiet: list[float]) -> float | None:
    """p99(busy) / p99(quiet) (None when either is empty)."""
    if not busy or not quiet:
        return None
    return float(np.percentile(busy, 99) / np.percentile(quiet, 99))


def p99_ratio_interval(busy: list[float], quiet: list[float], draws: int = 1000,
                       seed: int = 0) -> list[float] | None:
    """A 90% bootstrap interval of p99(busy) / p99(quiet): both groups of step times resampled with replacement
    `draws` times (seeded, so a run's figures repeat). Where a few slow steps set each p99, the interval shows how
    far the ratio moves with which of them fall in a run."""
    if len(busy) < 2 or len(quiet) < 2:
        return None
    rng = np.random.default_rng(seed)
    busy_p99 = np.percentile(rng.choice(np.asarray(busy), (draws, len(busy))), 99, axis=1)
    quiet_p99 = np.percentile(rng.choice(np.asarray(quiet), (draws, len(quiet))), 99, axis=1)
    low, high = np.percentile(busy_p99 / quiet_p99, [5, 95])
    return [round(float(low), 4), round(float(high), 4)]


def pooled_p99_ratio(runs: list[tuple[list[float], list[float]]], draws: int = 1000,
                     seed: int = 0) -> tuple[float, list[float] | None]:
    """p99 of every run's busy steps over p99 of every run's quiet steps (`runs`: (busy, quiet) step times of each
    run), and a 90% bootstrap interval that resamples whole runs (steps of one run share its machine's moods, so
    they are not independent draws); None for the interval with fewer than two runs.

    Raises:
        ValueError: no run has both busy and quiet steps.
    """
    usable = [(list(busy), list(quiet)) for busy, quiet in runs if busy and quiet]
    if not usable:
        raise ValueError("runs must hold at least one run with both busy and quiet step times")
    ratio = p99_ratio(sum((busy for busy, _ in usable), []), sum((quiet for _, quiet in usable), []))
    if len(usable) < 2:
        return ratio, None
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(draws):
        picked = [usable[i] for i in rng.integers(0, len(usable), len(usable))]
        ratios.append(p99_ratio(sum((b for b, _ in picked), []), sum((q for _, q in picked), [])))
    low, high = np.percentile(ratios, [5, 95])
    return ratio, [round(float(low), 4), round(float(high), 4)]


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 3) if values else None
