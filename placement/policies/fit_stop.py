"""Stopping a `cpsat` fit's layers from the thread that waits for them (Ctrl-C, SIGTERM, any exception there).

A fit solves its layers on worker threads (`cpsat_policy.fit_cpsat`); the signal reaches only the main thread, which
waits for them. Without a way to stop them, leaving the fit's `ThreadPoolExecutor` waits for every layer already
submitted, the whole budget at any size. `FitStop.stop()` is that way: layers not yet begun never start, a running
CP-SAT solve is stopped (`CpSolver.stop_search`, safe from another thread), and the swap and ring searches and the
layer's phases check it between their steps and end with `FitStopped`. A fit that is stopped returns nothing, so the
checks change no placement: a fit that runs to its end does exactly the work it did without them (the budget stays
deterministic).
"""

import contextlib
import threading
from collections.abc import Iterator

from ortools.sat.python import cp_model


class FitStopped(Exception):
    """A layer ended early because its fit was stopped; its result is never used."""


class FitStop:
    """A stop flag for one fit, shared by its layers, and the CP-SAT solvers running for them."""

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._solvers: set[cp_model.CpSolver] = set()

    def stop(self) -> None:
        """Stop the fit: every running solve now, every layer at its next check."""
        self._stopped.set()
        with self._lock:
            for solver in self._solvers:
                solver.stop_search()

    def check(self) -> None:
        """Raise `FitStopped` once the fit is stopped (between steps of a layer's work)."""
        if self._stopped.is_set():
            raise FitStopped

    @contextlib.contextmanager
    def solving(self, solver: cp_model.CpSolver) -> Iterator[None]:
        """Around `solver.solve(...)`: a stop during the solve ends it, and raises `FitStopped` after it."""
        with self._lock:
            self.check()
            self._solvers.add(solver)
        try:
            yield
        finally:
            with self._lock:
                self._solvers.discard(solver)
        self.check()
