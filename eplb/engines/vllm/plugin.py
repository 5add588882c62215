"""The `vllm.general_plugins` entry point this project declares: it makes `CpsatEplbPolicy` vLLM's EPLB policy only
when the environment asks for it, so installing the project beside vLLM changes no policy by itself.

vLLM 0.33 runs every `vllm.general_plugins` entry point in each of its processes before a model is built
(`vllm.plugins.load_general_plugins`) and picks its policy as `EPLB_POLICIES[eplb_config.policy]`, where the policy
name can only be "default"; so the switch is an environment variable every vLLM process inherits:

  EPLB_VLLM_POLICY         unset or empty: vLLM's own policy; "cpsat": this project's (`CpsatEplbPolicy`);
                           "deepseek": `CpsatEplbPolicy.configured(policy="deepseek")`, vLLM's own placement with
                           this project's slot keeping
  EPLB_VLLM_WORK_LIMIT     optional, with "cpsat": the solver's deterministic work budget per call (seconds of
                           work, the same map on every rank), as `CpsatEplbPolicy.configured(work_limit=...)`
  EPLB_VLLM_SEED           optional, with "cpsat": the solver's seed, an integer in [0, 2^31) (the same on every
                           rank, as every vLLM process inherits it), as `CpsatEplbPolicy.configured(seed=...)`

A value it cannot use stops vLLM's start-up with one line naming the variable, rather than serving with a policy
the operator did not ask for; so does any other `EPLB_VLLM_*` variable, a typo of these or `EPLB_VLLM_TIME_LIMIT`
(vLLM computes the map on every rank and broadcasts nothing: a wall-clock budget would give ranks different maps).

Every rank must serve the same policy, and vLLM on Ray does not carry these variables by itself: its engine actors
(`--data-parallel-backend ray`) get only the driver's variables with vLLM's own prefixes and those named in
`VLLM_RAY_EXTRA_ENV_VARS_TO_COPY` (`vllm/ray/ray_env.py`), and its Ray workers take the driver's variables only where
the node has none of its own (`vllm/v1/executor/ray_env_utils.py`). So in each process it runs in, the plugin

  - adds the `EPLB_VLLM_*` variables set there to `VLLM_RAY_EXTRA_ENV_VARS_TO_COPY` (a `VLLM_` variable, copied on
    too), so the setting reaches every Ray process that process starts;
  - records what it resolved in `EPLB_VLLM_RESOLVED` ("vllm" for vLLM's own policy), which those processes inherit,
    and stops with one line when the launcher's record differs from what it resolves itself (a node whose own
    `EPLB_VLLM_*` values differ from the driver's, or that sets them where the driver does not).
"""

import math
import os

POLICY_VARIABLE = "EPLB_VLLM_POLICY"
WORK_LIMIT_VARIABLE = "EPLB_VLLM_WORK_LIMIT"
SEED_VARIABLE = "EPLB_VLLM_SEED"
RESOLVED_VARIABLE = "EPLB_VLLM_RESOLVED"  # written by the plugin, never by hand: what the launching process resolved
RAY_COPY_VARIABLE = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"  # vLLM's own list of extra variables its Ray processes get
PREFIX = "EPLB_VLLM_"
VLLMS_OWN = "vllm"  # the setting recorded when no policy is asked for
CHOICES = ("cpsat", "deepseek")
# Why a variable the plugin does not take is refused, where there is more to say than that it is unknown.
REFUSED = {"EPLB_VLLM_TIME_LIMIT": "vLLM computes the map on every rank and broadcasts nothing, and a wall-clock "
                                   "budget would give ranks different maps; set EPLB_VLLM_WORK_LIMIT (deterministic "
                                   "work) instead"}


class PluginSettingError(ValueError):
    """An `EPLB_VLLM_*` variable holds a value the plugin cannot use."""


def policy_from_environment(environ: dict[str, str] | None = None):
    """The policy class the environment asks for (`EPLB_VLLM_POLICY`, `EPLB_VLLM_WORK_LIMIT`, `EPLB_VLLM_SEED`), or
    None when it asks for none (vLLM's own policy then serves).

    Raises:
        PluginSettingError: a variable holds a value the plugin cannot use, or an `EPLB_VLLM_*` variable is not one it
            takes (the message names it and the choices).
    """
    environ = os.environ if environ is None else environ
    _refuse_unknown(environ)
    name = environ.get(POLICY_VARIABLE, "").strip()
    options = {variable: environ.get(variable, "").strip() for variable in (WORK_LIMIT_VARIABLE, SEED_VARIABLE)}
    given = [variable for variable, value in options.items() if value]
    if not name:
        if given:
            raise PluginSettingError(f"{given[0]}={options[given[0]]!r} is set but {POLICY_VARIABLE} is not; set "
                                     f"{POLICY_VARIABLE}=cpsat, or unset {given[0]}")
        return None
    if name not in CHOICES:
        raise PluginSettingError(f"{POLICY_VARIABLE}={name!r} is not one of {', '.join(CHOICES)}; unset it for "
                                 f"vLLM's own policy")
    from eplb.engines.vllm.policy import CpsatEplbPolicy

    if not given:
        return CpsatEplbPolicy if name == "cpsat" else CpsatEplbPolicy.configured(policy="deepseek")
    if name != "cpsat":
        raise PluginSettingError(f"{given[0]} applies to {POLICY_VARIABLE}=cpsat only; unset it with "
                                 f"{POLICY_VARIABLE}={name}")
    work, seed = options[WORK_LIMIT_VARIABLE], options[SEED_VARIABLE]
    chosen = {}
    if work:
        chosen["work_limit"] = _number(work, WORK_LIMIT_VARIABLE, "a number of seconds of work, e.g. 5")
    if seed:
        if not (seed.isdecimal() and seed.isascii() and len(seed) <= 10):
            raise PluginSettingError(f"{SEED_VARIABLE}={seed[:40]!r} must be an integer in [0, 2^31), e.g. 0")
        chosen["seed"] = int(seed)
    try:
        return CpsatEplbPolicy.configured(**chosen)
    except ValueError as exc:
        variable = WORK_LIMIT_VARIABLE if "work_limit" in str(exc) else SEED_VARIABLE
        raise PluginSettingError(f"{variable}={options[variable][:40]!r}: {exc}") from exc


def _refuse_unknown(environ) -> None:
    """Raise `PluginSettingError` for an `EPLB_VLLM_*` variable the plugin does not take (a typo would otherwise
    serve with a setting the operator did not ask for)."""
    known = (POLICY_VARIABLE, WORK_LIMIT_VARIABLE, SEED_VARIABLE)
    for variable in sorted(environ):
        if variable.startswith(PREFIX) and variable not in known and variable != RESOLVED_VARIABLE:
            why = REFUSED.get(variable, f"the plugin takes {', '.join(known)} only")
            raise PluginSettingError(f"{variable} is set, but {why}; unset it")


def _number(text: str, variable: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise PluginSettingError(f"{variable}={text[:40]!r} must be {expected}")
    return value


def setting_of(policy) -> str:
    """What `policy` (a class from `policy_from_environment`, or None) serves, as `EPLB_VLLM_RESOLVED` records it:
    "vllm", "deepseek", or "cpsat work_limit=W seed=S"."""
    if policy is None:
        return VLLMS_OWN
    if policy.policy != "cpsat":
        return policy.policy
    return f"cpsat work_limit={policy.work_limit!r} seed={policy.seed}"


def agree_with_launcher(policy, environ) -> None:
    """Check `policy` against what the process that started this one resolved, then record it and pass the setting
    on to the Ray processes this one starts (the module docstring says why). Changes `environ` in place.

    Raises:
        PluginSettingError: `EPLB_VLLM_RESOLVED` holds another setting than this process's own.
    """
    mine = setting_of(policy)
    launcher = environ.get(RESOLVED_VARIABLE)
    if launcher is not None and launcher != mine:
        raise PluginSettingError(
            f"{RESOLVED_VARIABLE}: this vLLM process resolves {mine!r} but the vLLM process that started it resolved "
            f"{launcher!r}, and ranks on different policies load different experts into the same slots (vLLM "
            f"broadcasts no map); set the same EPLB_VLLM_* variables on every node (a Ray node's own values win "
            f"over the driver's) or unset them on every node")
    environ[RESOLVED_VARIABLE] = mine
    listed = [name.strip() for name in environ.get(RAY_COPY_VARIABLE, "").split(",") if name.strip()]
    ours = sorted(name for name in environ if name.startswith(PREFIX))
    environ[RAY_COPY_VARIABLE] = ",".join(listed + [name for name in ours if name not in listed])


def register_if_asked(environ=None) -> None:
    """The entry point: put the policy the environment asks for in vLLM's `EPLB_POLICIES["default"]` (in place: the
    dict vLLM's `EplbState` reads), or leave vLLM's own there when it asks for none; either way check it against the
    launching process's and pass it on to Ray processes (`agree_with_launcher`). vLLM is imported only to register.

    Args:
        environ: the variables to read and extend (default `os.environ`, as vLLM calls it).
    """
    environ = os.environ if environ is None else environ
    policy = policy_from_environment(environ)
    agree_with_launcher(policy, environ)
    if policy is None:
        return
    from vllm.distributed.eplb.policy import EPLB_POLICIES

    EPLB_POLICIES["default"] = policy
