"""The orchestration layer's layout: grouped by what it does, dependencies one way, the CLI on top.

records (DVC, staleness, the writer lock) -> storage (the remote, retention) -> launch (the params a run is
given, compute steps: local, Slurm, k8s, and what they report) -> definitions (the Dagster code location: assets,
specs, schedules) -> the CLI. A module imports from its own group and the groups before it; only the CLI imports
the code location.
"""

from import_graph import REPO, fail_on_cycle, graph, modules, upward_imports

LAYERS = ["records", "storage", "launch", "definitions"]
TOP = {"pipelines.cli", "pipelines.__main__"}  # the commands, on top of every group


def test_every_module_sits_in_a_group():
    loose = sorted(name for name in modules("pipelines") if name.count(".") == 1 and name.split(".")[1] not in LAYERS)
    assert set(loose) == TOP
    assert sorted(p.name for p in (REPO / "pipelines").iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)


def test_no_import_cycle_and_groups_depend_only_on_earlier_ones():
    upward = upward_imports("pipelines", LAYERS)
    assert not upward, "imports against the layers:\n" + "\n".join(upward)
    fail_on_cycle("pipelines")


def test_groups_are_small_modules_without_code_in_their_package_files():
    for name, path in modules("pipelines").items():
        lines = len(path.read_text().splitlines())
        assert lines <= 600, f"{path.relative_to(REPO)}: {lines} lines; split it"
        if path.name == "__init__.py":
            assert not path.read_text().strip(), f"{path.relative_to(REPO)} has code: a group's modules are imported by name"


def test_the_layout_test_sees_an_upward_import(monkeypatch):
    """The check can fail: a records module importing the code location is named."""
    edges = graph("pipelines")
    assert "pipelines.definitions.code_location" not in edges["pipelines.records.dvc"]
    import import_graph

    fake = {**edges, "pipelines.records.dvc": edges["pipelines.records.dvc"] | {"pipelines.definitions.code_location"}}
    monkeypatch.setattr(import_graph, "graph", lambda package: fake)
    assert import_graph.upward_imports("pipelines", LAYERS) == ["pipelines.records.dvc -> pipelines.definitions.code_location"]
