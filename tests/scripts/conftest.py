"""What the script tests share: a script under `scripts/` loaded by its path as a module, to call its `main` in the
test's process (scripts are not a package; nothing imports them otherwise)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_script():
    """`load_script(name)`: `scripts/<name>.py` loaded as a module (a fresh module each call)."""
    return _load
