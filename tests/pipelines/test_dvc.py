"""`dvc repro` of the micro project: every stage through Dagster, idempotent, params-section granular."""

from __future__ import annotations

import re

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from conftest import MICRO_OUTPUTS, MICRO_STAGES, copy_project, dvc, dvc_status, python
from rl_assets.core.storage import file_hash

pytestmark = pytest.mark.e2e


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def test_repro_runs_every_stage_once_and_records_it(reproduced_project):
    project = reproduced_project["path"]
    assert ran_stages(reproduced_project["output"]) == MICRO_STAGES
    for path in MICRO_OUTPUTS.values():
        assert (project / path).exists(), path
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert list(lock) == MICRO_STAGES
    assert lock["r01-rewards"]["outs"][0]["md5"] == file_hash(project / MICRO_OUTPUTS["r01/rewards"])
    assert lock["r01-rewards"]["params"]["params.yaml"]["rewards"] == yaml.safe_load((project / "params.yaml").read_text())["rewards"]


def test_second_repro_runs_nothing_and_status_is_clean(reproduced_project):
    project = reproduced_project["path"]
    lock = (project / "dvc.lock").read_text()
    again = dvc(["repro"], project, timeout=300)
    assert "Running stage" not in again.stdout + again.stderr
    assert (project / "dvc.lock").read_text() == lock
    done = dvc(["status"], project, timeout=180)
    assert "Data and pipelines are up to date" in done.stdout
    assert dvc_status(project) == {}


def test_repro_runs_show_up_in_the_dagster_instance(reproduced_project):
    project = reproduced_project["path"]
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        runs = instance.get_runs()
        assert len(runs) == len(MICRO_STAGES)  # one run per DVC stage, `python -m pipelines materialize KEY`
        assert all(run.is_success for run in runs)
        for key, path in MICRO_OUTPUTS.items():
            event = instance.get_latest_materialization_event(AssetKey(key.split("/")))
            assert event is not None, key
            if path.endswith(".parquet"):  # the UI's data version is the md5 DVC recorded
                assert event.asset_materialization.tags["dagster/data_version"] == file_hash(project / path), key


def test_params_change_reruns_only_that_stage_and_dagster_materializations_keep_dvc_in_step(reproduced_project, tmp_path):
    project = copy_project(reproduced_project["path"], tmp_path / "project")
    params_path = project / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    params["rewards"]["functions"][0]["weight"] = 2.0
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))

    # only the stages reading `rewards` are out of date (evaluation scores with them too); the rollouts stay
    changed = dvc_status(project)
    assert sorted(changed) == ["evaluation", "r01-rewards"]
    assert "rewards" in str(changed["r01-rewards"])
    dry = dvc(["repro", "--dry", "--force-downstream"], project, timeout=300)
    assert ran_stages(dry.stdout) == ["r01-rewards", "r01-checkpoint", "evaluation"]

    # Dagster (not DVC) materializes the rewards: the asset commits its stage, so DVC sees it done
    rewards_before = file_hash(project / MICRO_OUTPUTS["r01/rewards"])
    python(["-m", "pipelines", "materialize", "r01/rewards"], project, timeout=600)
    rewards_after = file_hash(project / MICRO_OUTPUTS["r01/rewards"])
    assert rewards_after != rewards_before
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert lock["r01-rewards"]["outs"][0]["md5"] == rewards_after
    assert lock["r01-rewards"]["params"]["params.yaml"]["rewards"]["functions"][0]["weight"] == 2.0
    changed = dvc_status(project)
    assert "r01-rewards" not in changed
    assert sorted(changed) == ["evaluation", "r01-checkpoint"]

    # and DVC reruns exactly what depends on the new rewards
    repro = dvc(["repro"], project, timeout=900)
    assert ran_stages(repro.stdout) == ["r01-checkpoint", "evaluation"]
    assert dvc_status(project) == {}

    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        assert len(instance.get_runs()) == len(MICRO_STAGES) + 3
        rollouts = instance.get_latest_materialization_event(AssetKey(["r01", "rollouts"]))
        assert rollouts is not None
        assert rollouts.asset_materialization.tags["dagster/data_version"] == file_hash(project / MICRO_OUTPUTS["r01/rollouts"])
        rewards = instance.get_latest_materialization_event(AssetKey(["r01", "rewards"]))
        assert rewards.asset_materialization.tags["dagster/data_version"] == rewards_after
        assert rewards.run_id != rollouts.run_id
