"""A whole run killed with SIGKILL (process group) while a compute step holds the gpu slot, and at a random point:
the rerun frees what the dead run held, continues from the first unfinished asset and ends with the
checkpoints of an uninterrupted run. While a run writes, a second one is refused, naming it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus

from conftest import MICRO_OUTPUTS, PYTHON, copy_project, project_env, python
from rl_assets.core.checkpoints import checkpoint_id
from rl_assets.run.heartbeat import running_steps

pytestmark = pytest.mark.e2e

CHECKPOINTS = ["r00/checkpoint", "r01/checkpoint"]


def start_run(project) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "pipelines", "run"], cwd=project, env=project_env(project), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(condition, process, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the run ended before the kill: {process.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the run")
        time.sleep(0.05)


def compute_step_running(project, since: float = 0.0) -> bool:
    """A compute stage that started after `since` beats in a live process (rl_assets/run/heartbeat.py, what `rl-assets status`
    reads): its step holds the gpu slot. Read from the project's files, not the instance, which the run may be creating.
    `since`: a killed run's child can linger as a zombie (nothing reaps it in a container), its heartbeat looking alive."""
    return any(step["started"] >= since for step in running_steps(project))


def gpu_slot_claimed(project) -> bool:
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        return instance.event_log_storage.get_concurrency_info("gpu").active_slot_count > 0


def kill(process) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def test_a_killed_run_is_continued_by_the_next_and_a_second_writer_is_refused(pipeline_outputs, micro_copy):
    project = micro_copy
    first = start_run(project)
    wait_for(lambda: compute_step_running(project), first)  # a compute step (r00's SFT) holds the gpu slot

    # a second writer while the first runs is refused, naming the running one
    second = python(["-m", "pipelines", "run"], project, timeout=300, check=False)
    assert second.returncode == 3, second.stderr[-3000:]
    assert "another run is writing this project's data" in second.stderr and f"pid {first.pid}" in second.stderr

    kill(first)
    assert gpu_slot_claimed(project), "the dead run still holds its slot (what used to block the next run)"

    # killed again at a random point of the rerun's compute child (the resident child writes the rest of the micro pipeline
    # in 3-5 s here: a later kill lands after its outputs, or after the run, and tests nothing)
    started = time.time()
    again = start_run(project)
    wait_for(lambda: compute_step_running(project, since=started), again)
    time.sleep(random.Random().uniform(0.0, 1.5))
    assert again.poll() is None, "the rerun finished before the kill"
    kill(again)

    done = python(["-m", "pipelines", "run"], project, timeout=900)
    assert "marked it failed and freed its gpu pool slot" in done.stderr
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        runs = instance.get_runs()
        assert runs[0].status == DagsterRunStatus.SUCCESS, [(r.run_id[:8], r.status.value, r.tags.get("rl_assets/pid")) for r in runs]
        assert all(run.status == DagsterRunStatus.FAILURE for run in runs[1:]), [run.status for run in runs]
        assert instance.get_latest_materialization_event(AssetKey("evaluation")) is not None
    for key in CHECKPOINTS:  # the same weights as an uninterrupted pipeline
        assert checkpoint_id(project / MICRO_OUTPUTS[key]) == checkpoint_id(pipeline_outputs / MICRO_OUTPUTS[key]), key

    # nothing changed: the next run does nothing
    rerun = python(["-m", "pipelines", "run"], project, timeout=300)
    assert "nothing to do: all" in rerun.stderr


def test_run_all_reruns_every_asset(pipeline_outputs, tmp_path):
    project = copy_project(pipeline_outputs, tmp_path / "project")
    done = python(["-m", "pipelines", "run", "--all"], project, timeout=900)
    assert "nothing to do" not in done.stderr and "are up to date" not in done.stderr
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        latest = instance.get_runs(limit=1)[0]
        events = instance.get_latest_materialization_events([AssetKey(k.split("/")) for k in MICRO_OUTPUTS])
        materialized = {key for key, event in events.items() if event is not None and event.run_id == latest.run_id}
    assert materialized == {AssetKey(k.split("/")) for k in MICRO_OUTPUTS}
    handed = [event.user_message for event in instance_logs(project, latest.run_id) if "the warm child" in event.user_message]
    assert len(handed) == 1 and "runs it" in handed[0], handed  # the compute step ran in the child the CLI started ahead
    for key in CHECKPOINTS:  # with the same weights
        assert checkpoint_id(project / MICRO_OUTPUTS[key]) == checkpoint_id(pipeline_outputs / MICRO_OUTPUTS[key]), key


def instance_logs(project, run_id: str) -> list:
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        return instance.all_logs(run_id)
