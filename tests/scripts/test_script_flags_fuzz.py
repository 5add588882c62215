"""Property-based fuzzing of the demo scripts' flags (hypothesis, derandomised so CI is repeatable).

Random sets of flags, each with a value drawn from good values and from values no flag may take (not a number,
NaN, infinities, negatives, absurd magnitudes, an unknown choice, an output path naming a project file, a device or
a missing folder): every call of `scripts/live_demo.py`'s and `scripts/hf_demo.py`'s `main` either exits 2 with one
line on stderr or reaches its first piece of work (starting the ranks' fork server, replaced here by a sentinel),
never anything else; a call with a value no flag may take always exits 2; and no project file changes.
"""

import argparse
import contextlib
import hashlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
GOOD_NUMBERS = ("0", "1", "2", "3", "4", "5", "8", "17", "64", "300", "0.5", "1.001", "1.5")
BAD_NUMBERS = ("nan", "inf", "-inf", "-5", "-0.5", "abc", "", "0x10")
ABSURD_NUMBERS = ("1e300", "99999999999999999999", "1000000000000")  # budgets, sizes and counts no run could use
BAD_PATHS = ("README.md", "scripts/live_demo.py", "/dev/full", "/nonexistent-folder/x.json", "docs")
PROTECTED = ("README.md", "scripts/live_demo.py", "scripts/hf_demo.py", "pyproject.toml")


class ReachedWork(Exception):
    """Raised where the script would start its first piece of work: the flags were accepted."""


def _reach_work(*args, **kwargs):
    raise ReachedWork


def _digest() -> dict[str, str]:
    return {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest() for name in PROTECTED}


@st.composite
def _argv(draw, parser: argparse.ArgumentParser, required: tuple[str, ...], json_path: str):
    """(argv, has_bad_value): one to four of the parser's flags (the required ones always) with good values, or one
    of them with a value no flag may take."""
    actions = {action.option_strings[-1]: action for action in parser._actions
               if action.option_strings and action.dest != "help"}
    flags = draw(st.lists(st.sampled_from(sorted(actions)), min_size=1, max_size=4, unique=True))
    flags = list(required) + [flag for flag in flags if flag not in required]
    spoilt = draw(st.integers(-len(flags), len(flags) - 1))  # the flag with a bad value (none when negative)
    argv = []
    for index, flag in enumerate(flags):
        action, bad = actions[flag], index == spoilt
        if action.nargs == 0:  # a switch
            argv.append(flag)
        elif action.choices:
            argv += [flag, "bogus" if bad else draw(st.sampled_from(list(action.choices)))]
        elif getattr(action.type, "writes", None):
            argv += [flag, draw(st.sampled_from(BAD_PATHS)) if bad else json_path]
        else:
            bad_values = ABSURD_NUMBERS if draw(st.booleans()) else BAD_NUMBERS
            argv += [flag, draw(st.sampled_from(bad_values if bad else GOOD_NUMBERS))]
    return argv, spoilt >= 0 and actions[flags[spoilt]].nargs != 0


def _run(script, argv: list[str]) -> tuple[str, str]:
    """('exit 2' | 'work' | 'exit N', stderr) of one call of the script's main."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            script.main(argv)
        except ReachedWork:
            return "work", stderr.getvalue()
        except SystemExit as exc:
            return f"exit {exc.code}", stderr.getvalue()
    return "returned", stderr.getvalue()


def _check(script, argv: list[str], bad: bool) -> None:
    before = _digest()
    outcome, stderr = _run(script, argv)
    assert outcome in ("exit 2", "work"), (argv, outcome, stderr)
    if outcome == "exit 2":
        assert stderr.count("\n") == 1 and "Traceback" not in stderr, (argv, stderr)
    assert not bad or outcome == "exit 2", f"{argv} was accepted"
    assert _digest() == before


@pytest.fixture(scope="module")
def live_demo(load_script):
    return load_script("live_demo")


@pytest.fixture(scope="module")
def hf_demo(load_script):
    pytest.importorskip("transformers")
    return load_script("hf_demo")


@pytest.fixture
def at_the_root(monkeypatch, tmp_path):
    """Run from the repository root (the project's files are in reach of relative paths); returns a fresh JSON
    output path under `tmp_path`."""
    monkeypatch.chdir(ROOT)
    return str(tmp_path / "times.json")


def test_live_demo_flags_exit_2_with_one_line_or_reach_work(live_demo, monkeypatch, at_the_root):
    monkeypatch.setattr(live_demo, "start_local_group_server", _reach_work)

    @FUZZ
    @given(case=_argv(live_demo.build_parser(), (), at_the_root))
    def run(case):
        _check(live_demo, *case)

    run()


def test_hf_demo_flags_exit_2_with_one_line_or_reach_work(hf_demo, monkeypatch, at_the_root):
    monkeypatch.setattr(hf_demo, "start_local_group_server", _reach_work)

    @FUZZ
    @given(case=_argv(hf_demo.build_parser(), ("--arch",), at_the_root))
    def run(case):
        _check(hf_demo, *case)

    run()
