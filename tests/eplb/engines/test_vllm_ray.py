"""vLLM on Ray: the plugin's setting reaches every Ray process, or a rank on another policy stops in one line.

vLLM 0.33 starts two kinds of Ray processes, each with its own rule for the driver's environment variables:
engine actors (`--data-parallel-backend ray`, `vllm/v1/engine/utils.py`) get the variables `get_env_vars_to_copy`
names (`vllm/ray/ray_env.py`: vLLM's prefixes, PYTHONHASHSEED and `VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`), over the
node's own values; Ray workers (`vllm/v1/executor/ray_executor_v2.py`) get every driver variable, but only where the
node has none of its own (`setdefault`). Both rules are reproduced here, from ray_env.py's own lists where vLLM is
installed, and the plugin runs as vLLM runs it: first in the driver, then in each process started from it.
"""

import ast
import importlib.util
import pathlib
import sys
import types

import pytest

from eplb import CpsatEplbPolicy
from eplb.engines.vllm.plugin import (PluginSettingError, agree_with_launcher, policy_from_environment,
                                       register_if_asked)

# vllm/ray/ray_env.py in vLLM 0.33.0: the prefixes and single names it copies to Ray engine actors.
PREFIXES_0_33 = {"VLLM_", "FLASH_ATTENTION_", "LMCACHE_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_"}
EXTRA_0_33 = {"PYTHONHASHSEED"}
NODE = {"PATH": "/usr/bin", "HOME": "/root"}  # what a Ray node's raylet gives its processes


def ray_env_lists() -> tuple[set[str], set[str]]:
    """`DEFAULT_ENV_VAR_PREFIXES` and `DEFAULT_EXTRA_ENV_VARS` read from the installed vLLM's ray_env.py (no import),
    else vLLM 0.33.0's."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    path = None if spec is None or not spec.submodule_search_locations else \
        pathlib.Path(next(iter(spec.submodule_search_locations))) / "ray" / "ray_env.py"
    if path is None or not path.is_file():
        return PREFIXES_0_33, EXTRA_0_33
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = ast.literal_eval(node.value)
    return found["DEFAULT_ENV_VAR_PREFIXES"], found["DEFAULT_EXTRA_ENV_VARS"]


def _csv(value: str) -> set[str]:
    return {name.strip() for name in value.split(",") if name.strip()}


def engine_actor_environment(driver: dict[str, str], node: dict[str, str]) -> dict[str, str]:
    """An engine actor's variables: the node's, overwritten by the driver's that `get_env_vars_to_copy` names."""
    prefixes, extra = ray_env_lists()
    prefixes = prefixes | _csv(driver.get("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY", ""))
    names = {name for name in driver if any(name.startswith(prefix) for prefix in prefixes)}
    names |= extra | _csv(driver.get("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", ""))
    return {**node, **{name: driver[name] for name in names if name in driver}}


def ray_worker_environment(driver: dict[str, str], node: dict[str, str]) -> dict[str, str]:
    """A Ray worker's variables: the node's, and every driver variable the node lacks."""
    return {**driver, **node}


RAY_PATHS = {"engine-actor": engine_actor_environment, "ray-worker": ray_worker_environment}


@pytest.fixture
def registry(monkeypatch):
    """A stand-in for vLLM's policy package: `EPLB_POLICIES` with vLLM's own default, fresh for each process."""
    module = types.ModuleType("vllm.distributed.eplb.policy")
    monkeypatch.setitem(sys.modules, "vllm.distributed.eplb.policy", module)

    def fresh() -> dict:
        module.EPLB_POLICIES = {"default": "vLLM's DefaultEplbPolicy"}
        return module.EPLB_POLICIES

    return fresh


def launch(driver: dict[str, str], node: dict[str, str], path: str, registry) -> dict:
    """The plugin in the driver, then in a process that driver starts on `node` by `path`: that process's registry."""
    driver = dict(driver)
    registry()
    register_if_asked(driver)
    policies = registry()
    register_if_asked(RAY_PATHS[path](driver, node))
    return policies


def test_the_copy_rule_alone_loses_the_setting_on_the_way_to_an_engine_actor():
    """Why the plugin must act: vLLM's own rule drops EPLB_VLLM_POLICY."""
    assert "EPLB_VLLM_POLICY" not in engine_actor_environment({**NODE, "EPLB_VLLM_POLICY": "cpsat"}, NODE)


def test_the_mirrored_lists_are_the_installed_vllms():
    assert ray_env_lists() == (PREFIXES_0_33, EXTRA_0_33)


@pytest.mark.parametrize("path", sorted(RAY_PATHS))
def test_the_drivers_setting_reaches_every_ray_process(registry, path):
    driver = {**NODE, "EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_WORK_LIMIT": "2.5", "EPLB_VLLM_SEED": "7",
              "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "MY_VAR"}
    policy = launch(driver, NODE, path, registry)["default"]
    assert issubclass(policy, CpsatEplbPolicy) and (policy.work_limit, policy.seed) == (2.5, 7)


@pytest.mark.parametrize("path", sorted(RAY_PATHS))
def test_without_a_setting_every_ray_process_keeps_vllms_policy(registry, path):
    assert launch(NODE, NODE, path, registry) == {"default": "vLLM's DefaultEplbPolicy"}


@pytest.mark.parametrize(("driver", "node", "resolves", "launcher"), [
    ({"EPLB_VLLM_POLICY": "cpsat"}, {"EPLB_VLLM_POLICY": "deepseek"}, "deepseek", "cpsat work_limit=1.0 seed=0"),
    ({}, {"EPLB_VLLM_POLICY": "cpsat"}, "cpsat work_limit=1.0 seed=0", "vllm"),
    ({"EPLB_VLLM_POLICY": "cpsat"}, {"EPLB_VLLM_POLICY": "cpsat", "EPLB_VLLM_SEED": "3"},
     "cpsat work_limit=1.0 seed=3", "cpsat work_limit=1.0 seed=0"),
], ids=["node-on-another-policy", "node-set-driver-not", "node-with-another-seed"])
def test_a_ray_worker_whose_node_sets_another_policy_stops_in_one_line(registry, driver, node, resolves, launcher):
    """A Ray worker keeps its node's own values over the driver's: it resolves another policy, and stops."""
    with pytest.raises(PluginSettingError) as raised:
        launch({**NODE, **driver}, {**NODE, **node}, "ray-worker", registry)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("EPLB_VLLM_RESOLVED: this vLLM process resolves")
    assert f"resolves {resolves!r} but the vLLM process that started it resolved {launcher!r}" in message


def test_the_plugin_keeps_the_operators_own_ray_copy_list():
    environ = {"EPLB_VLLM_POLICY": "deepseek", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "A, B"}
    agree_with_launcher(policy_from_environment(environ), environ)
    assert environ["VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"] == "A,B,EPLB_VLLM_POLICY,EPLB_VLLM_RESOLVED"
    assert environ["EPLB_VLLM_RESOLVED"] == "deepseek"
