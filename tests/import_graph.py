"""The import graph of a package, for the layout tests of rl_assets/ and pipelines/.

Every import counts, also those inside functions: a lazy import is still a dependency (it only moves
the cost), so a cycle through one is still a cycle.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    found = {}
    for path in (REPO / package).rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(path: Path, known: dict[str, Path], package: str) -> set[str]:
    """The modules of `package` that `path` imports (a name imported from a package counts as its submodule when it is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert not node.level, f"{path}: relative import of {node.module}"
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module for alias in node.names]
        found.update(name for name in names if name.split(".")[0] == package and name != package)
    return found


def graph(package: str) -> dict[str, set[str]]:
    known = modules(package)
    return {name: imports(path, known, package) - {name} for name, path in known.items()}


def group(module: str, layers: list[str]) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in layers else None  # a group's package file counts in it


def upward_imports(package: str, layers: list[str]) -> list[str]:
    """Imports from a group into a later one, or from a group into a module outside every group (the top: the CLI)."""
    found = []
    for module, targets in graph(package).items():
        if group(module, layers) is None:
            continue
        for target in targets:
            if group(target, layers) is None and target != package:
                found.append(f"{module} -> {target} (outside the groups)")
            elif group(target, layers) is not None and layers.index(group(target, layers)) > layers.index(group(module, layers)):
                found.append(f"{module} -> {target}")
    return sorted(found)


def fail_on_cycle(package: str) -> None:
    edges = graph(package)
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges.get(name, ())):
            if state.get(target) == "open":
                pytest.fail("import cycle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
