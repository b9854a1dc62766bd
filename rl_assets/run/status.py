"""What the project's files say about its state, as plain JSON: for `rl-assets status`, scripts and probes.

The Dagster half (the latest run and its failed checks) is added by `python -m pipelines status`,
since this library never imports Dagster.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.config import Params
from rl_assets.run.heartbeat import running_steps
from rl_assets.core.paths import data_dir, output_path
from rl_assets.eval.promotion import history, models_dir, read_card


def checkpoint_rounds(data: Path) -> list[int]:
    """Rounds with a finished checkpoint folder (one with a lineage card) in the data folder `data`, ascending."""
    found = (re.fullmatch(r"r(\d\d)", p.parent.parent.name) for p in data.glob("r*/checkpoint/lineage.json"))
    return sorted(int(m.group(1)) for m in found if m)


def _evaluation(data: Path, root: Path) -> dict | None:
    from rl_assets.core.schemas import read_table

    path = output_path("evaluation", data)
    if not path.is_file():
        return None
    accuracy: dict[str, dict] = {}
    for row in read_table(path, "evaluation").to_pylist():
        accuracy.setdefault(row["checkpoint"], {})[row["mode"]] = round(row["accuracy"], 4)
    return {"path": str(path.relative_to(root)), "accuracy": accuracy}


def data_experiments(data: Path) -> dict[str, str]:
    """{output: the experiment that made it} for the checkpoints and the evaluation table in the data folder `data` (outputs
    of earlier versions, which did not record it, are left out). Before each experiment had its own data folder, all of
    them wrote data/: what another experiment left there is not this one's."""
    from rl_assets.core.schemas import table_lineage

    made = {f"r{n:02d}/checkpoint": read_lineage(output_path(f"r{n:02d}/checkpoint", data)).get("experiment") for n in checkpoint_rounds(data)}
    evaluation = output_path("evaluation", data)
    if evaluation.is_file():
        try:
            made["evaluation"] = table_lineage(evaluation).get("experiment")
        except Exception:  # noqa: BLE001 - an unreadable table is reported by changed_outputs, not here
            pass
    return {key: experiment for key, experiment in made.items() if experiment is not None}


def project_status(root: Path, params: Params) -> dict:
    """Current round, last checkpoint and its metrics, the evaluation, the promoted model, the heartbeats of running steps
    (of the project: they share its devices), and the outputs in the experiment's data folder that another experiment made
    (`other_experiment_outputs`: left in data/ by versions before data folders were kept apart)."""
    data = data_dir(params.experiment, root)
    rounds = checkpoint_rounds(data)
    latest = None
    if rounds:
        card = read_lineage(output_path(f"r{rounds[-1]:02d}/checkpoint", data))
        latest = {"checkpoint": f"r{rounds[-1]:02d}/checkpoint", "checkpoint_id": card["checkpoint_id"], "algorithm": card.get("algorithm"),
                  "metrics": card.get("metrics", {})}
    models = models_dir(params.promotion, root)
    card = read_card(models / "promoted")
    promoted = None
    if card:
        promoted = {key: card.get(key) for key in ("checkpoint_id", "source", "promoted_at", "previous")}
        promoted.update(sampled_accuracy=card["evaluation"]["sampled"], history_events=len(history(models)))
    other = {key: experiment for key, experiment in data_experiments(data).items() if experiment != params.experiment}
    return {"rounds_configured": params.rounds, "current_round": rounds[-1] if rounds else None, "latest_checkpoint": latest,
            "data": str(data.relative_to(root)), "evaluation": _evaluation(data, root), "promoted_model": promoted, "running_steps": running_steps(root),
            "other_experiment_outputs": other}


def format_status(status: dict) -> str:
    return json.dumps(status, indent=2, sort_keys=True, default=str)
