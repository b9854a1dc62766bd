"""Experiment trackers: each pipeline run's per-round metrics, params and lineage ids, in the tracker a team uses.

    rl-assets track [--run-id ID]     log the project's rounds to the backends of `tracking.backends`

`tracking.backends` picks any of tensorboard (the default: data/tensorboard, see curves.py), mlflow
and wandb (optional extras `[mlflow]`, `[wandb]`). One tracker run per pipeline run, named by the
Dagster run id; the round is the step. Logging the same pipeline run again updates its tracker run
(MLflow: found by its tag; W&B: the same run id, resumed) instead of making a second one.
Everything comes from what the pipeline recorded: the checkpoint cards and the evaluation table
(`curves.round_rows`), and the promoted model's card.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rl_assets.core.config import Params
from rl_assets.core.paths import data_dir
from rl_assets.eval.curves import round_rows

RUN_TAG = "rl_assets.run_id"


class TrackerMissing(ImportError):
    """A backend whose package is not installed: the message names the extra to install."""


def flat(tree: dict, prefix: str = "") -> dict[str, str]:
    """Nested params as `section.key` -> value text (what trackers show as params).

    >>> flat({"train": {"lr": 0.1, "lora": {"r": 8}}, "seed": 0})
    {'train.lr': '0.1', 'train.lora.r': '8', 'seed': '0'}
    """
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out


def lineage_ids(root: Path, params: Params) -> dict[str, str]:
    """Checkpoint id, parent and params hash of every round, the promoted model's id, the code version."""
    from rl_assets.core.checkpoints import read_lineage
    from rl_assets.eval.promotion import promoted_path, read_card

    ids = {}
    for card in sorted(data_dir(params.experiment, root).glob("r*/checkpoint/lineage.json")):
        lineage, name = read_lineage(card.parent), card.parent.parent.name
        ids.update({f"lineage.{name}.checkpoint_id": lineage["checkpoint_id"], f"lineage.{name}.parent": str(lineage.get("parent")),
                    f"lineage.{name}.params_hash": str(lineage.get("params_hash"))})
        ids["lineage.code_version"] = str(lineage.get("code_version"))
    promoted = read_card(promoted_path(params.promotion, root))
    if promoted:
        ids["lineage.promoted.checkpoint_id"] = promoted["checkpoint_id"]
    return ids


def _metrics(rows: list[dict]):
    for row in rows:
        for name, value in row.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield name, float(value), int(row["step"])


def log_mlflow(root: Path, params: Params, run_id: str, rows: list[dict], ids: dict[str, str]) -> str:
    """The MLflow run of pipeline run `run_id` (made, or found by its tag); returns the MLflow run id."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as error:
        raise TrackerMissing("tracking.backends has mlflow: pip install 'rl-assets[mlflow]' (mlflow-skinny)") from error
    uri = params.tracking.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=uri)
    name = params.tracking.mlflow_experiment or f"rl-assets/{params.experiment}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=1)
    run = found[0] if found else client.create_run(experiment_id, run_name=run_id, tags={RUN_TAG: run_id})
    from mlflow.entities import Metric, Param, RunTag

    logged = {key for key in run.data.params} if found else set()
    new_params = [Param(k[:250], v[:6000]) for k, v in {**flat(params.model_dump(mode="json")), **ids}.items() if k[:250] not in logged]
    metrics = [Metric(name, value, 0, step) for name, value, step in _metrics(rows)]
    for start in range(0, max(len(new_params), len(metrics), 1), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run.info.run_id, metrics=metrics[start:start + 100], params=new_params[start:start + 100],
                         tags=[RunTag(k, v) for k, v in ids.items()] if start == 0 else [])
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def log_wandb(root: Path, params: Params, run_id: str, rows: list[dict], ids: dict[str, str]) -> str:
    """The W&B run of pipeline run `run_id` (offline runs sit under ROOT/wandb/ for `wandb sync`); returns its id."""
    try:
        import wandb
    except ImportError as error:
        raise TrackerMissing("tracking.backends has wandb: pip install 'rl-assets[wandb]'") from error
    mode = params.tracking.wandb_mode or os.environ.get("WANDB_MODE") or "online"
    wandb_id = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[:64]
    run = wandb.init(project=params.tracking.wandb_project, id=wandb_id, name=run_id, resume="allow", mode=mode, dir=str(root),
                     config={**params.model_dump(mode="json"), **ids}, group=params.experiment, reinit="finish_previous")
    by_step: dict[int, dict] = {}
    for name, value, step in _metrics(rows):
        by_step.setdefault(step, {})[name] = value
    for step in sorted(by_step):
        run.log(by_step[step], step=step)
    run.summary.update(ids)
    run.finish()
    wandb.teardown()  # stops W&B's service process, which writes out the rest of the run file first
    return wandb_id


def log_run(root: Path, params: Params, run_id: str) -> dict[str, str]:
    """Log the project's rounds to every backend of `params.tracking`; returns backend -> where it went."""
    rows, ids, done = round_rows(data_dir(params.experiment, root)), lineage_ids(root, params), {}
    for backend in params.tracking.backends:
        if backend == "tensorboard":
            from rl_assets.eval.curves import export_tensorboard

            done[backend] = str(export_tensorboard(data_dir(params.experiment, root)))
        elif backend == "mlflow":
            done[backend] = log_mlflow(root, params, run_id, rows, ids)
        elif backend == "wandb":
            done[backend] = log_wandb(root, params, run_id, rows, ids)
    return done
