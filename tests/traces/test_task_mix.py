"""Tasks interleaved by relative progress: every run of steps holds the same mix."""

import numpy as np
import pytest

from traces.task_mix import interleave_tasks


def _task(value: int, steps: int) -> np.ndarray:
    return np.full((steps, 1, 2), value) + np.arange(steps)[:, None, None] * 10


def test_two_tasks_of_one_size_alternate_and_keep_their_own_order():
    mixed = interleave_tasks([_task(1, 3), _task(2, 3)])
    assert mixed[:, 0, 0].tolist() == [1, 2, 11, 12, 21, 22]


def test_a_task_twice_the_size_takes_two_steps_in_three():
    mixed = interleave_tasks([_task(1, 4), _task(2, 2)])
    assert mixed[:, 0, 0].tolist() == [1, 2, 11, 21, 12, 31]


def test_tasks_of_different_shapes_or_none_are_refused():
    with pytest.raises(ValueError, match="same layers"):
        interleave_tasks([np.zeros((2, 1, 2)), np.zeros((2, 1, 3))])
    with pytest.raises(ValueError, match="no task"):
        interleave_tasks([])
