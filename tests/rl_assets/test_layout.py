"""The library's layout: grouped by the flow, dependencies one way, no Dagster, tests mirroring it, old paths named.

Every import counts, also those inside functions: a lazy import is still a dependency (it only moves
the cost), so a cycle through one is still a cycle.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rl_assets"
# The groups in flow order: a module imports from its own group and the groups before it, never after.
LAYERS = ["core", "data", "rollout", "rewards", "train", "eval", "run", "serve"]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The rl_assets modules `path` imports (a name imported from a package counts as its submodule when it is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert not node.level, f"{path}: relative import of {node.module}"
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module for alias in node.names]
        found.update(name for name in names if name.split(".")[0] == "rl_assets" and name != "rl_assets")
    return found


def group(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_group_of_the_flow():
    loose = sorted(name for name in modules() if name.count(".") == 1 and name.split(".")[1] not in LAYERS)
    assert loose == ["rl_assets.cli"]  # the library's commands, added to `rl-assets` by pipelines.cli
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)


def test_no_import_cycle_and_groups_depend_only_on_earlier_ones():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    upward = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
              if group(m) and group(t) and LAYERS.index(group(t)) > LAYERS.index(group(m))]
    assert not upward, "imports against the flow:\n" + "\n".join(sorted(upward))
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                pytest.fail("import cycle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_library_never_imports_or_calls_the_orchestration_layer():
    """Dagster lives in `pipelines`; the library gets what it needs from there as arguments (serve's status command)."""
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [(node.module or "").split(".")[0]]
            else:
                roots = []
            assert not {"dagster", "dagster_pipes", "pipelines"} & set(roots), f"{name} imports {roots}"
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not {"pipelines", "pipelines.cli", "dagster"} & strings, f"{name} names the orchestration layer to run it"


def test_tests_mirror_the_library():
    """tests/rl_assets/<group>/ for each group (tests/pipelines/ for the orchestration layer); only this file outside them."""
    tests = REPO / "tests" / "rl_assets"
    assert {p.parent.name for p in tests.rglob("test_*.py") if p.parent != tests} == set(LAYERS)
    assert [p.name for p in tests.glob("test_*.py")] == [Path(__file__).name]


def test_importing_the_library_imports_neither_dagster_nor_torch():
    code = "import sys, rl_assets, rl_assets.cli, rl_assets.core.config; print(sorted({'dagster', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
