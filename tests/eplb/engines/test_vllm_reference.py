"""vLLM's policy interface checked against vLLM's own files, loaded by file path from the installed `vllm` package
(`abstract.py` and `default.py` import only torch and numpy, so vLLM's other dependencies are not needed); skipped
where vLLM is not installed. The signature and return contract equal `AbstractEplbPolicy`'s, the classes subclass it
when it can be imported, `policy="deepseek"` returns exactly what `DefaultEplbPolicy` returns (old maps with -1 and of
another width included), and the registration in eplb/engines/vllm/README.md puts the class where `EplbState` looks."""

import ast
import importlib
import importlib.util
import inspect
import pathlib
import sys
import types
from typing import Literal

import pytest
import torch

from eplb import CpsatEplbPolicy, LegacyCpsatEplbPolicy
from eplb.engines.vllm import policy as vllm_policy

DEEPSEEK = CpsatEplbPolicy.configured(policy="deepseek")
BY_PATH = "_vllm_eplb_policy_by_path"  # the package name vLLM's policy files are loaded under


def vllm_root() -> pathlib.Path | None:
    """The installed `vllm` package's folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def vllm_files():
    """vLLM's `abstract` and `default` policy modules, loaded by path under `BY_PATH`."""
    root = vllm_root()
    policy_dir = None if root is None else root / "distributed" / "eplb" / "policy"
    if policy_dir is None or not (policy_dir / "default.py").is_file():
        pytest.skip("vLLM (vllm/distributed/eplb/policy/default.py) is not installed")
    package = types.ModuleType(BY_PATH)
    package.__path__ = [str(policy_dir)]
    sys.modules[BY_PATH] = package
    try:
        abstract = importlib.import_module(f"{BY_PATH}.abstract")
        default = importlib.import_module(f"{BY_PATH}.default")
        yield types.SimpleNamespace(root=root, policy_dir=policy_dir, abstract_module=abstract,
                                    AbstractEplbPolicy=abstract.AbstractEplbPolicy,
                                    DefaultEplbPolicy=default.DefaultEplbPolicy)
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == BY_PATH]:
            del sys.modules[name]


def test_the_signature_and_return_type_are_vllms(vllm_files):
    theirs = inspect.signature(vllm_files.AbstractEplbPolicy.rebalance_experts)
    assert theirs == inspect.signature(vllm_files.DefaultEplbPolicy.rebalance_experts)
    assert inspect.signature(CpsatEplbPolicy.rebalance_experts) == theirs
    legacy = inspect.signature(LegacyCpsatEplbPolicy.rebalance_experts)
    assert legacy.parameters == theirs.parameters
    assert legacy.return_annotation == tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    for policy_class in (vllm_files.AbstractEplbPolicy, CpsatEplbPolicy, LegacyCpsatEplbPolicy):
        assert isinstance(inspect.getattr_static(policy_class, "rebalance_experts"), classmethod)


def test_the_classes_subclass_vllms_abstract_policy_when_it_can_be_imported(vllm_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm.distributed.eplb.policy.abstract", vllm_files.abstract_module)
    spec = importlib.util.spec_from_file_location("_eplb_vllm_policy_probe", vllm_policy.__file__)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    for policy_class in (probe.CpsatEplbPolicy, probe.LegacyCpsatEplbPolicy):
        assert issubclass(policy_class, vllm_files.AbstractEplbPolicy) and not inspect.isabstract(policy_class)
    weight = torch.arange(24.0).view(2, 12)
    assert torch.equal(probe.CpsatEplbPolicy.configured(policy="deepseek").rebalance_experts(weight, 16, 4, 2, 8),
                       vllm_files.DefaultEplbPolicy.rebalance_experts(weight, 16, 4, 2, 8))


SHAPES = [  # (experts, slots, groups, nodes, ranks): long rows, where numpy's and torch's orders of ties differ
    (256, 288, 1, 1, 144),
    (64, 96, 1, 1, 48),
    (256, 320, 8, 4, 64),
    (128, 192, 16, 2, 96),
    (60, 64, 3, 2, 8),
]
SHAPE_IDS = ["global-144-ranks", "global-48-ranks", "hier-4-nodes-64-ranks", "hier-2-nodes-96-ranks",
             "groups-not-per-node"]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_the_deepseek_option_equals_vllms_default_policy_with_and_without_an_old_map(vllm_files, expert_loads,
                                                                                      shape):
    experts, slots, groups, nodes, ranks = shape
    per_rank = slots // ranks
    generator = torch.Generator().manual_seed(experts + ranks)
    default = vllm_files.DefaultEplbPolicy
    for kind in ("ties", "lognormal", "normalised"):
        weight = expert_loads(kind, generator, 3, experts)
        expected = default.rebalance_experts(weight, slots, groups, nodes, ranks)
        got = DEEPSEEK.rebalance_experts(weight, slots, groups, nodes, ranks)
        assert got.dtype == expected.dtype == torch.int64 and got.device == expected.device
        assert torch.equal(got, expected), kind
        old = expected[:, torch.randperm(slots, generator=generator)]
        old[:, : per_rank + 1] = -1  # unused slots
        wider = torch.cat([old, old[:, : 2 * per_rank]], dim=1)  # two more ranks: after scale-down, vLLM's cut
        for old_map in (old, wider):
            expected = default.rebalance_experts(weight, slots, groups, nodes, ranks, old_map)
            assert torch.equal(DEEPSEEK.rebalance_experts(weight, slots, groups, nodes, ranks, old_map), expected)


@pytest.mark.parametrize("shape", [shape for shape in SHAPES if shape[2] % shape[3] == 0 and shape[3] > 1],
                         ids=[name for name, shape in zip(SHAPE_IDS, SHAPES) if shape[2] % shape[3] == 0
                              and shape[3] > 1])
def test_cpsat_keeps_every_group_on_one_node_where_vllms_default_does(vllm_files, expert_loads, shape):
    experts, slots, groups, nodes, ranks = shape
    generator = torch.Generator().manual_seed(experts + ranks)
    node_of_slot = torch.arange(slots) // (slots // nodes)
    for kind in ("ties", "lognormal", "normalised"):
        weight = expert_loads(kind, generator, 3, experts)
        for policy in (vllm_files.DefaultEplbPolicy, CpsatEplbPolicy):
            phy2log = policy.rebalance_experts(weight, slots, groups, nodes, ranks)
            for row in phy2log:
                for group in range(groups):
                    on_nodes = node_of_slot[row // (experts // groups) == group].unique()
                    assert len(on_nodes) == 1, (kind, policy.__name__, group, on_nodes.tolist())


def policy_option_values(root: pathlib.Path) -> tuple[str, ...]:
    """The values of `EPLBPolicyOption = Literal[...]` in vLLM's config/parallel.py, read without importing it."""
    tree = ast.parse((root / "config" / "parallel.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["EPLBPolicyOption"]:
            values = node.value.slice
            return tuple(ast.literal_eval(v) for v in (values.elts if isinstance(values, ast.Tuple) else [values]))
    pytest.skip("vLLM's config/parallel.py has no EPLBPolicyOption")


def test_the_documented_registration_puts_the_class_where_eplb_state_looks(vllm_files, monkeypatch):
    # vLLM's policy package, loaded by path: its __init__ needs only EPLBPolicyOption from vllm.config.parallel.
    options = policy_option_values(vllm_files.root)
    parallel = types.ModuleType("vllm.config.parallel")
    parallel.EPLBPolicyOption = Literal[options]
    monkeypatch.setitem(sys.modules, "vllm.config.parallel", parallel)
    spec = importlib.util.spec_from_file_location(BY_PATH, vllm_files.policy_dir / "__init__.py",
                                                  submodule_search_locations=[str(vllm_files.policy_dir)])
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, BY_PATH, package)
    spec.loader.exec_module(package)
    registry = package.EPLB_POLICIES  # the dict `eplb_state.py` imports by name: it must change in place
    monkeypatch.setitem(sys.modules, "vllm.distributed.eplb.policy", package)

    vllm_policy.register_in_vllm()

    assert package.EPLB_POLICIES is registry and set(registry) == set(options)
    chosen = registry["default"]  # EplbState: EPLB_POLICIES[parallel_config.eplb_config.policy], "default"
    assert chosen is CpsatEplbPolicy
    weight = torch.arange(24, dtype=torch.int32).view(2, 12)
    new_map = chosen.rebalance_experts(weight, 16, 4, 2, 8, torch.arange(16).remainder(12).expand(2, 16))
    assert new_map.device == torch.device("cpu") and new_map.dtype == torch.int64 and new_map.shape == (2, 16)


TIE_SHAPES = [  # (experts, slots, groups, nodes, ranks): global and hierarchical, with and without spare slots
    (128, 192, 16, 2, 96),
    (64, 96, 1, 1, 48),
    (64, 64, 8, 8, 64),
    (32, 32, 8, 4, 16),
]
TIE_LAYERS = 20  # enough layers that the cpsat budget leaves some at the greedy it falls back to


def tie_heavy_loads(generator: torch.Generator, experts: int) -> list[tuple[str, torch.Tensor]]:
    """[TIE_LAYERS, experts] loads where many items sort equal: integers 0-3, small Poisson counts, and 0-1 with
    all-zero layers among them."""
    integers = torch.randint(0, 4, (TIE_LAYERS, experts), generator=generator)
    poisson = torch.poisson(torch.full((TIE_LAYERS, experts), 0.7), generator=generator)
    with_zeros = torch.randint(0, 2, (TIE_LAYERS, experts), generator=generator)
    with_zeros[::4] = 0
    return [("integers-0-3", integers), ("poisson-0.7", poisson), ("zero-layers", with_zeros)]


def busiest_rank_L(phy2log: torch.Tensor, weight: torch.Tensor, ranks: int) -> torch.Tensor:
    """[L] float64: the busiest rank's load under equal split (vLLM's routing) of the map [L, P]."""
    weight = weight.double()
    replicas = torch.zeros_like(weight).scatter_add_(1, phy2log, torch.ones_like(phy2log, dtype=torch.float64))
    per_slot = torch.gather(weight / replicas.clamp(min=1), 1, phy2log)
    return per_slot.view(len(phy2log), ranks, -1).sum(-1).max(-1).values


def check_never_worse_on_ties(default_policy, shape) -> None:
    experts, slots, groups, nodes, ranks = shape
    generator = torch.Generator().manual_seed(2)
    for kind, weight in tie_heavy_loads(generator, experts):
        theirs = default_policy.rebalance_experts(weight, slots, groups, nodes, ranks)
        ours = CpsatEplbPolicy.rebalance_experts(weight, slots, groups, nodes, ranks)
        worse = busiest_rank_L(ours, weight, ranks) > busiest_rank_L(theirs, weight, ranks) + 1e-9
        assert not worse.any(), (kind, worse.nonzero().flatten().tolist())


@pytest.mark.parametrize("shape", TIE_SHAPES, ids=[f"{e}e-{p}p-{g}g-{n}n-{r}r" for e, p, g, n, r in TIE_SHAPES])
def test_cpsat_is_never_worse_than_vllms_default_policy_on_ties(vllm_files, shape):
    check_never_worse_on_ties(vllm_files.DefaultEplbPolicy, shape)


@pytest.mark.parametrize("shape", TIE_SHAPES, ids=[f"{e}e-{p}p-{g}g-{n}n-{r}r" for e, p, g, n, r in TIE_SHAPES])
def test_cpsat_is_never_worse_than_the_vllm_default_it_reproduces_on_ties(shape):
    check_never_worse_on_ties(DEEPSEEK, shape)  # policy "deepseek": vLLM's DefaultEplbPolicy, result for result
