"""What the project's files say about its state, as plain JSON: for `rl-assets status`, scripts and probes.

The Dagster half (the latest run and its failed checks) is added by `python -m pipelines status`,
since this library never imports Dagster.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rl_assets.checkpoints import read_lineage
from rl_assets.config import Params
from rl_assets.heartbeat import running_steps
from rl_assets.paths import DATA, output_path
from rl_assets.promotion import history, models_dir, read_card


def checkpoint_rounds(root: Path) -> list[int]:
    """Rounds with a finished checkpoint folder (one with a lineage card), ascending."""
    found = (re.fullmatch(r"r(\d\d)", p.parent.parent.name) for p in (root / DATA).glob("r*/checkpoint/lineage.json"))
    return sorted(int(m.group(1)) for m in found if m)


def _evaluation(root: Path) -> dict | None:
    from rl_assets.schemas import read_table

    path = output_path("evaluation", root)
    if not path.is_file():
        return None
    accuracy: dict[str, dict] = {}
    for row in read_table(path, "evaluation").to_pylist():
        accuracy.setdefault(row["checkpoint"], {})[row["mode"]] = round(row["accuracy"], 4)
    return {"path": str(path.relative_to(root)), "accuracy": accuracy}


def data_experiments(root: Path) -> dict[str, str]:
    """{output: the experiment that made it} for the checkpoints and the evaluation table in data/ (outputs of earlier
    versions, which did not record it, are left out). All experiments write data/ (see the README): after another
    experiment's run, what is there is that experiment's."""
    from rl_assets.schemas import table_lineage

    made = {f"r{n:02d}/checkpoint": read_lineage(output_path(f"r{n:02d}/checkpoint", root)).get("experiment") for n in checkpoint_rounds(root)}
    evaluation = output_path("evaluation", root)
    if evaluation.is_file():
        try:
            made["evaluation"] = table_lineage(evaluation).get("experiment")
        except Exception:  # noqa: BLE001 - an unreadable table is reported by changed_outputs, not here
            pass
    return {key: experiment for key, experiment in made.items() if experiment is not None}


def project_status(root: Path, params: Params) -> dict:
    """Current round, last checkpoint and its metrics, the evaluation, the promoted model, the heartbeats of running steps,
    and the outputs in data/ that another experiment made and this one does not (`other_experiment_outputs`: rounds past its
    own, or an evaluation of that experiment's checkpoints)."""
    rounds = checkpoint_rounds(root)
    latest = None
    if rounds:
        card = read_lineage(output_path(f"r{rounds[-1]:02d}/checkpoint", root))
        latest = {"checkpoint": f"r{rounds[-1]:02d}/checkpoint", "checkpoint_id": card["checkpoint_id"], "algorithm": card.get("algorithm"),
                  "metrics": card.get("metrics", {})}
    models = models_dir(params.promotion, root)
    card = read_card(models / "promoted")
    promoted = None
    if card:
        promoted = {key: card.get(key) for key in ("checkpoint_id", "source", "promoted_at", "previous")}
        promoted.update(sampled_accuracy=card["evaluation"]["sampled"], history_events=len(history(models)))
    # Outputs this experiment shares with another (an r00 of the same params) are its own too; those beyond its rounds are not.
    other = {key: experiment for key, experiment in data_experiments(root).items()
             if experiment != params.experiment and (key == "evaluation" or int(key[1:3]) > params.rounds)}
    return {"rounds_configured": params.rounds, "current_round": rounds[-1] if rounds else None, "latest_checkpoint": latest,
            "evaluation": _evaluation(root), "promoted_model": promoted, "running_steps": running_steps(root),
            "other_experiment_outputs": other}


def format_status(status: dict) -> str:
    return json.dumps(status, indent=2, sort_keys=True, default=str)
