"""OpenBLAS on one thread while the caller's own threads do the parallel work.

With its own threads OpenBLAS spins waiting for them; on cores shared with other processes the router's matrix
products then run much slower (5-10x: docs/placement.md, 'Budget: deterministic work'). `one_blas_thread()` sets every
OpenBLAS library loaded in this process to one thread while inside, and restores the counts when the last user
leaves (the setting is process-wide). Without OpenBLAS it does nothing.
"""

import ctypes
import functools
import threading
from contextlib import contextmanager

# OpenBLAS thread counts are process-wide: the first fit to enter `_one_blas_thread` sets them, the last restores.
_BLAS_LOCK = threading.Lock()
_blas_users = 0
_blas_before: list[tuple] = []  # (set function, thread count) to restore


@functools.cache
def _openblas_thread_calls() -> tuple[tuple, ...]:
    """(get, set) thread-count functions of each OpenBLAS library loaded in this process (Linux; else none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.split()[-1].rsplit("/", 1)[-1]})
    except OSError:
        return ()
    calls = []
    for path in paths:
        library = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
            get = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
            put = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                calls.append((get, put))
                break
    return tuple(calls)


@contextmanager
def one_blas_thread():
    """OpenBLAS computes on the calling thread only, while inside (nested and concurrent uses are counted)."""
    global _blas_users, _blas_before
    with _BLAS_LOCK:
        if _blas_users == 0:
            _blas_before = [(put, get()) for get, put in _openblas_thread_calls()]
            for put, _ in _blas_before:
                put(1)
        _blas_users += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _blas_users -= 1
            if _blas_users == 0:
                for put, count in _blas_before:
                    put(count)
