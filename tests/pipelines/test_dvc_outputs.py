"""After a plain `dvc pull` (no `rl-assets pull`, so no Dagster record), outputs whose content, code and params match
dvc.lock count as made (pipelines/records/dvc_outputs.py); one that differs is made again, with what depends on it."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import MICRO_OUTPUTS, copy_project, dvc, python
from rl_assets.core.checkpoints import checkpoint_id

pytestmark = pytest.mark.e2e


@pytest.fixture()
def pulled_by_dvc(reproduced_project, tmp_path):
    """The reproduced micro project as a fresh machine has it after a plain `dvc pull`: DVC's cache and dvc.lock, every
    output written anew from the cache (`dvc checkout`, what `dvc pull` ends with), and no Dagster record of any of it."""
    project = copy_project(reproduced_project["path"], tmp_path / "project")
    ids = {key: checkpoint_id(project / MICRO_OUTPUTS[key]) for key in ("r00/checkpoint", "r01/checkpoint")}
    for path in (project / ".dagster").iterdir():
        if path.name != "dagster.yaml":
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    for path in (project / "data").iterdir():
        if path.name != "raw":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    dvc(["checkout"], project, timeout=300)
    return project, ids


def test_outputs_dvc_recorded_count_as_made_and_only_the_promotion_runs(pulled_by_dvc):
    project, ids = pulled_by_dvc
    done = python(["-m", "pipelines", "run"], project, timeout=900)
    assert "dvc.lock: 7 outputs on disk are the ones DVC recorded, with the same code and params: counted as made" in done.stderr, done.stderr
    assert "running 1 of 8 assets, from promoted_model (never materialized)" in done.stderr, done.stderr[-3000:]
    assert {key: checkpoint_id(project / MICRO_OUTPUTS[key]) for key in ids} == ids
    assert "nothing to do" in python(["-m", "pipelines", "run"], project, timeout=900).stderr


def test_an_output_that_differs_from_dvc_lock_is_made_again_with_what_follows(pulled_by_dvc):
    project, _ = pulled_by_dvc
    path = project / MICRO_OUTPUTS["r01/rewards"]
    table = pq.read_table(path)
    rewards = table["reward"].to_pylist()
    changed = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"),
                               pa.array([rewards[0] + 0.5, *rewards[1:]], table.schema.field("reward").type))
    pq.write_table(changed, path)  # a valid table that passes every guard, but not the one DVC recorded
    done = python(["-m", "pipelines", "run"], project, timeout=900)
    assert "dvc.lock: 4 outputs on disk are the ones DVC recorded" in done.stderr, done.stderr[-3000:]
    assert "running 4 of 8 assets, from r01/rewards (never materialized)" in done.stderr, done.stderr[-3000:]
