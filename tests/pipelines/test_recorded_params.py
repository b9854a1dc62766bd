"""What ran is what is recorded: dvc.lock, lineage.json, the Dagster run and `status` name the params and code a run used.

Issue 14's problems 1-3 as a new user meets them: a run with another params file and a `--set`
override, an edit to the user's own reward module, and `status` and promotion after a run of
another experiment.
"""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import DVC, MICRO_OUTPUTS, NO_DVC_REASON, copy_project, dvc, dvc_status, micro_params, python, run
from rl_assets.core.params_file import apply_override
from rl_assets.core.schemas import table_lineage
from rl_assets.core.storage import file_hash

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not DVC.exists(), reason=NO_DVC_REASON)]

OVERRIDE = "train.learning_rate=5.0e-3"


@pytest.fixture(scope="module")
def other_run(micro_template, tmp_path_factory):
    """The micro project after `RL_ASSETS_PARAMS=other.yaml rl-assets run --set train.learning_rate=5.0e-3`.

    other.yaml has fewer raw rows than params.yaml, and params.yaml now asks for 3 rounds (dvc.yaml
    still has the 1-round graph both files share, so every stage is committed). other.yaml names the default
    experiment, so it writes data/, DVC's outputs (a file of another experiment writes its own folder and never
    dvc.lock: test_experiments.py).
    """
    project = copy_project(micro_template, tmp_path_factory.mktemp("other") / "project")
    other = {"experiment": "default", **micro_params()}
    other["raw_data"]["sources"][0]["count"] = 100
    (project / "other.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    default = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump({**default, "rounds": 3}, sort_keys=False))
    python(["-m", "pipelines", "run", "--set", OVERRIDE], project, timeout=900, RL_ASSETS_PARAMS="other.yaml")
    apply_override(other, OVERRIDE)
    return project, other


def test_dvc_lock_records_the_params_the_run_used_not_params_yaml(other_run):
    project, used = other_run
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert lock["r01-checkpoint"]["params"]["params.yaml"]["train"]["learning_rate"] == 0.005
    assert lock["raw_data"]["params"]["params.yaml"]["raw_data"]["sources"][0]["count"] == 100
    card = json.loads((project / MICRO_OUTPUTS["r01/checkpoint"] / "lineage.json").read_text())
    assert card["train"]["learning_rate"] == card["params"]["train"]["learning_rate"] == 0.005
    assert card["experiment"] == "default"


def test_dvc_status_is_not_up_to_date_for_outputs_of_other_params(other_run):
    project, _ = other_run
    changed = dvc_status(project)
    assert {"raw_data", "r01-checkpoint", "evaluation"} <= set(changed)  # count, learning_rate and rounds differ
    assert "train" in json.dumps(changed["r01-checkpoint"]) and "raw_data" in json.dumps(changed["raw_data"])
    assert "Data and pipelines are up to date" not in dvc(["status"], project, timeout=180).stdout


def test_dvc_status_is_clean_once_params_yaml_holds_the_params_that_ran(other_run, tmp_path):
    project = copy_project(other_run[0], tmp_path / "project")
    (project / "params.yaml").write_text(yaml.safe_dump(other_run[1], sort_keys=False))
    assert dvc_status(project) == {}


def test_the_run_and_status_name_the_params_file_overrides_and_experiment(other_run):
    project, _ = other_run
    done = python(["-m", "pipelines", "status"], project, timeout=180)  # no RL_ASSETS_PARAMS: status reads the run's own
    report = json.loads(done.stdout)
    run = report["latest_run"]
    assert (run["params_file"], run["overrides"], run["experiment"]) == ("other.yaml", [OVERRIDE], "default")
    assert report["experiment"] == "default" and report["rounds_configured"] == 1  # params.yaml says 3
    assert "params_note" not in report


def test_editing_a_user_reward_module_changes_only_the_stages_that_call_it(reproduced_project, tmp_path):
    project = copy_project(reproduced_project["path"], tmp_path / "project")
    module = project / "micro_rewards.py"
    recorded = file_hash(module)
    # the lineage of what was made names the module's content
    assert table_lineage(project / MICRO_OUTPUTS["r01/rewards"])["code"]["rewards"]["micro_rewards.py"] == recorded
    card = json.loads((project / MICRO_OUTPUTS["r01/checkpoint"] / "lineage.json").read_text())
    assert card["code"]["rewards"]["micro_rewards.py"] == recorded and "rl_assets/train/policy_gradient.py" in card["code"]["train"]

    module.write_text(module.read_text().replace("isdigit()", "isalpha()"))
    changed = dvc_status(project)
    assert set(changed) == {"r01-rewards", "evaluation"}  # evaluation scores held-out completions with the same rewards
    assert all("micro_rewards.py" in json.dumps(changes) for changes in changed.values())


def test_dvc_repro_refuses_a_stage_steered_to_other_params(micro_copy):
    done = python(["-m", "pipelines", "materialize", "raw_data"], micro_copy, timeout=180, check=False,
                  DVC_STAGE="raw_data", RL_ASSETS_SET="seed=3")
    assert done.returncode == 2
    assert "dvc repro reproduces params.yaml" in done.stderr and "RL_ASSETS_SET=seed=3" in done.stderr
    assert not (micro_copy / MICRO_OUTPUTS["raw_data"]).exists()


def test_a_refused_dvc_repro_says_how_to_bring_back_what_dvc_removed(reproduced_project, tmp_path):
    """DVC deletes a stage's outputs before its command refuses: the message names the command that restores them."""
    project = copy_project(reproduced_project["path"], tmp_path / "project")
    output = project / MICRO_OUTPUTS["raw_data"]
    made = file_hash(output)
    done = run([DVC, "repro", "--force", "--single-item", "raw_data"], project, timeout=300, check=False, RL_ASSETS_SET="seed=3")
    assert done.returncode != 0 and not output.exists()
    assert "`dvc checkout raw_data` brings back" in done.stdout + done.stderr
    dvc(["checkout", "raw_data"], project, timeout=180)
    assert file_hash(output) == made and dvc_status(project) == {}


def test_editing_a_module_a_stage_imports_marks_exactly_the_stages_that_import_it(reproduced_project, tmp_path):
    project = copy_project(reproduced_project["path"], tmp_path / "project")
    losses = project / "rl_assets" / "train" / "losses.py"  # declared code of training only
    losses.write_text(losses.read_text() + "\n")
    assert set(dvc_status(project)) == {"r01-checkpoint"}

    stages = project / "rl_assets" / "run" / "stages.py"  # the stage functions: r00's SFT, rollouts, rewards, training, evaluation
    stages.write_text(stages.read_text() + "\n")
    assert set(dvc_status(project)) == {"r00-checkpoint", "r01-rollouts", "r01-rewards", "r01-checkpoint", "evaluation"}
