"""Experiment trackers over a fake two-round project: MLflow read back through MlflowClient from a real local store,
W&B in offline mode read back from its run files."""

from __future__ import annotations

import json

import pytest

from ops_support import make_fake_project
from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.config import ParamsError
from rl_assets.core.params_file import load_params
from rl_assets.eval.trackers import log_run


@pytest.fixture()
def project(tmp_path):
    return make_fake_project(tmp_path / "project", sampled={0: 0.3, 1: 0.5, 2: 0.4})


def params_with(project, **tracking):
    return load_params(project / "params.yaml", [f"tracking.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in tracking.items()])


def test_the_default_is_tensorboard_only(project):
    params = load_params(project / "params.yaml")
    assert params.tracking.backends == ["tensorboard"]
    assert log_run(project, params, "run-1") == {"tensorboard": str(project / "data/tensorboard")}
    assert (project / "data/tensorboard/rounds").is_dir()
    with pytest.raises(ParamsError, match="tracking.backends"):
        params_with(project, backends=["neptune"])


def test_mlflow_gets_one_run_per_pipeline_run_with_rounds_as_steps(project, tmp_path):
    import mlflow  # the [mlflow] extra, part of dev
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # a real local store (MLflow 3 retired the ./mlruns file store)
    params = params_with(project, backends=["mlflow"], mlflow_tracking_uri=store)
    first = log_run(project, params, "dagster-run-1")["mlflow"]
    assert log_run(project, params, "dagster-run-1")["mlflow"] == first  # the same pipeline run: the same tracker run
    assert log_run(project, params, "dagster-run-2")["mlflow"] != first
    client = MlflowClient(tracking_uri=store)
    run = client.get_run(first)
    assert run.data.tags["rl_assets.run_id"] == "dagster-run-1" and run.info.status == "FINISHED"
    history = client.get_metric_history(first, "train/reward_mean")
    assert sorted({(m.step, m.value) for m in history}) == [(1, 0.5), (2, 0.5)]
    assert {(m.step, m.value) for m in client.get_metric_history(first, "eval/sampled_accuracy")} == {(0, 0.3), (1, 0.5), (2, 0.4)}
    assert run.data.params["train.learning_rate"] == json.dumps(params.train.learning_rate) and run.data.params["rounds"] == "2"
    assert run.data.params["lineage.r02.checkpoint_id"] == read_lineage(project / "data/r02/checkpoint")["checkpoint_id"]
    [experiment] = [e for e in client.search_experiments() if e.name == "rl-assets/default"]
    assert len(client.search_runs([experiment.experiment_id])) == 2
    assert mlflow.__version__


def wandb_records(path):
    """The protobuf records of an offline run's .wandb file (LevelDB log blocks of 32 KiB after a 7-byte W&B header)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, position, chunk, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        chunk += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def test_wandb_offline_run_files_hold_config_metrics_and_lineage(project, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    params = params_with(project, backends=["wandb"], wandb_mode="offline")
    assert log_run(project, params, "dagster-run-7") == {"wandb": "dagster-run-7"}
    [run_file] = (project / "wandb").glob("offline-run-*-dagster-run-7/run-dagster-run-7.wandb")
    records = wandb_records(run_file)
    key = lambda item: item.key or "/".join(item.nested_key)  # noqa: E731
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {key(item): json.loads(item.value_json) for item in run.config.update}
    assert run.run_id == "dagster-run-7" and run.project == "rl-assets" and config["rounds"] == 2
    assert config["lineage.r01.checkpoint_id"] == read_lineage(project / "data/r01/checkpoint")["checkpoint_id"]
    history = [{key(item): json.loads(item.value_json) for item in r.history.item} for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["eval/sampled_accuracy"]) for h in history] == [(0, 0.3), (1, 0.5), (2, 0.4)]
    assert [h.get("train/reward_mean") for h in history] == [None, 0.5, 0.5]
    summary = {key(item): item.value_json for r in records if r.WhichOneof("record_type") == "summary" for item in r.summary.update}
    assert json.loads(summary["lineage.r02.checkpoint_id"]) == read_lineage(project / "data/r02/checkpoint")["checkpoint_id"]


def test_rl_assets_track_logs_a_named_run_and_says_what_is_missing(project, monkeypatch, capsys):
    from pipelines import cli

    monkeypatch.chdir(project)
    monkeypatch.delenv("RL_ASSETS_PARAMS", raising=False)
    assert cli.main(["track", "--run-id", "r-1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"tensorboard": "data/tensorboard"}
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)  # as if the [mlflow] extra were not installed
    monkeypatch.setitem(__import__("sys").modules, "mlflow.tracking", None)
    (project / "params.yaml").write_text((project / "params.yaml").read_text() + "tracking: {backends: [mlflow]}\n")
    assert cli.main(["track", "--run-id", "r-1"]) == 2
    assert "pip install 'rl-assets[mlflow]'" in capsys.readouterr().err
