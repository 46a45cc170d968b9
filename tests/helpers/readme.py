"""The README's code, read where tests run it verbatim."""

from __future__ import annotations

import re

from tests.conftest import ROOT

BLOCK = re.compile(r"^```(?:python|yaml)\n# (?P<path>\S+)[^\n]*\n(?P<body>.*?)^```", re.M | re.S)


def recipe_files() -> dict[str, str]:
    """path -> text of each code block of the README's add-selector recipe (its first line names the path)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    recipe = readme.split("<!-- --8<-- [start:add-selector] -->", 1)[1].split("<!-- --8<-- [end:add-selector] -->")[0]
    return {match["path"]: match[0].split("\n", 1)[1].rsplit("```", 1)[0] for match in BLOCK.finditer(recipe)}
