"""`rl-assets status` (pipelines/cli.py print_status) in-process, on a fake project and its own Dagster instance: what it
says before any run, and the latest run's times as a person reads them."""

from __future__ import annotations

import json
import re

import pytest
from dagster import DagsterInstance, job, op

from conftest import import_pipelines
from ops_support import make_fake_project

LOCAL_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"


@pytest.fixture
def project(tmp_path, monkeypatch):
    cli = import_pipelines("pipelines.cli")
    root = make_fake_project(tmp_path / "project", rounds=1)
    (root / ".dagster").mkdir()
    monkeypatch.chdir(root)
    for name in ("RL_ASSETS_PARAMS", "RL_ASSETS_SET", "DVC_STAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(root / ".dagster"))
    return cli


def status(cli, capsys) -> tuple[int, dict]:
    code = cli.print_status()
    return code, json.loads(capsys.readouterr().out)


def test_status_before_any_run_says_it_never_ran_not_healthy(project, capsys):
    code, report = status(project, capsys)
    assert code == 0 and report["healthy"] is None and report["latest_run"] is None
    assert report["never_ran"] == "experiment 'default' has no run yet: `rl-assets run` starts one"


def a_run(experiment: str = "default", params_file: str = "params.yaml") -> None:
    """A finished run of the job `rl-assets run` launches, tagged as it tags them."""
    @op
    def step():
        return None

    @job(name="rl_pipeline")
    def rl_pipeline():
        step()

    with DagsterInstance.get() as instance:
        tags = {"rl_assets/experiment": experiment, "rl_assets/params_file": params_file}
        assert rl_pipeline.execute_in_process(instance=instance, tags=tags).success


def test_status_shows_the_latest_runs_times_as_local_iso_times(project, capsys):
    a_run()
    code, report = status(project, capsys)
    assert code == 0 and report["healthy"] is True and "never_ran" not in report
    run = report["latest_run"]
    assert re.fullmatch(LOCAL_TIME, run["started"]) and re.fullmatch(LOCAL_TIME, run["ended"]), run
    assert run["started"] <= run["ended"]


def test_status_describes_the_experiment_serve_serves_and_points_to_a_later_run_of_another(project, capsys):
    """Without $RL_ASSETS_PARAMS, `serve` serves params.yaml's experiment: status (and /health, which asks it) describes
    that one, not whichever experiment ran last, and says how to see the other."""
    a_run("units", "units/params.yaml")
    code, report = status(project, capsys)
    assert report["experiment"] == "default" and report["latest_run"] is None and "never_ran" in report
    other = report["latest_run_of_another_experiment"]
    assert other["experiment"] == "units" and other["shown_by"] == "RL_ASSETS_PARAMS=units/params.yaml rl-assets status"
    a_run()
    code, report = status(project, capsys)
    assert report["latest_run"]["experiment"] == "default" and "latest_run_of_another_experiment" not in report
