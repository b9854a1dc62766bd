"""Kill-and-resume: a training step killed with SIGKILL at a random point and rerun ends with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest
from safetensors.torch import load_file

from conftest import PYTHON, copy_project, project_env, python
from rl_assets.core.checkpoints import read_lineage

pytestmark = pytest.mark.e2e

# 32 micro rollouts in minibatches of 2 for 4 epochs: 64 optimizer steps, a state every 4.
SETTINGS = ["--set", "train.minibatch_size=2", "--set", "train.epochs=4", "--set", "train.save_steps=4", "--set", "train.keep_last=2"]
TRAIN = ["-m", "rl_assets.run.step", "train", "--round", "1", *SETTINGS]
ENV = {"OMP_NUM_THREADS": "1"}


def newest_saved_step(project) -> int:
    states = sorted((project / "data/r01/train_state").glob("step-*/trainer_state.json"))
    return json.loads(states[-1].read_text())["step"] if states else 0


def test_sigkill_then_rerun_resumes_and_matches_an_uninterrupted_run(pipeline_outputs, tmp_path):
    whole = copy_project(pipeline_outputs, tmp_path / "whole")
    python(TRAIN, whole, timeout=600, **ENV)
    assert read_lineage(whole / "data/r01/checkpoint")["metrics"]["resumed_from_step"] == 0
    assert not (whole / "data/r01/train_state").exists(), "a finished round keeps no resume points"

    killed = copy_project(pipeline_outputs, tmp_path / "killed")
    before = (killed / "data/r01/checkpoint/model.safetensors").read_bytes()
    kill_after = random.Random().choice(range(4, 60, 4))  # a random save point; the kill lands somewhere after it
    process = subprocess.Popen([PYTHON, *TRAIN], cwd=killed, env=project_env(killed, **ENV), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 600
    while newest_saved_step(killed) < kill_after and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL, f"the step ended before the kill: {process.stderr.read()[-2000:]}"
    saved = newest_saved_step(killed)
    assert saved >= kill_after
    # the killed step never replaced the old output
    assert (killed / "data/r01/checkpoint/model.safetensors").read_bytes() == before

    python(TRAIN, killed, timeout=600, **ENV)
    card = read_lineage(killed / "data/r01/checkpoint")
    assert card["metrics"]["resumed_from_step"] >= saved, f"killed after step {kill_after}"
    first, second = load_file(whole / "data/r01/checkpoint/model.safetensors"), load_file(killed / "data/r01/checkpoint/model.safetensors")
    assert all((first[k] == second[k]).all() for k in first), f"resumed from step {saved}: weights differ from the uninterrupted run"
    assert card["history"] == read_lineage(whole / "data/r01/checkpoint")["history"]


def test_rerun_with_other_params_refuses_the_saved_state(pipeline_outputs, tmp_path):
    project = copy_project(pipeline_outputs, tmp_path / "project")
    process = subprocess.Popen([PYTHON, *TRAIN], cwd=project, env=project_env(project, **ENV), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while newest_saved_step(project) < 8 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert newest_saved_step(project) >= 8
    refused = python([*TRAIN, "--set", "train.learning_rate=0.02"], project, timeout=600, check=False, **ENV)
    assert refused.returncode != 0
    assert "refusing to continue it" in refused.stderr and "train.learning_rate: saved 0.01, now 0.02" in refused.stderr
