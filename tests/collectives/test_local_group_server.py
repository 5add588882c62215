"""`start_local_group_server(preload)` restarts a fork server that lacks a module, so that later ranks start with
it imported."""

import multiprocessing.forkserver
import sys

from collectives import run_local_group, start_local_group_server


def _has_module(comm, name: str) -> bool:
    return name in sys.modules


def test_a_preloaded_module_is_imported_in_every_rank_before_it_runs():
    start_local_group_server()
    first_pid = multiprocessing.forkserver._forkserver._forkserver_pid
    assert run_local_group(_has_module, 2, "colorsys") == [False, False]
    start_local_group_server(["colorsys"])  # a small standard module that neither torch nor the ranks import
    assert multiprocessing.forkserver._forkserver._forkserver_pid != first_pid
    assert run_local_group(_has_module, 2, "colorsys") == [True, True]
    restarted_pid = multiprocessing.forkserver._forkserver._forkserver_pid
    start_local_group_server(["colorsys"])  # already there: the server keeps running
    assert multiprocessing.forkserver._forkserver._forkserver_pid == restarted_pid
