"""`rl-assets compare`: two micro experiments (one learning rate apart) and two checkpoints, from what the runs stored."""

from __future__ import annotations

import json
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import PYTHON, copy_project, project_env, python

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def two_experiments(micro_template, tmp_path_factory):
    """The default micro experiment and `faster` (train.learning_rate doubled), each run once."""
    project = copy_project(micro_template, tmp_path_factory.mktemp("compare") / "project")
    python(["-m", "pipelines", "run"], project, timeout=900)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["experiment"] = "faster"
    params["train"]["learning_rate"] *= 2
    (project / "faster.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "run"], project, timeout=900, RL_ASSETS_PARAMS="faster.yaml")
    return project


def compare(project, *args, check=True):
    done = subprocess.run([PYTHON, "-m", "pipelines", "compare", *args], cwd=project, env=project_env(project), capture_output=True,
                          text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def accuracies(data) -> dict:
    return {(r["checkpoint"], r["mode"]): r["accuracy"] for r in pq.read_table(data / "evaluation.parquet").to_pylist()}


def test_two_experiments_differ_in_the_one_param_and_pair_their_rounds(two_experiments):
    project = two_experiments
    report = json.loads(compare(project, "default", "faster.yaml", "--json").stdout)
    rate = yaml.safe_load((project / "params.yaml").read_text())["train"]["learning_rate"]
    assert [tuple(d) for d in report["params"]] == [("train.learning_rate", rate, rate * 2)]
    assert report["code"] == [] and report["sources"] == []
    first, second = accuracies(project / "data"), accuracies(project / "data" / "experiments" / "faster")
    rows = {(r["second"], r["mode"]): r for r in report["rows"]}
    assert set(rows) == set(first) == set(second)
    for key, row in rows.items():
        # every held-out prompt is evaluated by both: the paired mean is exactly the difference of the accuracies
        assert row["difference"] == pytest.approx(second[key] - first[key], abs=1e-12)
    # r00 is the same model in both (SFT does not read train.*): no difference and no spread
    assert (rows[("r00/checkpoint", "sampled")]["difference"], rows[("r00/checkpoint", "sampled")]["se"]) == (0.0, 0.0)
    assert (project / "data" / "experiments" / "faster" / "compare" / "default-vs-faster.yaml.png").stat().st_size > 1000


def test_it_shows_the_comparison_in_the_ui_beside_b_s_evaluation(two_experiments):
    compare(two_experiments, "default", "faster")
    code = ("from dagster import AssetKey, DagsterInstance\n"
            "with DagsterInstance.get() as instance:\n"
            "    [record] = instance.fetch_observations(AssetKey(['experiments', 'faster', 'evaluation']), limit=1).records\n"
            "    print(sorted(record.asset_observation.metadata))\n")
    done = subprocess.run([PYTHON, "-c", code], cwd=two_experiments, env=project_env(two_experiments), capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "['compared_with', 'comparison']", done.stderr


def test_it_works_from_the_tables_a_pull_brings(two_experiments, tmp_path):
    """Without the evaluation caches, run state or Dagster history of the machine that ran them (a fresh clone after a pull)."""
    project = copy_project(two_experiments, tmp_path / "project")
    for data in (project / "data", project / "data" / "experiments" / "faster"):
        shutil.rmtree(data / "evaluations")
        shutil.rmtree(data / "run_state", ignore_errors=True)
    shutil.rmtree(project / ".dagster" / "storage", ignore_errors=True)
    pulled = compare(project, "default", "faster").stdout
    assert pulled.split("plot:")[0] == compare(two_experiments, "default", "faster").stdout.split("plot:")[0]
    assert "train.learning_rate" in pulled


def test_two_checkpoints_and_what_is_refused(two_experiments):
    text = compare(two_experiments, "r00", "r01").stdout
    assert "A = r00/checkpoint" in text and "B = r01/checkpoint" in text and "sampled" in text
    mixed = compare(two_experiments, "faster", "r01", check=False)
    assert mixed.returncode == 2 and "'faster' is an experiment, 'r01' is a checkpoint" in mixed.stderr
    missing = compare(two_experiments, "default", "nothing-here", check=False)
    assert missing.returncode == 2 and "nothing-here" in missing.stderr


def test_a_params_file_names_its_experiment_through_the_environment_too(two_experiments):
    """`compare` reads neither side from $RL_ASSETS_PARAMS: the same answer whichever experiment is current."""
    here = compare(two_experiments, "default", "faster").stdout
    env = {**project_env(two_experiments), "RL_ASSETS_PARAMS": "faster.yaml"}
    there = subprocess.run([PYTHON, "-m", "pipelines", "compare", "default", "faster"], cwd=two_experiments, env=env, capture_output=True,
                           text=True, timeout=300)
    assert there.stdout == here, there.stderr
