"""The `vllm.general_plugins` entry point the project declares: installed with the project, it changes nothing until
`EPLB_VLLM_POLICY` asks for a policy, then puts it where vLLM's `EplbState` looks (`EPLB_POLICIES["default"]`); a
value it cannot use is refused in one line naming the variable. Checked on a stand-in registry everywhere, and on
vLLM's own policy package (loaded by path, with vLLM's own plugin loader where it imports) where vLLM is installed."""

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Literal

import pytest

from eplb import CpsatEplbPolicy
from eplb.engines.vllm import plugin as vllm_plugin
from eplb.engines.vllm.plugin import PluginSettingError, policy_from_environment

GROUP = "vllm.general_plugins"


def _entry_point() -> importlib.metadata.EntryPoint:
    points = [point for point in importlib.metadata.entry_points(group=GROUP) if point.name == "eplb"]
    assert len(points) == 1, f"the project's {GROUP} entry point is not installed: run the README's set-up"
    return points[0]


def new_process(monkeypatch) -> None:
    """The environment of a vLLM process nothing started: no `EPLB_VLLM_*` variable and no Ray copy list (what the
    plugin writes there is undone when the test ends)."""
    for variable in [name for name in os.environ if name.startswith("EPLB_VLLM_")]:
        monkeypatch.delenv(variable)
    for variable in (vllm_plugin.RESOLVED_VARIABLE, vllm_plugin.RAY_COPY_VARIABLE):
        monkeypatch.setenv(variable, "")  # recorded, so that the end of the test removes what the plugin writes
        monkeypatch.delenv(variable)


@pytest.fixture
def registry(monkeypatch):
    """A stand-in for vLLM's `vllm.distributed.eplb.policy` module: `EPLB_POLICIES` with vLLM's own default."""
    module = types.ModuleType("vllm.distributed.eplb.policy")
    module.EPLB_POLICIES = {"default": "vLLM's DefaultEplbPolicy"}
    monkeypatch.setitem(sys.modules, "vllm.distributed.eplb.policy", module)
    new_process(monkeypatch)
    return module.EPLB_POLICIES


def test_the_installed_entry_point_is_the_plugin_function():
    assert _entry_point().value == "eplb.engines.vllm.plugin:register_if_asked"
    assert _entry_point().load() is vllm_plugin.register_if_asked


def test_installing_changes_nothing_until_the_variable_asks(registry, monkeypatch):
    plugin = _entry_point().load()
    plugin()
    assert registry == {"default": "vLLM's DefaultEplbPolicy"}
    new_process(monkeypatch)
    monkeypatch.setenv("EPLB_VLLM_POLICY", "cpsat")
    plugin()
    assert registry["default"] is CpsatEplbPolicy and set(registry) == {"default"}


def test_the_variables_choose_the_policy_and_its_budget():
    assert policy_from_environment({}) is None and policy_from_environment({"EPLB_VLLM_POLICY": " "}) is None
    assert policy_from_environment({"EPLB_VLLM_POLICY": "cpsat"}) is CpsatEplbPolicy
    deepseek = policy_from_environment({"EPLB_VLLM_POLICY": "deepseek"})
    assert issubclass(deepseek, CpsatEplbPolicy) and deepseek.policy == "deepseek"
    budgeted = policy_from_environment({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "2.5"})
    assert budgeted.policy == "cpsat" and budgeted.work_limit == 2.5
    seeded = policy_from_environment({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "2", "EPLB_VLLM_SEED": "7"})
    assert (seeded.work_limit, seeded.seed, seeded.time_limit_s) == (2.0, 7, None)


@pytest.mark.parametrize("environ, names", [
    ({"EPLB_VLLM_POLICY": "greedy"}, "EPLB_VLLM_POLICY='greedy' is not one of cpsat, deepseek"),
    ({"EPLB_VLLM_WORK_LIMIT": "5"}, "set EPLB_VLLM_POLICY=cpsat"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "nan"}, "EPLB_VLLM_WORK_LIMIT='nan' must be"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "-1"}, "EPLB_VLLM_WORK_LIMIT='-1' must be"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "1e300"}, "EPLB_VLLM_WORK_LIMIT='1e300'"),
    ({"EPLB_VLLM_POLICY": "deepseek", "EPLB_VLLM_WORK_LIMIT": "5"}, "applies to EPLB_VLLM_POLICY=cpsat only"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "1e-300"},
     "EPLB_VLLM_WORK_LIMIT='1e-300': work_limit must be a number of work units in [0.001, 1e+06]"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_TIME_LIMIT": "5"},
     "EPLB_VLLM_TIME_LIMIT is set, but vLLM computes the map on every rank"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORKLIMIT": "5"},
     "EPLB_VLLM_WORKLIMIT is set, but the plugin takes EPLB_VLLM_POLICY, EPLB_VLLM_WORK_LIMIT, EPLB_VLLM_SEED only"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_SEED": "-1"}, "EPLB_VLLM_SEED='-1' must be an integer in [0, 2^31)"),
    ({"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_SEED": "2147483648"}, "EPLB_VLLM_SEED='2147483648': seed must be "
                                                                   "below 2^31"),
    ({"EPLB_VLLM_SEED": "3"}, "EPLB_VLLM_SEED='3' is set but EPLB_VLLM_POLICY is not"),
    ({"EPLB_VLLM_POLICY": "deepseek", "EPLB_VLLM_SEED": "3"}, "EPLB_VLLM_SEED applies to EPLB_VLLM_POLICY=cpsat"),
], ids=["unknown-policy", "budget-without-policy", "budget-nan", "budget-negative", "budget-absurd",
        "budget-with-deepseek", "budget-vanishing", "time-limit", "misspelt-variable", "seed-negative", "seed-huge",
        "seed-without-policy", "seed-with-deepseek"])
def test_a_value_the_plugin_cannot_use_stops_start_up_in_one_line(registry, monkeypatch, environ, names):
    for variable, value in environ.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(PluginSettingError) as raised:
        vllm_plugin.register_if_asked()
    assert names in str(raised.value) and "\n" not in str(raised.value)
    assert registry == {"default": "vLLM's DefaultEplbPolicy"}  # nothing registered


def test_vllms_own_lookup_returns_this_policy_only_with_the_switch(monkeypatch):
    # vLLM's policy package by path (its __init__ needs only EPLBPolicyOption), put where the plugin imports it
    reference_spec = importlib.util.spec_from_file_location(
        "_vllm_reference_helpers", Path(__file__).with_name("test_vllm_reference.py"))
    reference = importlib.util.module_from_spec(reference_spec)
    reference_spec.loader.exec_module(reference)
    BY_PATH, policy_option_values, vllm_root = reference.BY_PATH, reference.policy_option_values, reference.vllm_root
    root = vllm_root()
    policy_dir = None if root is None else root / "distributed" / "eplb" / "policy"
    if policy_dir is None or not (policy_dir / "__init__.py").is_file():
        pytest.skip("vLLM (vllm/distributed/eplb/policy) is not installed")
    parallel = types.ModuleType("vllm.config.parallel")
    parallel.EPLBPolicyOption = Literal[policy_option_values(root)]
    monkeypatch.setitem(sys.modules, "vllm.config.parallel", parallel)
    spec = importlib.util.spec_from_file_location(BY_PATH, policy_dir / "__init__.py",
                                                  submodule_search_locations=[str(policy_dir)])
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, BY_PATH, package)
    spec.loader.exec_module(package)
    monkeypatch.setitem(sys.modules, "vllm.distributed.eplb.policy", package)
    vllms_own = package.EPLB_POLICIES["default"]
    try:  # vLLM's own loader of general plugins, where its module imports without vLLM's other dependencies
        from vllm.plugins import load_general_plugins

        def load() -> None:
            import vllm.plugins

            monkeypatch.setattr(vllm.plugins, "plugins_loaded", False, raising=False)
            load_general_plugins()
    except Exception:  # noqa: BLE001 - any import failure: run the entry points as that loader does
        def load() -> None:
            for point in importlib.metadata.entry_points(group=GROUP):
                if point.name == "eplb":
                    point.load()()

    new_process(monkeypatch)
    load()
    assert package.EPLB_POLICIES["default"] is vllms_own and vllms_own.__name__ == "DefaultEplbPolicy"
    new_process(monkeypatch)
    monkeypatch.setenv("EPLB_VLLM_POLICY", "cpsat")
    load()
    assert package.EPLB_POLICIES["default"] is CpsatEplbPolicy
