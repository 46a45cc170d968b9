"""The package's layers (docs/architecture.md): no module imports sideways or upward, no two files of one unit import
each other (directly or round a loop), every module is placed, and the package root holds only the helpers every
layer uses."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import load_script

structure = load_script("scripts/structure.py")  # the rules' functions, shared with the page's numbers
ROOT, PACKAGE = structure.ROOT, structure.PACKAGE
documented_layers, unit_of, module_name = structure.documented_layers, structure.unit_of, structure.module_name
imports, sources, cycles, unit_graph = structure.imports, structure.sources, structure.cycles, structure.unit_graph


def sideways_or_upward(name: str, found: list[tuple[int, str]], layers: dict[str, int]) -> list[str]:
    """The imports of module `name` that reach its own layer (another unit) or a layer above."""
    mine = unit_of(name)
    return [
        f"line {line}: {target} (layer {layers[unit_of(target)]}, this is layer {layers[mine]})"
        for line, target in found
        if mine is not None and unit_of(target) not in (None, mine) and layers[unit_of(target)] >= layers[mine]
    ]


def test_the_layer_table_places_every_module_once():
    layers = documented_layers()
    units = {unit_of(module_name(path)) for path in sources()} - {None}
    assert sorted(units - set(layers)) == [], "modules docs/architecture.md does not place in a layer"
    assert sorted(set(layers) - units) == [], "docs/architecture.md places modules that do not exist"


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_its_own_layer_or_above(path):
    name = module_name(path)
    found = imports(path.read_text(), name, path.name == "__init__.py")
    assert sideways_or_upward(name, found, documented_layers()) == [], (
        f"{path.relative_to(ROOT)} imports sideways or upward (docs/architecture.md)"
    )


@pytest.mark.parametrize("unit", structure.units())
def test_no_two_files_of_a_unit_import_each_other(unit):
    assert cycles(unit_graph(unit)) == [], f"src/tokenrl/{unit}/ has an import cycle (move what both need below both)"


def test_the_cycle_check_finds_a_hidden_loop():
    """A loop closed by an import inside a function or under TYPE_CHECKING is a loop; a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tokenrl.algorithms.config import X\n"
    assert imports(source, "tokenrl.algorithms.surrogates") == [(3, "tokenrl.algorithms.config")]


def test_the_check_finds_hidden_relative_and_sideways_imports():
    """The check itself, on a made-up source of the math layer: a function-local relative import of the step and a
    TYPE_CHECKING import of the selectors and a `from tokenrl import run` are found and flagged; an import of the
    records is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from tokenrl.records.token_stats import TokenStats\n"
        "if TYPE_CHECKING:\n    from tokenrl.selectors.base import TokenSelector\n"
        "def f():\n    from ..step.update import ppo_update\n"
        "from tokenrl import run\n"
    )
    found = imports(source, "tokenrl.algorithms.grpo")
    assert sorted(target for _, target in found) == [
        "tokenrl.records.token_stats",
        "tokenrl.run",
        "tokenrl.selectors.base",
        "tokenrl.step.update",
    ]
    flagged = sideways_or_upward("tokenrl.algorithms.grpo", found, documented_layers())
    assert sorted(line.split(":")[0] for line in flagged) == ["line 4", "line 6", "line 7"]
    assert sideways_or_upward("tokenrl.step.update", [(1, "tokenrl.rollout.engine")], {"step": 5, "rollout": 5}) != []


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_signatures_take_at_most_five_parameters(path):
    """Wider is a record waiting to be named; a config node's constructor (its keywords are the YAML keys a user sets)
    and a signature an outer interface fixes (structure.FIXED_WIDTH) are the exceptions."""
    assert structure.unexplained_wide(path.read_text()) == [], f"{path.relative_to(ROOT)}: pass a record instead"


def test_the_width_check_counts_every_parameter():
    source = (
        "def f(a, b, c, d, e, *rest, **options): ...\n"
        "class ArithmeticTask:\n    def __init__(self, a, b, c, d, e, f): ...\n"
        "class Other:\n    def __init__(self, a, b, c, d, e, f): ...\n    def g(self, a, b, c, d, e): ...\n"
    )
    assert structure.wide_signatures(source) == {"f": 7, "ArithmeticTask.__init__": 6, "Other.__init__": 6}
    assert structure.unexplained_wide(source) == ["f", "Other.__init__"]


def test_the_structure_numbers_are_measured():
    """The page's numbers (scripts/structure.py): what the rules above promise, and what the house weighs."""
    found = structure.numbers()
    assert found["import cycles between units"] == found["import cycles between the files of a unit"] == 0
    assert found["units"] == len(documented_layers()) and found["layers"] == len(set(documented_layers().values()))
    assert found["lines"] == sum(len(path.read_text().splitlines()) for path in sources())
    assert structure.MARKER in (ROOT / "docs" / "architecture.md").read_text()


def test_the_package_root_holds_only_what_every_layer_uses():
    """Every module lives in a folder of the layer table; the root keeps the helpers all layers share."""
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "paths.py", "utils.py"], "a new module belongs in a folder (docs/architecture.md)"


def test_the_math_imports_only_the_records():
    """algorithms/ is the math, pure functions of tensors checked against float64 references: it imports no tokenrl
    unit but records/ (and its own modules), so a pass that runs a model lives in step/ (docs/architecture.md)."""
    reached = {
        f"{path.relative_to(PACKAGE)} line {line}: {target}"
        for path in sorted((PACKAGE / "algorithms").rglob("*.py"))
        for line, target in imports(path.read_text(), module_name(path), path.name == "__init__.py")
        if unit_of(target) not in ("records", "algorithms")
    }
    assert sorted(reached) == [], "algorithms/ imports beyond records/"
