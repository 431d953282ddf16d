"""The optional libraries of the integrations: imported on first use, and where one is missing,
one line saying which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from userturn.errors import UserturnError

EXTRAS = {"inspect_ai": ("inspect_ai", "inspect"), "datasets": ("datasets", "hub")}


def require(module: str, purpose: str) -> ModuleType:
    """``module`` imported, or a UserturnError naming the extra to install for ``purpose``."""
    top = module.split(".")[0]
    package, extra = EXTRAS[top]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserturnError(f"{purpose} needs {package}: pip install 'userturn[{extra}]'"
                            ) from None
