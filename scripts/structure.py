"""The structure of src/tokenrl, measured: its units (top-level modules and folders), the layer each sits on
(docs/architecture.md's table), the import arrows between units, import cycles, and the sizes that strain a house
(files over 300 lines, functions over 50). tests/test_layers.py checks the rules with these functions, and the docs
build (scripts/mkdocs_hooks.py) writes the numbers into docs/architecture.md, so the page never states them by hand.

    python scripts/structure.py          # prints the table the page shows
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tokenrl"
MARKER = "<!-- structure: scripts/structure.py -->"  # where the docs build puts the table
LONG_FILE, LONG_FUNCTION, WIDE = 300, 50, 5
# signatures whose width an outer interface fixes, with the interface
FIXED_WIDTH = {
    "FusedHead.forward": "torch.autograd.Function: one argument per input of the fused pass",
    "packed_attention_forward": "transformers' attention interface (ALL_ATTENTION_FUNCTIONS)",
}


def documented_layers() -> dict[str, int]:
    """unit (a top-level module or folder of src/tokenrl) -> its layer, from the table of docs/architecture.md."""
    layers: dict[str, int] = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for unit in re.findall(r"`([\w]+)`", row.group(2)):
                assert unit not in layers, f"{unit} is placed in two layers of docs/architecture.md"
                layers[unit] = int(row.group(1))
    return layers


def unit_of(module: str) -> str | None:
    """`tokenrl.a.b` -> `a`; the package root itself has no unit."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imports(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) of every tokenrl import in module `name`'s source, wherever it is (functions,
    TYPE_CHECKING), relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "tokenrl":  # `from tokenrl import step`: each name is a unit
                found += [(node.lineno, f"tokenrl.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, target) for line, target in found if target.split(".")[0] == "tokenrl"]


def module_imports(path: Path) -> list[tuple[int, str]]:
    return imports(path.read_text(), module_name(path), path.name == "__init__.py")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import loops of `graph` (node -> the nodes it imports), each as the nodes round it, the first repeated at the
    end: a depth-first search, which finds one at least wherever there is one."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target in path:
                found.append(path[path.index(target) :] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node, [node])
    return found


def unit_graph(unit: str) -> dict[str, set[str]]:
    """module -> the modules of the same unit it imports, wherever the import is (functions, TYPE_CHECKING)."""
    paths = sorted((PACKAGE / unit).rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {
        module_name(path): {target for _, target in module_imports(path) if target in modules} - {module_name(path)}
        for path in paths
    }


def units() -> list[str]:
    """The folders of src/tokenrl that are packages."""
    return sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists())


def arrows() -> dict[str, set[str]]:
    """unit -> the other units it imports (the package root's helpers are no unit)."""
    graph: dict[str, set[str]] = {}
    for path in sources():
        mine = unit_of(module_name(path))
        if mine is not None:
            graph.setdefault(mine, set()).update(
                unit for _, target in module_imports(path) if (unit := unit_of(target)) not in (None, mine)
            )
    return graph


def long_functions(path: Path) -> list[str]:
    """Functions and methods of `path` longer than LONG_FUNCTION lines, decorators and docstring included."""
    return [
        node.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1 > LONG_FUNCTION
    ]


def wide_signatures(source: str) -> dict[str, int]:
    """`Class.method` or `function` -> its parameter count (self and cls aside, *args and **kwargs counted), for
    each signature of a module's `source` wider than WIDE."""
    found = {}
    for node in ast.walk(tree := ast.parse(source)):
        for item in node.body if isinstance(node, (ast.Module, ast.ClassDef)) else ():
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = item.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
                width = len(names) + bool(args.vararg) + bool(args.kwarg)
                if width > WIDE:
                    found[f"{node.name}.{item.name}" if node is not tree else item.name] = width
    return found


def hydra_built() -> set[str]:
    """Classes of src/ that a config builds by `_target_`: their keywords are the YAML keys a user sets."""
    configs = "".join(path.read_text() for path in (ROOT / "configs").rglob("*.yaml"))
    return {target.rpartition(".")[2] for target in re.findall(r"_target_:\s*(tokenrl(?:\.\w+)+)", configs)}


def unexplained_wide(source: str) -> list[str]:
    """Signatures of a module's `source` wider than WIDE that are neither a config node's constructor nor fixed by an
    interface."""
    built = {f"{name}.__init__" for name in hydra_built()}
    return [name for name in wide_signatures(source) if name not in built and name not in FIXED_WIDTH]


def numbers() -> dict[str, int]:
    """The structure's counts, as the page shows them."""
    layers, graph, files = documented_layers(), arrows(), sources()
    lines = {path: len(path.read_text().splitlines()) for path in files}
    return {
        "units": len(set(layers)),
        "layers": len(set(layers.values())),
        "import arrows between units": sum(len(targets) for targets in graph.values()),
        "import cycles between units": len(cycles(graph)),
        "import cycles between the files of a unit": sum(len(cycles(unit_graph(unit))) for unit in units()),
        "Python files": len(files),
        "lines": sum(lines.values()),
        f"files over {LONG_FILE} lines": sum(n > LONG_FILE for n in lines.values()),
        f"functions over {LONG_FUNCTION} lines": sum(len(long_functions(path)) for path in files),
        f"signatures over {WIDE} parameters": sum(len(wide_signatures(path.read_text())) for path in files),
        "… of them neither a config node's keys nor an outer interface": sum(
            len(unexplained_wide(path.read_text())) for path in files
        ),
    }


def markdown() -> str:
    rows = "\n".join(f"| {name} | {value:,} |" for name, value in numbers().items())
    return f"| src/tokenrl | now |\n|---|---:|\n{rows}\n\n(Measured by `scripts/structure.py` when the site is built.)"


if __name__ == "__main__":
    print(markdown())
