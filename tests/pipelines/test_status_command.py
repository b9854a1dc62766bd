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
    assert report["never_ran"] == "this project has no run yet: `rl-assets run` starts one"


def test_status_shows_the_latest_runs_times_as_local_iso_times(project, capsys):
    @op
    def step():
        return None

    @job(name="rl_pipeline")  # the job `rl-assets run` launches
    def rl_pipeline():
        step()

    with DagsterInstance.get() as instance:
        assert rl_pipeline.execute_in_process(instance=instance).success
    code, report = status(project, capsys)
    assert code == 0 and report["healthy"] is True and "never_ran" not in report
    run = report["latest_run"]
    assert re.fullmatch(LOCAL_TIME, run["started"]) and re.fullmatch(LOCAL_TIME, run["ended"]), run
    assert run["started"] <= run["ended"]
