"""`dvc repro` stays truthful whatever ran before it (issue 25, problem 4): after a `--set` run, dvc.lock never records
params that did not make the outputs, and `dvc repro` makes them again with params.yaml's instead of restoring the
`--set` run's outputs from DVC's run cache."""

from __future__ import annotations

import pytest
import yaml

from conftest import copy_project, dvc, dvc_status, python
from rl_assets.core.checkpoints import read_lineage

pytestmark = pytest.mark.e2e  # make test installs DVC: without it, dvc() fails the test


def recorded_learning_rate(project) -> float:
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    return lock["stages"]["r01-checkpoint"]["params"]["params.yaml"]["train"]["learning_rate"]


def test_dvc_repro_after_a_set_run_remakes_what_other_params_made(micro_template, tmp_path):
    project = copy_project(micro_template, tmp_path / "project")
    python(["-m", "pipelines", "run"], project, timeout=900)
    default = read_lineage(project / "data/r01/checkpoint")["train"]["learning_rate"]
    python(["-m", "pipelines", "run", "--set", "train.learning_rate=5e-3"], project, timeout=900)
    assert read_lineage(project / "data/r01/checkpoint")["train"]["learning_rate"] == recorded_learning_rate(project) == 5e-3
    assert dvc_status(project), "dvc status must see that params.yaml differs from what made the outputs"

    done = dvc(["repro"], project, timeout=1200)
    assert "Running stage 'r01-checkpoint'" in done.stdout, done.stdout[-3000:]
    card = read_lineage(project / "data/r01/checkpoint")
    assert card["train"]["learning_rate"] == recorded_learning_rate(project) == default
    assert dvc_status(project) == {}
