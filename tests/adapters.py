"""What the adapters' tests share (exactly_once.internals): a fresh copy of an adapter module,
whose gate is asked again, while the module in use stays as it is."""

from __future__ import annotations

import importlib.util
import types


def fresh_module(name: str) -> types.ModuleType:
    """A new copy of module `name`, imported again (not put in sys.modules)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
