"""Exact resume: a 2-round micro run stopped at a chosen moment, by SIGKILL of its process group or SIGTERM of its CLI,
then rerun, ends with the checkpoint ids of an uninterrupted run (issue 25, problem 1).

Each code path once here; `bench/fault_matrix.py` sweeps every output and every reward call with both signals.
"""

from __future__ import annotations

import random
import shutil

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from conftest import copy_project, python
from faults import SIGNALS, checkpoint_ids, fault_project, interrupted, resumed
from rl_assets.core.checkpoints import read_lineage

pytestmark = pytest.mark.e2e


def heldout_of_the_last_round(reference_calls: int) -> int:
    """The first reward call of r02/checkpoint's held-out evaluation: each checkpoint's evaluation scores twice (greedy, then
    sampled) and comes last; the evaluation asset and the promotion reuse those scores."""
    return reference_calls - 1


@pytest.mark.parametrize("how", list(SIGNALS))
def test_stopped_after_a_round_saved_its_moments_and_before_it_was_reported(how, fault_reference, micro_template, tmp_path):
    """The bug of 076a03d: round 2's checkpoint and its optimizer moments were on disk, unreported; the rerun trained round 2
    again from round 2's own moments (or, finding them keyed to another checkpoint, from none) and made another model."""
    project = fault_project(micro_template, tmp_path / "project")
    code, log = interrupted(project, f"hold:{heldout_of_the_last_round(fault_reference['calls'])}", how)
    assert code != 0, log[-3000:]
    assert "materialized r02/rewards" in log and "materialized r02/checkpoint" not in log, log[-3000:]
    assert (project / "data/r02/checkpoint/lineage.json").is_file(), "the stop came before r02 was saved"
    if how == "term-cli":  # a graceful stop: the run is canceled, not failed, and the summary says what was written
        assert "run STOPPED after" in log and "stopped after writing 8 outputs (raw_data, prompts, r00/checkpoint" in log, log[-3000:]
        with DagsterInstance.from_config(str(project / ".dagster")) as instance:
            assert instance.get_runs(limit=1)[0].status == DagsterRunStatus.CANCELED
    done = resumed(project)
    assert checkpoint_ids(project) == fault_reference["ids"], done.stderr[-3000:]
    card = read_lineage(project / "data/r02/checkpoint")
    assert card["metrics"]["carried_optimizer_state"] is True


def test_sigkill_right_after_an_output_is_reported(fault_reference, micro_template, tmp_path):
    project = fault_project(micro_template, tmp_path / "project")
    interrupted(project, "after:r02/rollouts", "kill-group")
    resumed(project)
    assert checkpoint_ids(project) == fault_reference["ids"]


def test_a_crash_at_a_random_reward_call(fault_reference, micro_template, tmp_path):
    project = fault_project(micro_template, tmp_path / "project")
    call = random.Random().randint(1, fault_reference["calls"])
    interrupted(project, f"reward:{call}", random.Random().choice(list(SIGNALS)))
    resumed(project)
    assert checkpoint_ids(project) == fault_reference["ids"], f"stopped at reward call {call} of {fault_reference['calls']}"


def test_lost_moments_make_their_round_train_again_instead_of_training_on_without_them(fault_reference, micro_template, tmp_path):
    project = copy_project(fault_reference["path"], tmp_path / "project")
    r01 = read_lineage(project / "data/r01/checkpoint")["checkpoint_id"]
    (project / f"data/run_state/optimizer/{r01}.pt").unlink()
    shutil.rmtree(project / "data/r02/checkpoint")
    done = resumed(project)
    assert "r01/checkpoint (its carried optimizer moments are gone from data/run_state" in done.stderr, done.stderr[-3000:]
    assert checkpoint_ids(project) == fault_reference["ids"]

    # asked for r02 alone (DVC's stage, a UI click), the step refuses rather than train on without r01's moments
    (project / f"data/run_state/optimizer/{r01}.pt").unlink()
    refused = python(["-m", "pipelines", "materialize", "r02/checkpoint"], project, timeout=600, check=False, RL_ASSETS_SET="rounds=2")
    assert refused.returncode != 0
    assert "its AdamW moments are gone" in refused.stderr and f"optimizer/{r01}.pt" in refused.stderr, refused.stderr[-3000:]
