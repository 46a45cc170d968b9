"""Load a script of `scripts/` as a module, its own folder importable while it loads (bench scripts import their
neighbours: machine.py, step.py)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import ROOT


def load_script(relative: str) -> ModuleType:
    """The module of `ROOT / relative` (e.g. "scripts/bench/update_rate.py")."""
    path = ROOT / relative
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
