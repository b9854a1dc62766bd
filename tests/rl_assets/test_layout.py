"""The library's layout: grouped by the flow, dependencies one way, no Dagster, tests mirroring it."""

import ast
import subprocess
import sys
from pathlib import Path

from import_graph import fail_on_cycle, modules as package_modules, upward_imports

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rl_assets"
# The groups in flow order: a module imports from its own group and the groups before it, never after.
LAYERS = ["core", "data", "rollout", "rewards", "train", "eval", "run", "serve"]


def modules() -> dict[str, Path]:
    return package_modules("rl_assets")


def test_every_module_sits_in_a_group_of_the_flow():
    loose = sorted(name for name in modules() if name.count(".") == 1 and name.split(".")[1] not in LAYERS)
    assert loose == ["rl_assets.cli"]  # the library's commands, added to `rl-assets` by pipelines.cli
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)


def test_no_import_cycle_and_groups_depend_only_on_earlier_ones():
    upward = upward_imports("rl_assets", LAYERS)
    assert not upward, "imports against the flow:\n" + "\n".join(upward)
    fail_on_cycle("rl_assets")


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
