"""`compute.executor: slurm` against a real Slurm (slurmctld, slurmd and munged started here from Debian's packages):
the micro pipeline's compute step as a Slurm job, a job Slurm rejects, a cancelled run, a requeued job, a killed launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, REPO, copy_project, project_env, python
from faults import fault_project
from pipelines.launch.slurm_job import ENDED, MISSED_BEATS
from rl_assets.core.checkpoints import checkpoint_id, read_lineage
from slurm_support import job_state, local_slurm

pytestmark = pytest.mark.e2e

SLURM = ["--set", "compute.executor=slurm"]
CHECKPOINTS = ["r00/checkpoint", "r01/checkpoint"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def ids(project: Path) -> dict[str, str]:
    return {key: checkpoint_id(project / "data" / key) for key in CHECKPOINTS}


def job_ids(project: Path) -> list[str]:
    return [path.read_text() for path in sorted((project / ".rl_assets/slurm").glob("job-*/job_id"))]


def held_run(project: Path, env: dict, log: Path, hold_at: int) -> subprocess.Popen:
    """The run of a fault project (tests/faults.py) whose reward holds at its `hold_at`-th call, keeping the job busy there."""
    with open(log, "w") as out:
        return subprocess.Popen([PYTHON, "-m", "pipelines", "run", *SLURM], cwd=project, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**project_env(project), **env, "RL_ASSETS_DVC_COMMIT": "0", "FAULT_COUNTER": str(project / "fault_calls"),
                                     "FAULT_HOLD": str(hold_at)}, start_new_session=True)


def wait_for(condition, what: str, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the run ended (or timed out) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.1)


def test_the_compute_step_runs_as_a_slurm_job_and_makes_the_same_models(slurm, micro_template, pipeline_outputs, tmp_path):
    project = copy_project(micro_template, tmp_path / "project")
    done = python(["-m", "pipelines", "run", *SLURM], project, timeout=900, RL_ASSETS_DVC_COMMIT="0", **slurm)
    log = done.stdout + done.stderr
    [job] = job_ids(project)  # one resident child: one job for every output of the run
    assert f"slurm job {job} (rl-assets r00/checkpoint..promoted_model) submitted" in log and f"slurm job {job} running on" in log, log[-4000:]
    assert job_state(job, slurm)["JobState"] == "COMPLETED"
    assert "materialized r01/checkpoint" in log and "materialized promoted_model" in log
    assert ids(project) == ids(pipeline_outputs)  # the same models as the run on this machine's own processes


def test_a_job_slurm_rejects_fails_the_step_once_with_slurms_reason(slurm, micro_template, tmp_path):
    project = copy_project(micro_template, tmp_path / "project")
    done = python(["-m", "pipelines", "run", *SLURM, "--set", "compute.slurm.partition=nope"], project, timeout=600, check=False,
                  RL_ASSETS_DVC_COMMIT="0", **slurm)
    log = done.stdout + done.stderr
    assert done.returncode != 0 and "Slurm rejected the compute step's job: invalid partition specified: nope" in log, log[-4000:]
    assert log.count("launching: ") == 1, "a rejected job is not retried"
    assert not job_ids(project) and not (project / "data/r00/checkpoint").exists()


def test_a_cancelled_run_cancels_its_slurm_job(slurm, micro_template, tmp_path):
    project = fault_project(micro_template, tmp_path / "project")
    log = tmp_path / "run.log"
    process = held_run(project, slurm, log, hold_at=1)  # r00's held-out evaluation
    wait_for(lambda: (project / "fault_calls.held").exists(), "its job ran", process, log)
    [job] = job_ids(project)
    process.send_signal(signal.SIGTERM)  # Ctrl-C, `kill`: the CLI cancels the Dagster run
    process.wait(timeout=120)
    assert f"cancelling slurm job {job}" in log.read_text(), log.read_text()[-4000:]
    state = job_state(job, slurm)
    assert state["JobState"] == "CANCELLED", state
    assert not subprocess.run(["pgrep", "-f", f"pipes_child.*{project}"], capture_output=True).stdout  # nothing of it runs on


def test_a_requeued_job_continues_after_what_it_reported_and_makes_the_same_models(slurm, micro_template, pipeline_outputs, tmp_path):
    """Requeued while it scores r01's rewards (the fault reward holds there: r00's evaluation made the first two calls)."""
    project = fault_project(micro_template, tmp_path / "project")
    log = tmp_path / "run.log"
    process = held_run(project, slurm, log, hold_at=3)
    wait_for(lambda: (project / "fault_calls.held").exists() and "materialized r01/rollouts" in log.read_text(), "r01/rollouts was reported",
             process, log)
    [job] = job_ids(project)
    subprocess.run(["scontrol", "requeue", job], check=True, env={**os.environ, **slurm})  # as a preemption or a failed node does
    assert process.wait(timeout=900) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert f"slurm job {job} was requeued (restart 1)" in text, text[-4000:]
    assert "2 of its outputs were reported by an earlier attempt; continuing from r01/rewards" in text, text[-4000:]
    assert text.count("materialized r01/rollouts") == 1  # reported once, not written again
    assert ids(project) == ids(pipeline_outputs)  # the fault reward has weight 0: the same models as the plain run


def test_a_step_of_two_processes_runs_torchrun_inside_its_job_and_its_ranks_log_through_it(slurm, micro_template, pipeline_outputs, tmp_path):
    """compute.nproc 2: one job per output (no resident child), the training output's under torchrun in its job."""
    project = copy_project(micro_template, tmp_path / "project")
    done = python(["-m", "pipelines", "run", *SLURM, "--set", "compute.nproc=2"], project, timeout=900, RL_ASSETS_DVC_COMMIT="0",
                  OMP_NUM_THREADS="1", **slurm)
    log = done.stdout + done.stderr
    jobs = job_ids(project)
    assert len(jobs) == 6 and all(job_state(job, slurm)["JobState"] == "COMPLETED" for job in jobs), log[-4000:]  # r00, r01 x 3, evaluation, promotion
    assert "slurm job" in log and "(rl-assets r01/checkpoint) submitted" in log
    assert "[rank 1] rank 1 of 2" in log, log[-4000:]  # rank 1's lines, relayed from the job's log
    card = read_lineage(project / "data/r01/checkpoint")
    assert card["world_size"] == 2


def test_an_error_in_the_job_fails_the_step_once_with_the_childs_own_line(slurm, micro_template, tmp_path):
    """The child's error record crosses to Dagster through the project's shared folder, as its messages do."""
    import yaml

    project = copy_project(micro_template, tmp_path / "project")
    (project / "micro_bad.py").write_text("def bad(completions, **kwargs):\n    raise ValueError('this reward cannot score')\n")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rewards"]["functions"].append({"name": "micro_bad:bad", "weight": 0.0})
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = python(["-m", "pipelines", "run", *SLURM], project, timeout=600, check=False, RL_ASSETS_DVC_COMMIT="0", **slurm)
    log = done.stdout + done.stderr
    assert done.returncode != 0 and "ValueError: this reward cannot score" in log, log[-4000:]
    [job] = job_ids(project)  # failed once: an error that would recur is not retried
    assert job_state(job, slurm)["JobState"] == "FAILED" and job_state(job, slurm)["ExitCode"].startswith("65:")


def test_a_job_whose_launcher_is_killed_cancels_itself(slurm, tmp_path):
    """SIGKILL of the launcher (pipelines.launch.slurm_job), which then cannot scancel: the job sees its heartbeat stop and leaves the queue.
    While the launcher lives, the job runs on past more heartbeats than it tolerates missing."""
    folder, log = tmp_path / "step", tmp_path / "launcher.log"
    hold = [PYTHON, "-c", "import time; time.sleep(600)", str(folder)]  # the job's work, named by its folder for pgrep
    with open(log, "w") as out:
        launcher = subprocess.Popen([PYTHON, "-m", "pipelines.launch.slurm_job", "--folder", str(folder), "--heartbeat", "1", "--poll", "0.2", "--",
                                     *hold], cwd=tmp_path, env={**os.environ, **slurm, "PYTHONPATH": str(REPO)}, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (folder / "job_id").is_file() and job_state((folder / "job_id").read_text(), slurm).get("JobState") == "RUNNING",
                 "its job ran", launcher, log, timeout=60)
        job, beat, beats = (folder / "job_id").read_text(), folder / "launcher.beat", set()
        wait_for(lambda: beats.add(beat.read_text()) or len(beats) > MISSED_BEATS + 1, "the launcher beat", launcher, log, timeout=60)
        assert job_state(job, slurm).get("JobState") == "RUNNING", (folder / "job.log").read_text()  # a live launcher's job is left alone
    finally:
        launcher.kill()  # SIGKILL
        launcher.wait(timeout=60)
    killed, deadline = time.monotonic(), time.monotonic() + 30
    while (state := job_state(job, slurm)).get("JobState") not in ENDED and time.monotonic() < deadline:  # on through COMPLETING
        time.sleep(0.2)
    assert state.get("JobState") == "CANCELLED", (state, (folder / "job.log").read_text())
    assert f"no heartbeat from the launcher for over {MISSED_BEATS} s" in (folder / "job.log").read_text()
    print(f"the job left the queue {time.monotonic() - killed:.1f} s after its launcher was killed")
    while subprocess.run(["pgrep", "-f", f"time.sleep.600. {folder}"], capture_output=True).stdout:  # nothing of it runs on
        assert time.monotonic() < deadline, "the job's processes outlived it"
        time.sleep(0.2)
