"""The fuzz targets of ``fuzz/targets.py`` in the test suite: a short smoke run of each, and every crasher replayed.

``fuzz/targets.py`` is loaded by path: under pytest this package is itself
importable as ``fuzz`` (``tests/`` is on ``sys.path``), which would shadow
the top-level ``fuzz/`` directory.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_targets() -> ModuleType:
    name = "kxen_fuzz_targets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "fuzz" / "targets.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
