"""Package namespaces that name their public API without importing it.

``supernet`` and ``supernet.search`` re-export their models and search pieces for convenience
(``from supernet import SubnetConfig``), but importing any submodule runs the package's
``__init__`` first. Eager re-exports would load torch for every command line that merely offers a
search; with these hooks (PEP 562) a name's module is imported when the name is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each public
    name to the module that defines it."""
    namespace = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(namespace, name, value)  # later reads skip this hook
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(namespace), *exports})

    return __getattr__, __dir__
