"""Resident rounds: one child writes a run's rounds with the models kept loaded, and gives the same bits as one output at a time.

The micro project with 2 rounds, a KL penalty (so the reference stays loaded) and carried optimizer
moments: `rl-assets run` (one resident child for the rounds) against `rl-assets materialize KEY`
for each output in flow order (one run and one child per output, everything loaded from disk).
"""

from __future__ import annotations

import yaml
import pytest
from dagster import AssetKey, DagsterInstance

from conftest import copy_project, python
from rl_assets.core.checkpoints import checkpoint_id
from rl_assets.core.paths import flow_order
from rl_assets.core.storage import content_hash

pytestmark = pytest.mark.e2e

ROUNDS = 2
ROUND_KEYS = [f"r{n:02d}/{name}" for n in range(1, ROUNDS + 1) for name in ("rollouts", "rewards", "checkpoint")]
OUTPUTS = ["raw_data", "prompts", "r00/checkpoint", *ROUND_KEYS]


def with_rounds(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rounds"] = ROUNDS
    params["train"]["beta"] = 0.04
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    return project


def fingerprints(project) -> dict[str, str]:
    return {key: checkpoint_id(project / "data" / key) if key.endswith("checkpoint") else content_hash(project / "data" / f"{key}.parquet")
            for key in OUTPUTS}


def materializations(project, keys):
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        return {key: instance.get_latest_materialization_event(AssetKey(key.split("/"))) for key in keys}


@pytest.fixture(scope="module")
def resident_and_one_at_a_time(micro_template, tmp_path_factory):
    resident = with_rounds(copy_project(micro_template, tmp_path_factory.mktemp("resident") / "project"))
    python(["-m", "pipelines", "run"], resident, timeout=1200)
    single = with_rounds(copy_project(micro_template, tmp_path_factory.mktemp("single") / "project"))
    for key in flow_order(ROUND_KEYS):
        if key == "r01/rollouts":
            python(["-m", "pipelines", "materialize", "raw_data", "prompts", "r00/checkpoint"], single, timeout=600)
        python(["-m", "pipelines", "materialize", key], single, timeout=600)
    return resident, single


def test_a_resident_run_and_one_output_at_a_time_give_bit_identical_outputs(resident_and_one_at_a_time):
    resident, single = resident_and_one_at_a_time
    assert fingerprints(resident) == fingerprints(single)


def test_the_resident_run_loads_the_policy_and_reference_once_and_reports_every_output_on_its_own(resident_and_one_at_a_time):
    resident, single = resident_and_one_at_a_time
    events = materializations(resident, ROUND_KEYS)
    assert len({event.run_id for event in events.values()}) == 1  # one run
    loads = {key: event.asset_materialization.metadata["models_loaded_from_disk"].value for key, event in events.items() if "rewards" not in key}
    # r00's held-out evaluation loads it (in the same child), so r01/rollouts samples with it as loaded; r01/checkpoint
    # loads the reference (beta > 0); every later step reuses both
    assert loads == {"r01/checkpoint": 1, **{f"r{n:02d}/{kind}": 0 for n in range(1, ROUNDS + 1) for kind in ("rollouts", "checkpoint") if (n, kind) != (1, "checkpoint")}}
    one_at_a_time = materializations(single, ROUND_KEYS)
    assert all(one_at_a_time[f"r{n:02d}/rollouts"].asset_materialization.metadata["models_loaded_from_disk"].value == 1 for n in range(1, ROUNDS + 1))
    for key, event in events.items():  # each output has its own data version: the content hash, a checkpoint's id
        path = resident / "data" / (key if key.endswith("checkpoint") else f"{key}.parquet")
        assert event.asset_materialization.tags["dagster/data_version"] == (checkpoint_id(path) if key.endswith("checkpoint") else content_hash(path))
        assert key.endswith("rewards") or "heldout_sampled_accuracy" in event.asset_materialization.metadata or key.endswith("rollouts")


def test_a_resident_run_keeps_every_guard_on_its_own_output(resident_and_one_at_a_time):
    resident, _ = resident_and_one_at_a_time
    with DagsterInstance.from_config(str(resident / ".dagster")) as instance:
        run_id = instance.get_latest_materialization_event(AssetKey(["r02", "checkpoint"])).run_id
        checks = [e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    evaluated = {(c.dagster_event.event_specific_data.asset_key.to_user_string(), c.dagster_event.event_specific_data.check_name):
                 c.dagster_event.event_specific_data for c in checks}
    assert ("r02/checkpoint", "kl_within_limit") in evaluated and ("r02/rewards", "reward_signal") in evaluated
    kl = evaluated[("r02/checkpoint", "kl_within_limit")]
    assert kl.passed and kl.description  # the child's verdict text reaches the UI


def test_a_blocking_guard_stops_the_resident_child_at_its_output_and_nothing_after_is_written(micro_template, tmp_path):
    project = copy_project(micro_template, tmp_path / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(rounds=2, guards={**params["guards"], "kl_max": 1e-12})  # any trained round is "too far" from r00
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    failed = python(["-m", "pipelines", "run"], project, timeout=900, check=False)
    assert failed.returncode != 0
    assert "blocking guard failed on r01/checkpoint: kl_within_limit" in failed.stdout + failed.stderr
    assert (project / "data/r01/checkpoint").is_dir()
    assert not (project / "data/r02/rollouts.parquet").exists() and not (project / "data/evaluation.parquet").exists()
    assert materializations(project, ["r02/rollouts"])["r02/rollouts"] is None

    # with the limit lifted, the next run starts again at the checkpoint whose guard failed, and finishes
    params["guards"]["kl_max"] = 100.0
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rerun = python(["-m", "pipelines", "run"], project, timeout=900)
    assert "from r01/checkpoint (its blocking check kl_within_limit did not pass" in rerun.stdout + rerun.stderr
    assert (project / "data/r02/checkpoint").is_dir() and (project / "data/evaluation.parquet").is_file()


# The micro dense reward, except that the first call scoring r02's rollouts kills its own process, as the kernel's OOM
# killer would: once (a marker file remembers), so the op's retry policy gets a crash that a retry survives.
CRASH_ONCE_REWARD = '''"""digit_share, with one SIGKILL of the compute child while it scores r02's rollouts."""

import os
import signal
from pathlib import Path


def digit_share(completions, **kwargs):
    scoring_r02 = Path("data/r02/rollouts.parquet").exists() and not Path("data/r02/rewards.parquet").exists()
    if scoring_r02 and not Path("crashed-once").exists():
        Path("crashed-once").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''


def test_a_retry_after_the_compute_child_dies_continues_after_what_it_wrote_and_ends_with_the_same_checkpoints(
        resident_and_one_at_a_time, micro_template, tmp_path):
    resident, _ = resident_and_one_at_a_time
    project = with_rounds(copy_project(micro_template, tmp_path / "project"))
    (project / "micro_rewards.py").write_text(CRASH_ONCE_REWARD)
    done = python(["-m", "pipelines", "run"], project, timeout=1200)
    assert (project / "crashed-once").is_file()  # the child did die once, mid-run
    said = done.stdout + done.stderr  # the crash is named when it happens, and the retry says where it continues
    assert "the r02/rewards step's process was killed by SIGKILL" in said and "a retry (the step's retry policy" in said
    assert "attempt 2: 5 outputs were written by an earlier attempt of this run (reported again); continuing from r02/rewards" in said

    events = materializations(project, OUTPUTS)
    run_id = events[f"r{ROUNDS:02d}/checkpoint"].run_id
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        logs = [e.dagster_event for e in instance.all_logs(run_id) if e.dagster_event]
        history = {key: [r.asset_materialization for r in instance.fetch_materializations(AssetKey(key.split("/")), limit=10).records]
                   for key in ROUND_KEYS}
        verdicts = [e.dagster_event.event_specific_data for e in instance.all_logs(run_id) if e.dagster_event
                    and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert [e.event_type_value for e in logs if e.step_key == "compute" and e.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_RESTARTED", "STEP_SUCCESS")] \
        == ["STEP_UP_FOR_RETRY", "STEP_RESTARTED", "STEP_SUCCESS"]
    assert {event.run_id for event in events.values()} == {run_id}  # one run, two attempts of its compute step
    # the retry wrote nothing twice: what the first attempt wrote (through r02/rollouts) it reports again, with the same data version
    first_attempt = ["r01/rollouts", "r01/rewards", "r01/checkpoint", "r02/rollouts"]
    for key in ROUND_KEYS:
        versions = [m.tags["dagster/data_version"] for m in history[key]]
        again = [bool(m.metadata.get("written_by_an_earlier_attempt") and m.metadata["written_by_an_earlier_attempt"].value) for m in history[key]]
        assert (len(versions), sorted(again)) == ((2, [False, True]) if key in first_attempt else (1, [False])), key
        assert len(set(versions)) == 1, key
    # and the guards of those outputs are reported again by the attempt that finished the step, as the first attempt judged them
    kl = [(v.passed, v.metadata["kl"].value) for v in verdicts if (v.asset_key.to_user_string(), v.check_name) == ("r01/checkpoint", "kl_within_limit")]
    assert len(kl) == 2 and kl[0] == kl[1]
    # and the checkpoints are the bits of the run that never crashed (same params, same rewards' values)
    assert {key: checkpoint_id(project / "data" / key) for key in OUTPUTS if key.endswith("checkpoint")} == \
        {key: checkpoint_id(resident / "data" / key) for key in OUTPUTS if key.endswith("checkpoint")}
    again = python(["-m", "pipelines", "run"], project, timeout=300)
    assert "nothing to do" in again.stdout + again.stderr
