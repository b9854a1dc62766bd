"""Experiments that share data/ (issue 25, problem 5, in part): after another experiment's run, status, report, /health and
lineage say whose outputs data/ holds instead of mixing them up silently. (Per-experiment data roots are not built yet.)"""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import PYTHON, copy_project, python, run

pytestmark = pytest.mark.e2e


def test_outputs_of_another_experiment_are_named_not_mixed_in(micro_template, tmp_path):
    project = copy_project(micro_template, tmp_path / "project")
    python(["-m", "pipelines", "run", "--set", "rounds=2"], project, timeout=900)  # the default experiment, two rounds
    other = yaml.safe_load((project / "params.yaml").read_text())
    other["train"]["learning_rate"] = 5e-3
    (project / "other.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    python(["-m", "pipelines", "run"], project, timeout=900, RL_ASSETS_PARAMS="other.yaml")  # experiment "other", one round

    done = python(["-m", "pipelines", "status"], project, timeout=300, check=False)
    status = json.loads(done.stdout[done.stdout.find("{"):])
    assert done.returncode == 1 and status["experiment"] == "other" and status["rounds_configured"] == 1
    assert status["other_experiment_outputs"] == {"r02/checkpoint": "default"}

    report = run([PYTHON, "-m", "rl_assets.cli", "report"], project, timeout=300)
    assert "; experiment other" in report.stdout.splitlines()[0]
    trace = run([PYTHON, "-m", "rl_assets.cli", "lineage", "data/r02/checkpoint"], project, timeout=300, check=False)
    assert trace.returncode == 1 and "data/r01/checkpoint: not the parent of data/r02/checkpoint" in trace.stderr, trace.stderr
