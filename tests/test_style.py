"""The tree keeps the project's style: `ruff format` (120 columns) leaves every file as it is and `ruff check` finds
nothing (pyproject.toml [tool.ruff]; the same hooks run in .pre-commit-config.yaml)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_is_clean_on_the_whole_tree(command):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"ruff {' '.join(command)} .: run `ruff format . && ruff check --fix .`\n{done.stdout}"
