"""Experiments side by side (issue 25, problem 5): each experiment writes its own data folder (data/ for the default,
data/experiments/<name>/ for others) and its own Dagster assets (experiments/<name>/...), so a run of one never
overwrites, restales or mislabels another's outputs, and status, report, lineage, query and DVC agree with it."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import PYTHON, copy_project, python, run

pytestmark = pytest.mark.e2e


def checkpoint_ids(data) -> dict[str, str]:
    return {card.parent.parent.name: json.loads(card.read_text())["checkpoint_id"] for card in sorted(data.glob("r*/checkpoint/lineage.json"))}


def test_experiments_keep_their_own_outputs_and_never_restale_each_other(micro_template, tmp_path):
    project = copy_project(micro_template, tmp_path / "project")
    python(["-m", "pipelines", "run", "--set", "rounds=2"], project, timeout=900)  # the default experiment, two rounds
    default_ids, lock = checkpoint_ids(project / "data"), (project / "dvc.lock").read_text()
    other = yaml.safe_load((project / "params.yaml").read_text())
    other["train"]["learning_rate"] = 5e-3
    (project / "other.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    done = python(["-m", "pipelines", "run"], project, timeout=900, RL_ASSETS_PARAMS="other.yaml")  # experiment "other", one round
    assert "outputs under data/experiments/other/" in done.stdout

    own = project / "data/experiments/other"
    assert checkpoint_ids(project / "data") == default_ids  # nothing of the default experiment was touched
    assert set(checkpoint_ids(own)) == {"r00", "r01"} and checkpoint_ids(own)["r01"] != default_ids["r01"]
    assert (own / "run_state").is_dir() and (project / "dvc.lock").read_text() == lock  # dvc.lock is params.yaml's graph only
    card = json.loads((project / "models/experiments/other/promoted/model_card.json").read_text())
    assert card["experiment"] == "other" and card["data"]["prompts"]["path"] == "data/experiments/other/prompts.parquet"
    assert json.loads((project / "models/promoted/model_card.json").read_text())["experiment"] == "default"

    done = python(["-m", "pipelines", "status"], project, timeout=300, check=False)  # params.yaml's experiment, the one serve serves
    status = json.loads(done.stdout[done.stdout.find("{"):])
    assert status["experiment"] == "default" and status["latest_run"]["experiment"] == "default"
    assert status["latest_run_of_another_experiment"]["shown_by"] == "RL_ASSETS_PARAMS=other.yaml rl-assets status"
    done = python(["-m", "pipelines", "status"], project, timeout=300, check=False, RL_ASSETS_PARAMS="other.yaml")
    status = json.loads(done.stdout[done.stdout.find("{"):])
    assert done.returncode == 0, status
    assert status["experiment"] == "other" and status["data"] == "data/experiments/other" and status["current_round"] == 1
    assert not status["other_experiment_outputs"] and not status["changed_outputs"]

    report = run([PYTHON, "-m", "pipelines", "report"], project, timeout=300, RL_ASSETS_PARAMS="other.yaml")
    assert "; experiment other" in report.stdout.splitlines()[0]
    query = run([PYTHON, "-m", "pipelines", "query", "select 'rounds=' || count(distinct round) || ' lr=' || any_value(lr) "
                 "from rollouts, (select any_value(train.learning_rate) as lr from checkpoints where round = 1)"], project, timeout=300,
                RL_ASSETS_PARAMS="other.yaml")
    assert "rounds=1 lr=0.005" in query.stdout, query.stdout
    trace = run([PYTHON, "-m", "pipelines", "lineage", "data/experiments/other/r01/checkpoint"], project, timeout=300)
    assert "data/experiments/other/r00/checkpoint" in trace.stdout and "data/r00" not in trace.stdout
    trace = run([PYTHON, "-m", "pipelines", "lineage", "data/r02/checkpoint"], project, timeout=300)  # exit 0: intact
    assert "data/r01/checkpoint" in trace.stdout

    again = python(["-m", "pipelines", "run", "--set", "rounds=2"], project, timeout=900)  # back to the default: all up to date
    assert "nothing to do" in again.stderr, again.stderr
    again = python(["-m", "pipelines", "run"], project, timeout=900, RL_ASSETS_PARAMS="other.yaml")
    assert "nothing to do" in again.stderr, again.stderr
