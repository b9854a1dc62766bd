"""The round-1 training step with one process and with two (torchrun, gloo on CPU) gives the same model."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
from safetensors.torch import load_file

from dagster import AssetKey, DagsterInstance

from conftest import PYTHON, copy_project, project_env, python
from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.storage import file_hash

pytestmark = pytest.mark.e2e

ATOL = 1e-5
TRAIN = ["-m", "rl_assets.run.step", "train", "--round", "1"]
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def trained(pipeline_outputs, tmp_path_factory):
    """r01/checkpoint retrained from the pipeline's r01 rollouts and rewards, by 1 and by 2 processes."""
    root = tmp_path_factory.mktemp("distributed")
    one = copy_project(pipeline_outputs, root / "one")
    two = copy_project(pipeline_outputs, root / "two")
    single = python(TRAIN, one, timeout=600, **ENV)
    double = python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *TRAIN], two, timeout=600, **ENV)
    return {"pipeline": pipeline_outputs, "one": one, "two": two, "single": single, "double": double}


def weights(project):
    return load_file(project / "data/r01/checkpoint/model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_both_runs_succeed_and_record_their_world_size(trained):
    for name, world_size in (("one", 1), ("two", 2)):
        card = read_lineage(trained[name] / "data/r01/checkpoint")
        assert card["world_size"] == world_size, name
        assert card["trained_on"]["rewards"] == file_hash(trained["pipeline"] / "data/r01/rewards.parquet")
        assert card["parent"] == read_lineage(trained["pipeline"] / "data/r00/checkpoint")["checkpoint_id"]
    # rank 0 alone prints the step's summary
    summary = json.loads(trained["double"].stdout[trained["double"].stdout.index("{"):])
    assert summary["output"] == "data/r01/checkpoint"
    assert trained["double"].stdout.count('"output"') == 1


def test_training_moved_the_weights(trained):
    parent = load_file(trained["pipeline"] / "data/r00/checkpoint/model.safetensors")
    assert max_difference(parent, weights(trained["one"])) > 100 * ATOL, "no update: the comparison below would be vacuous"


def metrics(project) -> dict:
    return read_lineage(project / "data/r01/checkpoint")["metrics"]


def test_two_processes_compute_the_same_gradient(trained):
    """grad_norm is taken after DDP has averaged the ranks' gradients: it is the global minibatch's norm."""
    one, two = metrics(trained["one"]), metrics(trained["two"])
    assert one["steps"] == two["steps"] > 0
    assert one["grad_norm"] > 0
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert (two["reward_mean"], two["reward_std"]) == (one["reward_mean"], one["reward_std"])


def test_two_process_metrics_describe_the_whole_minibatch(trained):
    one, two = metrics(trained["one"]), metrics(trained["two"])
    for name in ("loss", "clip_fraction", "kl_old"):
        assert two[name] == pytest.approx(one[name], rel=1e-3, abs=1e-6), name


def test_two_processes_match_one_process(trained):
    """Same global minibatches, gradients averaged by DDP: the same update up to float summation order.

    Adam divides each update by sqrt(v) + eps, so for weights whose gradient is ~eps (1e-8) the
    summation-order noise (~1e-8) becomes a visible share of one step. The bound is therefore
    relative to the size of the update: a real divergence (other data, wrong averaging, a rank
    training alone) moves weights by a large share of it.
    """
    parent = load_file(trained["pipeline"] / "data/r00/checkpoint/model.safetensors")
    one, two = weights(trained["one"]), weights(trained["two"])
    update = max_difference(parent, one)
    difference = max_difference(one, two)
    assert difference <= 0.05 * update, f"max |w1 - w2| = {difference:.3g} vs update {update:.3g}"


def test_one_process_retraining_reproduces_the_pipeline_checkpoint(trained):
    difference = max_difference(weights(trained["pipeline"]), weights(trained["one"]))
    assert difference <= ATOL, f"max |w_pipeline - w_retrained| = {difference:.3g}"


def test_dagster_step_under_torchrun_reports_once_from_rank_0(trained, tmp_path):
    """compute.nproc=2 makes the asset launch torchrun through Pipes; rank 0 alone reports the materialization."""
    project = copy_project(trained["pipeline"], tmp_path / "project")
    python(["-m", "pipelines", "materialize", "r01/checkpoint"], project, timeout=600, RL_ASSETS_SET="compute.nproc=2", **ENV)
    checkpoint = project / "data/r01/checkpoint"
    assert read_lineage(checkpoint)["world_size"] == 2
    difference = max_difference(weights(trained["two"]), weights(project))
    assert difference <= ATOL, f"max |w_torchrun - w_dagster_torchrun| = {difference:.3g}"
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        latest = instance.get_latest_materialization_event(AssetKey(["r01", "checkpoint"]))
        assert latest.asset_materialization.tags["dagster/data_version"] == read_lineage(checkpoint)["checkpoint_id"]
        logs = instance.all_logs(latest.run_id)
        reported = [e for e in logs if e.dagster_event is not None and e.dagster_event.is_step_materialization]
        assert len(reported) == 1
        assert any("--nproc_per_node=2" in (e.user_message or "") for e in logs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher(project, port: int, command: list[str], *options: str) -> subprocess.Popen:
    """One machine of a two-machine job: torchrun with one process, meeting the other at 127.0.0.1:`port` (c10d)."""
    rendezvous = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                  "--rdzv_id", "rl-assets-r01-checkpoint", *options]
    return subprocess.Popen([PYTHON, "-m", "torch.distributed.run", *rendezvous, *command], cwd=project, env=project_env(project, **ENV),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_machines_joined_by_c10d_train_as_two_processes_of_one_machine(trained, tmp_path):
    """Two torchrun launchers (--nnodes 2, one process each) on one project folder, as two machines on a shared filesystem."""
    project = copy_project(trained["pipeline"], tmp_path / "project")
    port = free_port()
    machines = [launcher(project, port, TRAIN) for _ in range(2)]
    ended = [machine.communicate(timeout=600) for machine in machines]
    assert [machine.returncode for machine in machines] == [0, 0], [err[-2000:] for _, err in ended]
    assert read_lineage(project / "data/r01/checkpoint")["world_size"] == 2
    difference = max_difference(weights(trained["two"]), weights(project))
    assert difference <= ATOL, f"max |w_one_machine - w_two_machines| = {difference:.3g}"
    assert sum(out.count('"output"') for out, _ in ended) == 1  # one summary, from the rank that reports


def test_a_dagster_step_on_two_machines_reports_once_when_the_other_machine_is_rank_0(trained, tmp_path):
    """compute.nnodes 2: Dagster's step launches one machine's torchrun; the other machine joins with `rl_assets.run.step`.
    Its launcher's address sorts first, so the rendezvous gives it rank 0: Dagster's process, rank 1, reports what rank 0 wrote."""
    project = copy_project(trained["pipeline"], tmp_path / "project")
    port = free_port()
    sets = ["compute.nnodes=2", f"compute.rdzv_endpoint=127.0.0.1:{port}"]
    other = launcher(project, port, [*TRAIN, *(arg for value in sets for arg in ("--set", value))], "--local_addr", "127.0.0.1")
    try:
        done = python(["-m", "pipelines", "materialize", "r01/checkpoint"], project, timeout=600, RL_ASSETS_SET=";".join(sets), **ENV)
        out, err = other.communicate(timeout=120)
    finally:
        other.kill()
    assert other.returncode == 0, err[-2000:]
    assert '"output"' not in out  # Dagster's process reported; the other machine's rank 0 only wrote
    assert "[rank 1] " in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]  # Dagster's machine held rank 1
    card = read_lineage(project / "data/r01/checkpoint")
    assert card["world_size"] == 2
    assert max_difference(weights(trained["two"]), weights(project)) <= ATOL
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        latest = instance.get_latest_materialization_event(AssetKey(["r01", "checkpoint"]))
        assert latest.asset_materialization.tags["dagster/data_version"] == card["checkpoint_id"]
        reported = [e for e in instance.all_logs(latest.run_id) if e.dagster_event is not None and e.dagster_event.is_step_materialization]
        assert len(reported) == 1
