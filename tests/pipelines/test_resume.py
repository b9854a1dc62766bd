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
from faults import kill_group_when
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
    kill_group_when(process, lambda: newest_saved_step(killed) >= kill_after)
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
    kill_group_when(process, lambda: newest_saved_step(project) >= 8)
    process.wait(timeout=60)
    assert newest_saved_step(project) >= 8
    refused = python([*TRAIN, "--set", "train.learning_rate=0.02"], project, timeout=600, check=False, **ENV)
    assert refused.returncode != 0
    assert "refusing to continue it" in refused.stderr and "train.learning_rate: saved 0.01, now 0.02" in refused.stderr


def test_a_rank_killed_mid_round_makes_torchrun_restart_the_group_which_resumes_from_its_last_state(pipeline_outputs, tmp_path):
    """torchrun --max-restarts with 2 processes: one rank SIGKILLed after a save point (a lost GPU, a dead process); torchrun
    restarts both, they resume from the newest saved state and end with the uninterrupted 2-process run's weights.
    More than one restart is allowed: a restarted gloo group on a loaded machine can fail to connect once (seen in a full
    suite run: "connectFullMesh failed ... Connection refused"), and each restart resumes from the newest state."""
    elastic = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    whole = copy_project(pipeline_outputs, tmp_path / "whole")
    python([*elastic, *TRAIN], whole, timeout=900, **ENV)

    killed = copy_project(pipeline_outputs, tmp_path / "killed")
    process = subprocess.Popen([PYTHON, *elastic, "--max-restarts=3", *TRAIN], cwd=killed, env=project_env(killed, **ENV),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    kill_after = random.Random().choice(range(8, 56, 4))
    deadline = time.monotonic() + 600
    while newest_saved_step(killed) < kill_after and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, f"torchrun's workers: {workers}"
    os.kill(int(random.Random().choice(workers)), signal.SIGKILL)
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err[-3000:]
    card = read_lineage(killed / "data/r01/checkpoint")
    assert card["metrics"]["resumed_from_step"] >= kill_after, f"killed after step {kill_after}: {card['metrics']['resumed_from_step']}"
    first, second = load_file(whole / "data/r01/checkpoint/model.safetensors"), load_file(killed / "data/r01/checkpoint/model.safetensors")
    assert all((first[k] == second[k]).all() for k in first), "resumed under torchrun: weights differ from the uninterrupted run"
