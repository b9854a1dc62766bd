"""promoted_model: the best checkpoint that passed its guards, promoted only when it beats the current one.

    models/promoted/        the current promoted model: a checkpoint folder plus model_card.json and README.md
    models/versions/<id>/   every model ever promoted, so a rollback is a copy
    models/history.jsonl    one line per promotion or rollback; replaying it gives the stack of promoted ids

Candidates are ranked by sampled held-out accuracy from the evaluation table. The current promoted
model is compared on the same evaluation (same held-out prompts file, evaluation params and seed):
its card records that evaluation's key, and when the key differs the model is evaluated again.
Changes to models/ hold a file lock, so two runs promoting at once append history in turn.

Experiments are kept apart: each has its own directory by default (models/ for the default one,
models/experiments/<name>/ for the others, see `promotion.directory`), and every card and history
event names its experiment. A run never promotes over a model of another experiment, and a
rollback never restores one without `allow_other_experiment`: both say which experiment the model
came from and what to do instead.
A candidate saved as LoRA adapters is promoted as merged full weights, so the promoted model loads
with plain transformers from anywhere, without peft and without the r00 the adapters sat on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.config import Params
from rl_assets.core.run_params import PromotionParams
from rl_assets.eval.guards import checkpoint_guards
from rl_assets.core.paths import data_dir, output_path
from rl_assets.core.storage import atomic_path, file_hash

CARD, README, HISTORY = "model_card.json", "README.md", "history.jsonl"


def models_dir(params: PromotionParams, root: Path = Path(".")) -> Path:
    return root / params.directory


def promoted_path(params: PromotionParams, root: Path = Path(".")) -> Path:
    return models_dir(params, root) / "promoted"


def warm_start_path(params: PromotionParams, root: Path = Path(".")) -> Path | None:
    """The promoted model when r00 should start from it (promotion.warm_start: promoted and one exists)."""
    path = promoted_path(params, root)
    return path if params.warm_start == "promoted" and (path / CARD).is_file() else None


def read_card(path: Path) -> dict | None:
    return json.loads((path / CARD).read_text()) if (path / CARD).is_file() else None


def rank_candidates(evaluation_rows: list[dict], data: Path, params: Params) -> list[dict]:
    """Every evaluated checkpoint with its accuracies and failed guards, best sampled accuracy first."""
    by_checkpoint: dict[str, dict] = {}
    for row in evaluation_rows:
        entry = by_checkpoint.setdefault(row["checkpoint"], {"checkpoint": row["checkpoint"], "checkpoint_id": row["checkpoint_id"]})
        entry[row["mode"]] = row["accuracy"]
    for entry in by_checkpoint.values():
        path = output_path(entry["checkpoint"], data)
        try:
            card = read_lineage(path)
            stale = card["checkpoint_id"] != entry["checkpoint_id"]
            checks = checkpoint_guards(card, params.guards)
        except FileNotFoundError:
            stale, checks = True, {}
        entry["failed"] = sorted(name for name, (passed, _, _) in checks.items() if not passed) + (["evaluated another version"] if stale else [])
    return sorted(by_checkpoint.values(), key=lambda e: (-e.get("sampled", 0.0), -e.get("greedy", 0.0), e["checkpoint"]))


def decide(candidate: dict | None, current: dict | None, current_accuracy: float | None, min_improvement: float) -> tuple[bool, str]:
    """Whether `candidate` replaces the current promoted model, and why.

    >>> decide({"checkpoint": "r02/checkpoint", "checkpoint_id": "b", "sampled": 0.5}, {"checkpoint_id": "a"}, 0.5, 0.0)
    (False, 'r02/checkpoint (sampled 0.500) does not beat the promoted model (0.500 + 0)')
    """
    if candidate is None:
        return False, "no checkpoint passed its guards"
    if current is None:
        return True, f"first promotion: {candidate['checkpoint']} (sampled {candidate['sampled']:.3f})"
    if candidate["checkpoint_id"] in (current["checkpoint_id"], (current.get("merged_from_adapters") or {}).get("checkpoint_id")):
        return False, f"{candidate['checkpoint']} is already the promoted model"
    if candidate["sampled"] > current_accuracy + min_improvement:
        return True, f"{candidate['checkpoint']} (sampled {candidate['sampled']:.3f}) beats the promoted model ({current_accuracy:.3f})"
    return False, f"{candidate['checkpoint']} (sampled {candidate['sampled']:.3f}) does not beat the promoted model ({current_accuracy:.3f} + {min_improvement:g})"


@contextlib.contextmanager
def _locked(models: Path):
    models.mkdir(parents=True, exist_ok=True)
    with open(models / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _copy_folder(source: Path, destination: Path, extra: dict[str, str] | None = None) -> None:
    """Copy a model folder atomically, adding `extra` files (name -> text)."""
    with atomic_path(destination, is_dir=True) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)


def history(models: Path) -> list[dict]:
    path = models / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def promoted_stack(events: list[dict]) -> list[str]:
    """Ids of the promoted models, oldest first, current last: a promotion pushes, a rollback pops.

    >>> promoted_stack([{"event": "promote", "checkpoint_id": "a"}, {"event": "promote", "checkpoint_id": "b"}, {"event": "rollback"}])
    ['a']
    """
    stack: list[str] = []
    for event in events:
        if event["event"] == "promote":
            stack.append(event["checkpoint_id"])
        elif event["event"] == "rollback":
            stack.pop()
    return stack


def _append(models: Path, event: dict) -> None:
    with open(models / HISTORY, "a") as handle:
        handle.write(json.dumps({"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **event}, sort_keys=True) + "\n")


def _merge_adapters(source: Path, destination: Path) -> dict:
    """Base + the LoRA adapters at `source`, merged into full weights, saved as a checkpoint at `destination`.

    Returns what it was merged from: the adapters' checkpoint id and their base's path and id.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.core.policy import adapter_base

    base = adapter_base(source)  # raises when the base the adapters were trained on is gone or was replaced
    lineage = read_lineage(source)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), source).merge_and_unload()
    merged_from = {"checkpoint_id": lineage["checkpoint_id"],
                   "lora_base": {"path": base, "checkpoint_id": (lineage.get("lora_base") or {}).get("checkpoint_id")}}
    kept = {k: v for k, v in lineage.items() if k not in ("checkpoint_id", "lora_base")}
    save_checkpoint(model, AutoTokenizer.from_pretrained(source), destination, {**kept, "merged_from_adapters": merged_from})
    return merged_from


def promote(source: Path, card: dict, models: Path) -> None:
    """Make the checkpoint at `source` the promoted model, keep a version of it, and log the event.

    LoRA adapters are merged into their base first: the card's `checkpoint_id` (and versions/<id>,
    history) is then the merged weights' id, and `merged_from_adapters` names the adapters and base.
    """
    import tempfile

    with _locked(models), tempfile.TemporaryDirectory(prefix=".merge-", dir=models) as scratch:
        if (source / "adapter_config.json").is_file():
            merged_from = _merge_adapters(source, Path(scratch) / "merged")
            source = Path(scratch) / "merged"
            card = {**card, "checkpoint_id": read_lineage(source)["checkpoint_id"], "merged_from_adapters": merged_from}
        files = {CARD: json.dumps(card, indent=2, sort_keys=True, default=str) + "\n", README: card_markdown(card)}
        version = models / "versions" / card["checkpoint_id"]
        _copy_folder(source, version, files)
        _copy_folder(version, models / "promoted")
        _append(models, {"event": "promote", "checkpoint_id": card["checkpoint_id"], "source": card["source"],
                         "previous": card.get("previous"), "sampled_accuracy": card["evaluation"]["sampled"],
                         "experiment": experiment_of(card)})


def restore_promoted(models: Path) -> str | None:
    """Make promoted/ the version history.jsonl says is current, when it is not (a project pulled from a remote holds the
    versions and the history: pipelines/storage/remote.py); the id restored, else None."""
    if not (models / HISTORY).is_file():
        return None
    with _locked(models):
        stack = promoted_stack(history(models))
        if not stack or not (models / "versions" / stack[-1] / CARD).is_file():
            return None
        if (read_card(models / "promoted") or {}).get("checkpoint_id") == stack[-1]:
            return None
        _copy_folder(models / "versions" / stack[-1], models / "promoted")
    return stack[-1]


def experiment_of(card: dict | None) -> str:
    """The experiment a card or history event belongs to (cards written before experiments were recorded: the default one)."""
    return (card or {}).get("experiment") or "default"


def rollback(models: Path, experiment: str = "default", allow_other_experiment: bool = False) -> dict:
    """Restore the model promoted before the current one; returns the history event.

    Refuses when that model was promoted by another experiment (trained on other data, evaluated on
    other prompts), unless `allow_other_experiment`; the event then records that it crossed experiments.
    """
    with _locked(models):
        events = history(models)
        stack = promoted_stack(events)
        if len(stack) < 2:
            raise ValueError(f"{models}: nothing to roll back to ({len(stack)} promoted model(s) in {HISTORY})")
        target = read_card(models / "versions" / stack[-2])
        if experiment_of(target) != experiment and not allow_other_experiment:
            raise ValueError(f"{models}: the model before the current one ({stack[-2][:12]}, from {target and target.get('source')}) "
                             f"belongs to experiment {experiment_of(target)!r}, not {experiment!r}: it was trained on other data. "
                             "Pass --allow-other-experiment to restore it anyway.")
        _copy_folder(models / "versions" / stack[-2], models / "promoted")
        event = {"event": "rollback", "checkpoint_id": stack[-2], "replaced": stack[-1], "experiment": experiment}
        if experiment_of(target) != experiment:
            event["restored_experiment"] = experiment_of(target)
        _append(models, event)
    return event


def build_card(candidate: dict, params: Params, root: Path, previous: str | None, key: str) -> dict:
    """What the promoted model is: source checkpoint and parent, the data and rewards it saw, its metrics."""
    from rl_assets.eval.lineage import trace_checkpoint

    data = data_dir(params.experiment, root)
    source, prompts = output_path(candidate["checkpoint"], data), output_path("prompts", data)
    lineage = read_lineage(source)
    trace = trace_checkpoint(source, root, data)
    return {
        "checkpoint_id": candidate["checkpoint_id"], "source": candidate["checkpoint"], "round": lineage["round"], "experiment": params.experiment,
        "parent": lineage["parent"], "algorithm": lineage["algorithm"], "code_version": lineage["code_version"],
        "data": {"prompts": {"path": os.path.relpath(prompts, root), "md5": file_hash(prompts)},
                 "raw": [{"path": os.path.relpath(s["path"], root), "md5": s["hash"]} for s in trace if s["kind"] == "raw"],
                 "rounds": [{"round": s["round"], "checkpoint_id": s["checkpoint_id"], "rollouts_md5": s["rollouts"]["hash"],
                             "rewards_md5": s["rewards"]["hash"]} for s in trace if s["kind"] == "checkpoint" and "rollouts" in s]},
        "rewards": params.rewards.model_dump(mode="json"),
        "metrics": lineage.get("metrics", {}),
        "evaluation": {"key": key, "greedy": candidate.get("greedy"), "sampled": candidate["sampled"], **params.evaluation.model_dump(mode="json")},
        "previous": previous, "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def card_markdown(card: dict) -> str:
    evaluation, metrics = card["evaluation"], card["metrics"]
    lines = [f"# Promoted model {card['checkpoint_id'][:12]}", "",
             f"From `{card['source']}` (round {card['round']}, {card['algorithm']}), parent `{card['parent']}`, code {card['code_version']}.",
             f"Experiment `{experiment_of(card)}`.",
             *([f"Full weights merged from LoRA adapters {merged['checkpoint_id'][:12]} on base {merged['lora_base']['checkpoint_id']}."]
               if (merged := card.get("merged_from_adapters")) else []),
             f"Promoted {card['promoted_at']}; replaces `{card['previous'] or 'nothing'}`.", "",
             "## Evaluation (held out)", "",
             (f"greedy accuracy {evaluation['greedy']:.3f}, " if evaluation.get("greedy") is not None else "") + f"sampled accuracy {evaluation['sampled']:.3f} "
             f"(T={evaluation['temperature']}, {evaluation['samples_per_prompt']} samples/prompt, key {evaluation['key']})", "",
             "## Training metrics (last round)", ""]
    lines += [f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}" for k, v in sorted(metrics.items())]
    lines += ["", "## Data", ""] + [f"- `{r['path']}` md5 {r['md5']}" for r in card["data"]["raw"]]
    lines += ["", "## Rewards", ""] + [f"- {f['name']} × {f['weight']}" for f in card["rewards"]["functions"]]
    return "\n".join(lines) + "\n"


def run_promotion(params: Params, round_number: int | None, root: Path, device: str, loaded=None) -> tuple[dict, Path]:
    """The promoted_model step: rank, compare with the current promoted model, promote or keep it."""
    from rl_assets.eval.evaluation import evaluation_key
    from rl_assets.core.schemas import read_table

    data = data_dir(params.experiment, root)
    models, key = models_dir(params.promotion, root), evaluation_key(params, data)
    ranked = rank_candidates(read_table(output_path("evaluation", data), "evaluation").to_pylist(), data, params)
    candidate = next((c for c in ranked if not c["failed"]), None)
    current = read_card(models / "promoted")
    current_accuracy = None
    if current is not None and experiment_of(current) != params.experiment:
        promoted = False
        reason = (f"{models}/promoted holds a model of experiment {experiment_of(current)!r} ({current.get('source')}), and this run is "
                  f"experiment {params.experiment!r}: a model trained on other data is not replaced. Give this experiment its own "
                  f"promotion.directory (e.g. models/experiments/{params.experiment}) to promote its models there.")
    else:
        if current is not None:
            current_accuracy = current["evaluation"]["sampled"] if current["evaluation"]["key"] == key else _evaluate(models / "promoted", params, data, device)
        promoted, reason = decide(candidate, current, current_accuracy, params.promotion.min_improvement)
    if promoted:
        promote(output_path(candidate["checkpoint"], data), build_card(candidate, params, root, current and current["checkpoint_id"], key), models)
    elif current is None:
        raise ValueError(f"nothing to promote: {reason}; failed guards: { {c['checkpoint']: c['failed'] for c in ranked} }")
    table = "\n".join(["| checkpoint | sampled | greedy | failed guards |", "|---|---|---|---|"] +
                      [f"| {c['checkpoint']} | {c.get('sampled', 0):.3f} | {c['greedy']:.3f} | {', '.join(c['failed']) or '-'} |"
                       if "greedy" in c else f"| {c['checkpoint']} | {c.get('sampled', 0):.3f} | - | {', '.join(c['failed']) or '-'} |" for c in ranked])
    card = read_card(models / "promoted")
    metadata = {"promoted": promoted, "reason": reason, "checkpoint_id": card["checkpoint_id"], "source": card["source"],
                "sampled_accuracy": card["evaluation"]["sampled"], "candidates": {"type": "md", "raw_value": table},
                "rounds": {"type": "md", "raw_value": _rounds_plot(data)}}
    if current_accuracy is not None:
        metadata["previous_sampled_accuracy"] = current_accuracy
    return metadata, models / "promoted"


def _rounds_plot(data: Path) -> str:
    """Reward, accuracy, KL, loss and entropy by round, as an inline image for the UI."""
    import base64
    import tempfile

    from rl_assets.eval.curves import round_rows, rounds_figure

    with tempfile.TemporaryDirectory() as tmp:
        png = rounds_figure(round_rows(data), Path(tmp) / "rounds.png").read_bytes()
    return f"![metrics by round](data:image/png;base64,{base64.b64encode(png).decode()})"


def _evaluate(path: Path, params: Params, data: Path, device: str) -> float:
    """Sampled accuracy of the model at `path` on this run's held-out prompts (kept by checkpoint id, like every evaluation)."""
    from rl_assets.eval.evaluation import evaluated

    rows, _ = evaluated(path, params, data, device)
    return next(r["accuracy"] for r in rows if r["mode"] == "sampled")
