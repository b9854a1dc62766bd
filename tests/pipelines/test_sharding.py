"""compute.sharding: fsdp: torch's FSDP2 shards the training step over 2 gloo processes on this CPU. Against the DDP run of
the same round: the weights, the whole optimizer state gathered at the end, the next round continuing those moments
in the sharded model, and a killed sharded round resumed from every rank's saved shards."""

from __future__ import annotations

import random
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from conftest import PYTHON, copy_project, project_env, python
from faults import kill_group_when
from rl_assets.core.checkpoints import read_lineage

pytestmark = pytest.mark.e2e

ATOL = 1e-5
TWO = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TRAIN = ["-m", "rl_assets.run.step", "train", "--round", "1", "--set", "compute.nproc=2"]
FSDP = ["--set", "compute.sharding=fsdp"]
ENV = {"OMP_NUM_THREADS": "1"}


def weights(project, key: str = "r01/checkpoint") -> dict:
    return load_file(project / "data" / key / "model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def carried_moments(project, key: str = "r01/checkpoint") -> dict:
    """The AdamW state the round left for the next one (data/run_state), name-keyed and whole."""
    checkpoint = read_lineage(project / "data" / key)["checkpoint_id"]
    return torch.load(project / f"data/run_state/optimizer/{checkpoint}.pt", weights_only=False)["optimizer"]["state"]


@pytest.fixture(scope="module")
def rounds(pipeline_outputs, tmp_path_factory):
    """Round 1 retrained by 2 processes, with DDP and with FSDP."""
    root = tmp_path_factory.mktemp("sharding")
    ddp, fsdp = copy_project(pipeline_outputs, root / "ddp"), copy_project(pipeline_outputs, root / "fsdp")
    python([*TWO, *TRAIN], ddp, timeout=600, **ENV)
    done = python([*TWO, *TRAIN, *FSDP], fsdp, timeout=600, **ENV)
    return {"pipeline": pipeline_outputs, "ddp": ddp, "fsdp": fsdp, "log": done.stdout + done.stderr}


def test_a_sharded_round_makes_the_ddp_rounds_weights(rounds):
    update = max_difference(weights(rounds["pipeline"], "r00/checkpoint"), weights(rounds["ddp"]))
    assert update > 100 * ATOL, "no update: the comparison would be vacuous"
    difference = max_difference(weights(rounds["ddp"]), weights(rounds["fsdp"]))
    assert difference <= ATOL, f"max |w_ddp - w_fsdp| = {difference:.3g} (the update: {update:.3g})"
    ddp, fsdp = (read_lineage(rounds[name] / "data/r01/checkpoint") for name in ("ddp", "fsdp"))
    assert fsdp["world_size"] == 2 and fsdp["metrics"]["grad_norm"] == pytest.approx(ddp["metrics"]["grad_norm"], rel=1e-5)


def test_the_whole_optimizer_state_is_gathered_by_name_as_ddp_keeps_it(rounds):
    ddp, fsdp = carried_moments(rounds["ddp"]), carried_moments(rounds["fsdp"])
    assert sorted(ddp) == sorted(fsdp) and "model.embed_tokens.weight" in fsdp
    for name in ddp:
        assert fsdp[name]["exp_avg"].shape == ddp[name]["exp_avg"].shape  # whole tensors, not one rank's shard
        assert torch.allclose(fsdp[name]["exp_avg"], ddp[name]["exp_avg"], atol=1e-7)
        assert torch.allclose(fsdp[name]["exp_avg_sq"], ddp[name]["exp_avg_sq"], atol=1e-9)
        assert fsdp[name]["step"] == ddp[name]["step"]


def test_two_sharded_rounds_continue_the_moments_as_ddp_does(micro_template, tmp_path):
    """The pipeline with rounds 2: round 2 loads round 1's whole moments into its sharded model (set_optimizer_state_dict)."""
    projects = {}
    for name, extra in (("ddp", []), ("fsdp", FSDP)):
        project = projects[name] = copy_project(micro_template, tmp_path / name)
        python(["-m", "pipelines", "run", "--set", "rounds=2", "--set", "compute.nproc=2", *extra], project, timeout=1200,
               RL_ASSETS_DVC_COMMIT="0", **ENV)
    card = read_lineage(projects["fsdp"] / "data/r02/checkpoint")
    assert card["metrics"]["carried_optimizer_state"] is True and card["world_size"] == 2
    difference = max_difference(weights(projects["ddp"], "r02/checkpoint"), weights(projects["fsdp"], "r02/checkpoint"))
    assert difference <= ATOL, f"max |w_ddp - w_fsdp| after two rounds = {difference:.3g}"


def test_a_killed_sharded_round_resumes_from_every_ranks_shards(pipeline_outputs, tmp_path):
    settings = ["--set", "train.minibatch_size=2", "--set", "train.epochs=4", "--set", "train.save_steps=4", "--set", "train.keep_last=2"]
    command = [*TWO, *TRAIN, *FSDP, *settings]
    whole = copy_project(pipeline_outputs, tmp_path / "whole")
    python(command, whole, timeout=900, **ENV)

    killed = copy_project(pipeline_outputs, tmp_path / "killed")
    states = killed / "data/r01/train_state"
    process = subprocess.Popen([PYTHON, *command], cwd=killed, env=project_env(killed, **ENV), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    kill_after, deadline = random.Random().choice(range(8, 56, 4)), time.monotonic() + 600

    def newest() -> int:
        saved = sorted(states.glob("step-*/trainer_state.json"))
        return int(saved[-1].parent.name.split("-")[1]) if saved else 0

    kill_group_when(process, lambda: newest() >= kill_after, timeout=deadline - time.monotonic(), workers_too=True)
    process.wait(timeout=60)
    saved = newest()
    assert saved >= kill_after, f"the round ended before the kill: {process.stderr.read().decode()[-2000:]}"
    assert list((states / f"step-{saved:06d}" / "sharded").glob("*.distcp")), "every rank's shards are in the saved state"

    python(command, killed, timeout=900, **ENV)
    card = read_lineage(killed / "data/r01/checkpoint")
    assert card["metrics"]["resumed_from_step"] >= saved
    first, second = weights(whole), weights(killed)
    assert all(torch.equal(first[k], second[k]) for k in first), f"resumed from step {saved}: weights differ from the uninterrupted run"
