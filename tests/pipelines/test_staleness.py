"""rollouts.staleness k=1 through the whole pipeline: round N samples from checkpoint N-2, lineage says which policy
sampled every row, training corrects for it, DVC's graph follows, and a run killed between outputs resumes to the
uninterrupted run's ids."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import copy_project, python, with_params
from rl_assets.core.checkpoints import checkpoint_id, read_lineage
from rl_assets.core.schemas import read_table
from test_killed_run import kill, start_run, wait_for

pytestmark = pytest.mark.e2e

ROUNDS = 3


def stale_project(micro_template, root):
    return with_params(copy_project(micro_template, root / "project"),
                       lambda params: params.update(rounds=ROUNDS, rollouts={**params["rollouts"], "staleness": 1},
                                                    compute={**params["compute"], "overlap": True}))


@pytest.fixture(scope="module")
def stale_run(micro_template, tmp_path_factory):
    project = stale_project(micro_template, tmp_path_factory.mktemp("stale"))
    python(["-m", "pipelines", "run"], project, timeout=1200)
    return project


def ids(project) -> list[str]:
    return [checkpoint_id(project / f"data/r{n:02d}/checkpoint") for n in range(ROUNDS + 1)]


def test_each_round_samples_from_the_checkpoint_before_its_parent_and_says_so(stale_run):
    project = stale_run
    checkpoints = ids(project)
    for n, sampler in ((1, 0), (2, 0), (3, 1)):
        rollouts = read_table(project / f"data/r{n:02d}/rollouts.parquet", "rollouts")
        assert set(rollouts["policy_id"].to_pylist()) == {checkpoints[sampler]}, n
        card = read_lineage(project / f"data/r{n:02d}/checkpoint")
        assert card["parent"] == checkpoints[n - 1] and card["sampled_by"] == [checkpoints[sampler]]
        stale = card["metrics"]["stale_rows"]
        assert stale == (0 if n == 1 else rollouts.num_rows), n  # r01's sampler is its parent; later rounds' is one older
        assert 0 <= card["metrics"]["sampler_capped"] <= 1
    dvc = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    assert "data/r00/checkpoint" in dvc["r02-rollouts"]["deps"] and "data/r01/checkpoint" not in dvc["r02-rollouts"]["deps"]
    assert "data/r01/checkpoint" in dvc["r03-rollouts"]["deps"]
    lineage = json.loads(python(["-m", "pipelines", "lineage", "r03", "--json"], project, timeout=300).stdout)
    r03 = next(step for step in lineage if step.get("round") == 3)
    assert r03["rollouts"]["sampled_by"] == checkpoints[1]


def test_a_run_killed_between_outputs_resumes_to_the_uninterrupted_runs_ids(stale_run, micro_template, tmp_path):
    project = stale_project(micro_template, tmp_path)
    first = start_run(project)
    wait_for(lambda: (project / "data/r02/rollouts.parquet").exists(), first)  # sampled from r00 while r01 is done
    kill(first)
    python(["-m", "pipelines", "run"], project, timeout=1200)
    assert ids(project) == ids(stale_run)


def test_a_rounds_training_ran_beside_the_next_rounds_sampling(stale_run):
    """The run's steps as Dagster logged them: r01's training overlapped r02's sampling (both wait for r00 only), one op of each
    lane at a time, and every op but r00's and the evaluation's in a lane of its own."""
    from dagster import DagsterEventType, DagsterInstance

    with DagsterInstance.from_config(str(stale_run / ".dagster")) as instance:
        run = instance.get_runs(limit=1)[0]
        spans, started = {}, {}
        for event in instance.all_logs(run.run_id):
            kind = event.dagster_event.event_type if event.dagster_event else None
            if kind == DagsterEventType.STEP_START:
                started[event.step_key] = event.timestamp
            elif kind == DagsterEventType.STEP_SUCCESS:
                spans[event.step_key] = (started[event.step_key], event.timestamp)
    assert set(spans) == {"raw_data", "prompts", "compute_r00", "compute_evaluation",
                          *(f"compute_{lane}_r0{n}" for lane in ("sample", "train") for n in range(1, ROUNDS + 1))}

    def overlap(a, b):
        return min(spans[a][1], spans[b][1]) - max(spans[a][0], spans[b][0])

    assert overlap("compute_train_r01", "compute_sample_r02") > 0
    for lane in ("sample", "train"):
        for n in range(1, ROUNDS):
            assert overlap(f"compute_{lane}_r0{n}", f"compute_{lane}_r0{n + 1}") <= 0, (lane, n)
