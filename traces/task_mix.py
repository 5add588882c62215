"""Several tasks' steps in one stream that holds the same mix everywhere.

Legend: T steps, L layers, E experts.

A log that stores its tasks one after another (ESFT's: intent, then law, then summary, then translation) read in file
order gives a replay that fits on one task and serves the next: a switch of traffic, not the mix the log stands for.
`interleave_tasks` orders every task's steps by how far through its own task each step is, so that any run of
consecutive steps holds the tasks in proportion to their sizes, each task's steps still in their own order.
"""

import numpy as np


def interleave_tasks(counts_by_task: list[np.ndarray]) -> np.ndarray:
    """[sum of T, L, E] the tasks' steps [T_i, L, E] merged by relative progress: step j of a task of T_i steps sits
    at (j + 0.5) / T_i, ties broken by task order.

    Raises:
        ValueError: no task, or tasks of different layers or experts.
    """
    if not counts_by_task:
        raise ValueError("counts_by_task holds no task; give at least one [T, L, E] array")
    shapes = {counts.shape[1:] for counts in counts_by_task}
    if len(shapes) != 1:
        raise ValueError(f"every task must have the same layers and experts; found {sorted(shapes)}")
    position = np.concatenate([(np.arange(len(counts)) + 0.5) / len(counts) for counts in counts_by_task])
    task = np.concatenate([np.full(len(counts), index) for index, counts in enumerate(counts_by_task)])
    order = np.lexsort((task, position))
    return np.concatenate(counts_by_task)[order]
