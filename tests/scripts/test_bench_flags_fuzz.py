"""Property-based fuzzing of the benchmark scripts' flags, as `test_script_flags_fuzz.py` fuzzes the demos' (its
strategy and checks, reused): random sets of flags with good values, values no flag may take and bad output paths.
Every call of each `scripts/bench_*.py`'s `main` either exits 2 with one line on
stderr or reaches its first piece of work (`FIRST_WORK`, replaced by a sentinel), never anything else; a call with a
value no flag may take always exits 2; and no project file changes.
"""

import argparse
import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from eplb.cli import bench_harness

# The demos' fuzz (its strategy, `_check` and sentinel), loaded by its path: the tests are not a package.
_spec = importlib.util.spec_from_file_location("script_flags_fuzz",
                                               Path(__file__).with_name("test_script_flags_fuzz.py"))
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

FUZZ = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Per script, what its `main` calls first once every flag is checked (a name of the script's module, or a dotted name
# of a module it imports); a script with several kinds of run names the first call of each.
FIRST_WORK = {
    "bench_generalisation": "measure",  # the traces and rolling replays of every row
    "bench_tracking": "measure",  # the traces, priced replays and oracles of every row
    "bench_live": ("overhead_section", "rebalance_section", "demo_runs_section", "demo_switches_section",
                   "noise_section", "plan_section", "host_copies_section"),  # the sections --section picks
    "bench_placement": ("generate_trace", "load_trace"),  # the synthetic traces (speed, rolling, lag), or ESFT's
    "bench_production": ("real_rows", "measure"),  # --real's ESFT and OLMoE rows, or the synthetic rows
    "bench_request_traffic": ("esft_rows", "recovery_rows"),  # the parts --part picks
    "bench_router": "torch.set_num_threads",  # sets the process's torch threads (the test process keeps its own)
    "bench_sim": ("speed", "balance", "windows", "fleet"),  # the sections --section picks
    "bench_speculative": "gain_table",  # the speculative decoding gain table
    "bench_work_budget": "os.sched_setaffinity",  # pins the process to one core (the test process keeps its cores)
}
REQUIRED: dict[str, tuple[str, ...]] = {}  # script -> flags it requires (none so far)


def test_every_benchmark_script_is_fuzzed():
    scripts = {path.stem for path in (fuzz.ROOT / "scripts").glob("bench_*.py")}
    assert set(FIRST_WORK) == scripts


class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _parser_of(script, monkeypatch) -> argparse.ArgumentParser:
    """The script's parser (`build_parser()`, or the one `main` builds, caught as it parses), without the flags its
    help hides (a parent's flags to its own children)."""
    if hasattr(script, "build_parser"):
        parser = script.build_parser()
    else:
        owner = script if hasattr(script, "OneLineParser") else bench_harness  # who builds it

        class Caught(owner.OneLineParser):
            def parse_args(self, args=None, namespace=None):
                raise _Parser(self)

        with monkeypatch.context() as patch:
            patch.setattr(owner, "OneLineParser", Caught)
            with pytest.raises(_Parser) as caught:
                script.main([])
        parser = caught.value.parser
    parser._actions = [action for action in parser._actions if action.help != argparse.SUPPRESS]
    return parser


@pytest.mark.parametrize("name", sorted(FIRST_WORK))
def test_bench_flags_exit_2_with_one_line_or_reach_work(load_script, monkeypatch, tmp_path, name):
    script = load_script(name)
    monkeypatch.chdir(fuzz.ROOT)
    works = FIRST_WORK[name]
    for work in (works,) if isinstance(works, str) else works:
        *owner, attribute = work.split(".")
        monkeypatch.setattr(getattr(script, owner[0]) if owner else script, attribute, fuzz._reach_work)
    parser = _parser_of(script, monkeypatch)

    @FUZZ
    @given(case=fuzz._argv(parser, REQUIRED.get(name, ()), str(tmp_path / "out.json")))
    def run(case):
        fuzz._check(script, *case)

    run()
