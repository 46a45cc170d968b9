"""The math and the selectors import light (docs/architecture.md): `algorithms/`, `records/` and `selectors/` run on
tensors alone, so importing them must not load transformers' model stack (several seconds, and a dependency a
selector or a loss never needs). Each import runs in a fresh interpreter, where nothing was loaded before it."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIGHT = [
    "tokenrl.selectors",
    "tokenrl.algorithms.grpo",
    "tokenrl.algorithms.logit_statistics",
    "tokenrl.records.selection",
]


@pytest.mark.parametrize("module", LIGHT)
def test_importing_the_math_does_not_load_transformers(module):
    probe = f"import sys, {module}; print(sorted(name for name in sys.modules if name.split('.')[0] == 'transformers'))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"import {module} loads transformers: {done.stdout.strip()[:300]}"
