"""The `vllm.general_plugins` entry point this project declares: it makes `CpsatEplbPolicy` vLLM's EPLB policy only
when the environment asks for it, so installing the project beside vLLM changes nothing by itself.

vLLM 0.33 runs every `vllm.general_plugins` entry point in each of its processes before a model is built
(`vllm.plugins.load_general_plugins`) and picks its policy as `EPLB_POLICIES[eplb_config.policy]`, where the policy
name can only be "default"; so the switch is an environment variable every vLLM process inherits:

  EPLB_VLLM_POLICY         unset or empty: vLLM's own policy; "cpsat": this project's (`CpsatEplbPolicy`);
                           "deepseek": `CpsatEplbPolicy.configured(policy="deepseek")`, vLLM's own placement with
                           this project's slot keeping
  EPLB_VLLM_WORK_LIMIT     optional, with "cpsat": the solver's deterministic work budget per call (seconds of
                           work, the same map on every rank), as `CpsatEplbPolicy.configured(work_limit=...)`

A value it cannot use stops vLLM's start-up with one line naming the variable, rather than serving with a policy
the operator did not ask for.
"""

import math
import os

POLICY_VARIABLE = "EPLB_VLLM_POLICY"
WORK_LIMIT_VARIABLE = "EPLB_VLLM_WORK_LIMIT"
CHOICES = ("cpsat", "deepseek")


class PluginSettingError(ValueError):
    """An `EPLB_VLLM_*` variable holds a value the plugin cannot use."""


def policy_from_environment(environ: dict[str, str] | None = None):
    """The policy class the environment asks for (`EPLB_VLLM_POLICY`, `EPLB_VLLM_WORK_LIMIT`), or None when it asks
    for none (vLLM's own policy then serves).

    Raises:
        PluginSettingError: a variable holds a value the plugin cannot use (the message names it and the choices).
    """
    environ = os.environ if environ is None else environ
    name = environ.get(POLICY_VARIABLE, "").strip()
    work = environ.get(WORK_LIMIT_VARIABLE, "").strip()
    if not name:
        if work:
            raise PluginSettingError(f"{WORK_LIMIT_VARIABLE}={work!r} is set but {POLICY_VARIABLE} is not; set "
                                     f"{POLICY_VARIABLE}=cpsat, or unset {WORK_LIMIT_VARIABLE}")
        return None
    if name not in CHOICES:
        raise PluginSettingError(f"{POLICY_VARIABLE}={name!r} is not one of {', '.join(CHOICES)}; unset it for "
                                 f"vLLM's own policy")
    from eplb.adapters.vllm_policy import CpsatEplbPolicy

    if not work:
        return CpsatEplbPolicy if name == "cpsat" else CpsatEplbPolicy.configured(policy="deepseek")
    if name != "cpsat":
        raise PluginSettingError(f"{WORK_LIMIT_VARIABLE} applies to {POLICY_VARIABLE}=cpsat only; unset it with "
                                 f"{POLICY_VARIABLE}={name}")
    try:
        work_limit = float(work)
    except ValueError:
        work_limit = math.nan
    if not (math.isfinite(work_limit) and work_limit > 0):
        raise PluginSettingError(f"{WORK_LIMIT_VARIABLE}={work!r} must be a number of seconds of work > 0, e.g. 5")
    try:
        return CpsatEplbPolicy.configured(work_limit=work_limit)
    except ValueError as exc:
        raise PluginSettingError(f"{WORK_LIMIT_VARIABLE}={work!r}: {exc}") from exc


def register_if_asked() -> None:
    """The entry point: put the policy the environment asks for in vLLM's `EPLB_POLICIES["default"]` (in place: the
    dict vLLM's `EplbState` reads), or leave vLLM's own there when it asks for none. vLLM is imported only then."""
    policy = policy_from_environment()
    if policy is None:
        return
    from vllm.distributed.eplb.policy import EPLB_POLICIES

    EPLB_POLICIES["default"] = policy
