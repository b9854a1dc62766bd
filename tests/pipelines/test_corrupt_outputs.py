"""Verify what you read (issue 25, problem 3): an output truncated or overwritten since it was recorded is never "up to date".

`run` names it and makes it again with what depends on it (the same checkpoints come back), `status` is unhealthy and
names it, `lineage` exits 1 naming it, `query` names the unreadable file, and a step that loads it stops naming it.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import MICRO_OUTPUTS, PYTHON, copy_project, python, run
from rl_assets.core.checkpoints import checkpoint_id

pytestmark = pytest.mark.e2e

CHECKPOINTS = ["r00/checkpoint", "r01/checkpoint"]


def truncate(path, share: float = 0.5) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(int(os.path.getsize(path) * share))


def overwrite_with_random_bytes(path) -> None:
    size = os.path.getsize(path)
    path.write_bytes(os.urandom(size))


def status(project) -> tuple[int, dict]:
    done = python(["-m", "pipelines", "status"], project, timeout=300, check=False)
    return done.returncode, json.loads(done.stdout[done.stdout.find("{"):])


def test_a_truncated_checkpoint_is_named_everywhere_and_made_again(pipeline_outputs, tmp_path):
    project = copy_project(pipeline_outputs, tmp_path / "project")
    ids = {key: checkpoint_id(project / MICRO_OUTPUTS[key]) for key in CHECKPOINTS}
    weights = project / MICRO_OUTPUTS["r01/checkpoint"] / "model.safetensors"
    assert status(project)[1]["changed_outputs"] == {}
    truncate(weights)

    code, health = status(project)
    assert code == 1 and health["healthy"] is False
    assert "data/r01/checkpoint changed since it was recorded" in health["changed_outputs"]["r01/checkpoint"]

    trace = run([PYTHON, "-m", "pipelines", "lineage", "data/r01/checkpoint"], project, timeout=300, check=False)
    assert trace.returncode == 1, trace.stdout + trace.stderr
    assert "data/r01/checkpoint: changed since recorded" in trace.stderr

    done = python(["-m", "pipelines", "run"], project, timeout=900)
    assert "from r01/checkpoint (data/r01/checkpoint changed since it was recorded" in done.stderr, done.stderr[-3000:]
    assert {key: checkpoint_id(project / MICRO_OUTPUTS[key]) for key in CHECKPOINTS} == ids
    assert status(project)[0] == 0
    assert "nothing to do" in python(["-m", "pipelines", "run"], project, timeout=300).stderr


def test_a_table_overwritten_with_random_bytes_is_named_and_made_again(pipeline_outputs, tmp_path):
    project = copy_project(pipeline_outputs, tmp_path / "project")
    ids = {key: checkpoint_id(project / MICRO_OUTPUTS[key]) for key in CHECKPOINTS}
    overwrite_with_random_bytes(project / MICRO_OUTPUTS["r01/rollouts"])

    query = run([PYTHON, "-m", "pipelines", "query", "select count(*) from rollouts"], project, timeout=300, check=False)
    assert query.returncode == 2 and "data/r01/rollouts.parquet is unreadable" in query.stderr, query.stdout + query.stderr
    trace = run([PYTHON, "-m", "pipelines", "lineage", "data/r01/checkpoint"], project, timeout=300, check=False)
    assert trace.returncode == 1 and "data/r01/rollouts.parquet: changed since recorded" in trace.stderr, trace.stderr

    done = python(["-m", "pipelines", "run"], project, timeout=900)
    assert "from r01/rollouts (data/r01/rollouts.parquet changed since it was recorded" in done.stderr, done.stderr[-3000:]
    assert {key: checkpoint_id(project / MICRO_OUTPUTS[key]) for key in CHECKPOINTS} == ids


def test_a_step_that_loads_a_changed_checkpoint_stops_naming_it(pipeline_outputs, tmp_path):
    project = copy_project(pipeline_outputs, tmp_path / "project")
    truncate(project / MICRO_OUTPUTS["r00/checkpoint"] / "model.safetensors", 0.9)
    failed = python(["-m", "pipelines", "materialize", "r01/rollouts"], project, timeout=600, check=False)
    assert failed.returncode != 0
    assert "data/r00/checkpoint changed since it was recorded" in failed.stderr, failed.stderr[-3000:]
