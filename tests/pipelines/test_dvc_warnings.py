"""The `dvc commit` an asset runs after a materialization DVC did not drive: its warnings say why.

A failed commit carries DVC's own message (`--quiet` used to swallow it, leaving `dvc commit
evaluation failed: ` with nothing after the colon), and a dvc.yaml that no longer matches the graph
(fewer rounds, other sources) is named as out of date with the command that regenerates it, not
committed and not reported as a failure of the stage.
"""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest
import yaml

from conftest import DVC, NO_DVC_REASON, import_pipelines, python
from rl_assets.core.params_file import load_params

SYNC = "run `rl-assets dvc-sync` (or `make dvc-sync`) to regenerate it from the graph"


class Log:
    def __init__(self):
        self.warnings: list[str] = []

    def warning(self, message: str) -> None:
        self.warnings.append(message)

    def info(self, *args) -> None:
        pass


def record(project, key: str, assets_def=None) -> list[str]:
    """record_in_dvc(context, key) in `project`, as the asset body calls it; the warnings it logged."""
    dvc = import_pipelines("pipelines.records.dvc")
    context = SimpleNamespace(log=Log(), **({"assets_def": assets_def} if assets_def is not None else {}))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        for name in ("DVC_STAGE", "RL_ASSETS_DVC_COMMIT", "RL_ASSETS_DVC"):
            patch.delenv(name, raising=False)
        dvc.record_in_dvc(context, key)
    return context.log.warnings


def set_rounds(project, rounds: int) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump({**params, "rounds": rounds}, sort_keys=False))


def test_a_failed_commit_says_what_dvc_said(micro_copy):
    if not DVC.exists():
        pytest.skip(NO_DVC_REASON)
    # dvc.yaml is in step with the graph, but raw_data.parquet was never written: DVC refuses the commit
    warnings = record(micro_copy, "raw_data")
    assert warnings == ["dvc commit raw_data failed: failed to commit raw_data - output 'data/raw_data.parquet' does not exist"]
    assert not (micro_copy / "dvc.lock").exists()


def test_a_run_with_fewer_rounds_than_dvc_yaml_names_dvc_sync_once(micro_copy):
    set_rounds(micro_copy, 2)
    python(["-m", "pipelines", "dvc-sync"], micro_copy, timeout=180)  # dvc.yaml for 2 rounds ...
    set_rounds(micro_copy, 1)  # ... and a 1-round run
    compute = import_pipelines("pipelines.definitions.compute")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(micro_copy)  # the asset graph of the 1-round params
        evaluation = compute.compute_assets(load_params("params.yaml"))[0]
    warnings = record(micro_copy, "evaluation", evaluation)
    assert len(warnings) == 1
    assert warnings[0].startswith("dvc.yaml is out of date (rounds or sources changed since it was written): its stage 'evaluation' "
                                  "differs from the asset graph (deps: ")
    assert "data/r02/checkpoint not in the graph" in warnings[0]
    assert warnings[0].endswith(f"so dvc.lock was not updated; {SYNC}")
    assert "failed" not in warnings[0]
    assert not (micro_copy / "dvc.lock").exists()


def test_changed_sources_are_not_committed_under_the_old_deps(micro_copy):
    params = yaml.safe_load((micro_copy / "params.yaml").read_text())
    params["raw_data"]["sources"] = params["raw_data"]["sources"][:1]  # the jsonl file is no longer read
    (micro_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = python(["-m", "pipelines", "materialize", "raw_data"], micro_copy, timeout=300)
    output = done.stdout + done.stderr
    assert ("dvc.yaml is out of date (rounds or sources changed since it was written): its stage 'raw_data' differs from the "
            f"asset graph (deps: data/raw/arithmetic_extra.jsonl not in the graph), so dvc.lock was not updated; {SYNC}") in output
    assert output.count("dvc.yaml is out of date") == 1
    assert not (micro_copy / "dvc.lock").exists()  # no lock entry that names a file the run did not read


def test_a_missing_stage_names_dvc_sync(micro_copy):
    assert record(micro_copy, "r02/rollouts") == [
        f"dvc.yaml is out of date (rounds or sources changed since it was written): it has no stage 'r02-rollouts', "
        f"so dvc.lock was not updated; {SYNC}"]


def test_dvc_message_is_never_empty():
    dvc = import_pipelines("pipelines.records.dvc")
    assert dvc.dvc_message(subprocess.CompletedProcess([], 1, "", "")) == "exit status 1 and no output"
    assert dvc.dvc_message(subprocess.CompletedProcess([], 1, "partial output\n", "")) == "partial output"
    assert dvc.dvc_message(subprocess.CompletedProcess([], 1, "Updating lock file\n", "ERROR: a\nERROR: b\n")) == "a; b"


def test_dvc_commit_runs_at_the_lowest_cpu_priority(micro_copy, tmp_path, monkeypatch):
    """It runs beside the training child: at equal priority it took a core from torch's threads (README, Measured)."""
    fake = tmp_path / "dvc"  # stands in for dvc: writes the niceness it ran at and what it was asked
    fake.write_text(f"#!/bin/sh\necho \"$(cut -d' ' -f19 /proc/self/stat) $*\" > {tmp_path / 'ran'}\n")
    fake.chmod(0o755)
    before = os.nice(0)
    dvc = import_pipelines("pipelines.records.dvc")
    context = SimpleNamespace(log=Log())
    monkeypatch.chdir(micro_copy)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv("RL_ASSETS_DVC_COMMIT", raising=False)
    monkeypatch.setenv("RL_ASSETS_DVC", str(fake))
    dvc.record_in_dvc(context, "raw_data")
    assert context.log.warnings == []
    assert (tmp_path / "ran").read_text().split() == ["19", "commit", "--force", "raw_data"]
    assert os.nice(0) == before  # the step process itself keeps its priority
