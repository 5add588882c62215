"""A package's public names imported on first access (PEP 562), so that importing the package stays cheap.

In the bottom layer, beside the errors, so that every package of the project (collectives included) can use it.
"""

import importlib
from collections.abc import Callable


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """The module-level `__getattr__` of `package`: `names` maps each public name to the module that defines it,
    imported when the name is first read; any other name raises AttributeError as a module does."""

    def __getattr__(name: str) -> object:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
