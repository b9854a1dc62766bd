"""The compute step records its outputs in dvc.lock at its end, several stages in one commit (pipelines/records/dvc_commit.py).

A commit per output (~1.4 s of CPU each) ran beside the training child and slowed it. What a step wrote waits in
a journal until then; a run killed before its step ended leaves the journal, and the next `rl-assets run` records it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import DVC, MICRO_OUTPUTS, copy_project, dvc_status, import_pipelines, python

pytestmark = pytest.mark.e2e

LEFT_OUT = ["r01-rewards", "r01-checkpoint", "evaluation"]


class Log:
    def __init__(self):
        self.lines: list[str] = []

    def warning(self, message: str) -> None:
        self.lines.append(f"warning: {message}")

    def info(self, message: str) -> None:
        self.lines.append(message)


@pytest.fixture()
def unrecorded(reproduced_project, tmp_path):
    """A reproduced micro project whose dvc.lock lost three stages, as if their step was killed before recording them."""
    project = copy_project(reproduced_project["path"], tmp_path / "project")
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    recorded = {stage: lock["stages"].pop(stage) for stage in LEFT_OUT}
    (project / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    assert set(dvc_status(project)) >= set(LEFT_OUT)
    return project, recorded


def journal_of(project, stages: list[str]) -> list[dict]:
    written = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    return [{"stage": stage, "params": [k for k in written[stage].get("params", []) if isinstance(k, str)],
             "params_file": "params.yaml", "overrides": []} for stage in stages]


def test_one_commit_of_several_stages_records_what_dvc_commit_records(unrecorded, monkeypatch):
    project, recorded = unrecorded
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(project)
    assert dvc.dvc_python(str(DVC)) is not None  # the helper runs, not the one-stage-at-a-time fallback
    log = Log()
    with dvc._dvc_lock_held():
        assert dvc.commit_stages(log, journal_of(project, LEFT_OUT), str(DVC)) == LEFT_OUT
    assert log.lines == []
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert {stage: lock[stage] for stage in LEFT_OUT} == recorded
    assert dvc_status(project) == {}


def test_a_stage_whose_output_is_gone_is_named_and_the_others_are_recorded(unrecorded, monkeypatch):
    project, recorded = unrecorded
    (project / MICRO_OUTPUTS["evaluation"]).unlink()
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(project)
    log = Log()
    with dvc._dvc_lock_held():
        assert dvc.commit_stages(log, journal_of(project, LEFT_OUT), str(DVC)) == ["r01-rewards", "r01-checkpoint"]
    assert len(log.lines) == 1 and log.lines[0].startswith("warning: dvc commit evaluation failed: failed to commit evaluation")
    assert MICRO_OUTPUTS["evaluation"] in log.lines[0]
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert "evaluation" not in lock and lock["r01-checkpoint"] == recorded["r01-checkpoint"]


def test_the_next_run_records_what_a_killed_run_left_in_the_journal(unrecorded):
    project, recorded = unrecorded
    journal = project / ".dvc" / "tmp" / "rl-assets-unrecorded.json"
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text(json.dumps(journal_of(project, LEFT_OUT)))
    done = python(["-m", "pipelines", "run"], project, timeout=300)
    assert f"dvc.lock: recorded 3 stages an earlier run wrote and was stopped before recording ({', '.join(LEFT_OUT)})" in done.stderr
    assert done.stderr.index("dvc.lock: recorded 3 stages") < done.stderr.index("running ")  # before the run starts
    assert not journal.exists()
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert {stage: lock[stage] for stage in LEFT_OUT} == recorded
    assert dvc_status(project) == {}


def test_dvc_python_is_the_interpreter_of_dvcs_script_or_none(tmp_path):
    dvc = import_pipelines("pipelines.records.dvc")
    shell = tmp_path / "dvc"
    shell.write_text("#!/bin/sh\nexit 0\n")
    assert dvc.dvc_python(str(shell)) is None  # not Python: commit_stages falls back to `dvc commit`, one stage at a time
    assert dvc.dvc_python(str(tmp_path / "missing")) is None
    assert Path(dvc.dvc_python(str(DVC))).name.startswith("python")  # make test installs DVC


def test_under_dvc_repro_nothing_is_journaled(micro_copy, monkeypatch):
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(micro_copy)
    monkeypatch.setenv("DVC_STAGE", "raw_data")  # dvc repro records the stage itself
    dvc.record_in_dvc(SimpleNamespace(log=Log()), "raw_data", later=True)
    assert not (micro_copy / ".dvc" / "tmp" / "rl-assets-unrecorded.json").exists()


def test_a_journal_whose_params_file_is_gone_is_still_recorded(unrecorded, monkeypatch):
    project, recorded = unrecorded
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(project)
    entries = [{**entry, "params_file": "moved-away.yaml"} for entry in journal_of(project, LEFT_OUT)]
    log = Log()
    with dvc._dvc_lock_held():
        assert dvc.commit_stages(log, entries, str(DVC)) == LEFT_OUT
    assert len(log.lines) == 3 and all("moved-away.yaml" in line and "keeps params.yaml's values" in line for line in log.lines)
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert {stage: lock[stage] for stage in LEFT_OUT} == recorded


def test_the_follower_commits_stages_as_they_come_and_writes_dvc_lock_once_at_the_end(unrecorded, monkeypatch):
    """What the compute step does: each stage sent as its output is reported, dvc.lock written at `record_journal`."""
    project, recorded = unrecorded
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(project)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    first, *rest = LEFT_OUT
    dvc._write_journal(journal_of(project, [first]))  # journaled before the follower starts (raw_data and prompts do so)
    follower = dvc.JournalFollower()
    for stage in rest:
        dvc._write_journal(dvc._read_journal() + journal_of(project, [stage]))
        follower.send(stage)
    assert follower.sent == LEFT_OUT  # the journal's earlier stage went first
    lock_before = (project / "dvc.lock").read_text()
    assert follower.process.poll() is None and (project / "dvc.lock").read_text() == lock_before  # nothing written before END
    log = Log()
    assert dvc.record_journal(log, follower) == LEFT_OUT
    assert log.lines == [] and follower.process.returncode == 0
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert {stage: lock[stage] for stage in LEFT_OUT} == recorded
    assert dvc_status(project) == {}
    assert not dvc.JOURNAL.exists()


def test_a_follower_stopped_before_the_end_writes_nothing(unrecorded, monkeypatch):
    """A step killed while its child ran: dvc.lock stays as it was and the journal waits for the next run."""
    project, _ = unrecorded
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(project)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    lock_before = (project / "dvc.lock").read_text()
    dvc._write_journal(journal_of(project, LEFT_OUT))
    follower = dvc.JournalFollower()
    follower.send(LEFT_OUT[-1])
    follower.stop()  # stdin closed without END
    assert follower.process.returncode != 0
    assert (project / "dvc.lock").read_text() == lock_before
    assert [entry["stage"] for entry in dvc._read_journal()] == LEFT_OUT


def test_raw_data_and_prompts_wait_in_the_journal_only_when_the_compute_step_follows_in_their_run():
    steps = import_pipelines("pipelines.launch.steps")
    run = lambda keys: SimpleNamespace(run=SimpleNamespace(step_keys_to_execute=keys))  # noqa: E731
    assert steps.compute_step_follows(run(["raw_data", "prompts", "compute"]))
    assert steps.compute_step_follows(run(None))  # every step of the job
    assert not steps.compute_step_follows(run(["raw_data", "prompts"]))  # a data-only run records them itself
