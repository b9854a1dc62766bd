"""Counterfactual rescoring: what every round and checkpoint would have scored under another reward, without sampling.

The rollouts of every round and the held-out completions of every checkpoint are stored, so another reward is a
reward pass over them, not a run. `rescore` scores them with `rewards` and writes the results beside the originals,
never over them:

    <data>/rescored/<key>/rNN/rewards.parquet        each round's rollouts under the new reward (the rewards table)
    <data>/rescored/<key>/evaluations/<id>.parquet   each checkpoint's held-out completions under it, as evaluated stores them
    <data>/rescored/<key>/rescore.json               the rewards, the correctness function and the report below

`<key>` names the new rewards and their code (the functions, options and weights, and the content of the modules
that define them), so a rescoring is redone only when one of those changed. The report says, per round, the mean
reward before and after and how often the two correctness checks agree on a rollout; per checkpoint, the held-out
accuracy before and after and the prompts whose correct count changed; and whether the best checkpoint (ranked as
promotion ranks) or the promoted model would change.

A checkpoint whose held-out completions are not stored here (evaluated on another machine and pulled: only the
evaluation table travels, its completions stay in the machine's <data>/evaluations) is listed as not rescored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_assets.core.config import RewardsParams
from rl_assets.core.paths import output_path, round_prefix
from rl_assets.core.schemas import read_table, rewards_schema, write_table
from rl_assets.core.stage_table import code_hashes, stage_code
from rl_assets.core.storage import atomic_path, file_hash
from rl_assets.eval.evaluation import EVALUATIONS, completions_table, correctness_function, evaluation_rows, stored_completions, with_scores
from rl_assets.rewards import score_rollouts

RESCORED = "rescored"  # inside the data folder


def rescoring_key(params, rewards: RewardsParams, correctness: str) -> str:
    """Names a rescoring: the reward functions with their options and weights, the correctness function, and the code
    of the project's rewards and of the user's modules they name."""
    code = sorted(code_hashes(stage_code("rewards", params.model_copy(update={"rewards": rewards}))).items())
    blob = json.dumps([rewards.model_dump(mode="json"), correctness, code], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def agreement(before: list[float | None], after: list[float | None]) -> float | None:
    """Share of rows that two correctness columns both call correct (score 1) or both call not correct.

    >>> agreement([1.0, 0.0, 1.0, None], [1.0, 1.0, 0.0, 0.0])
    0.5
    """
    if not before:
        return None
    return sum((a == 1.0) == (b == 1.0) for a, b in zip(before, after)) / len(before)


def flipped_prompts(before: pa.Table, after: pa.Table, samples: int, correctness_before: str, correctness_after: str) -> list[dict]:
    """The prompts whose correct completions (out of `samples`) differ between two scorings of the same completions.

    `before` and `after` hold the same rows in the same order (the stored completions and their rescoring), grouped by
    prompt in runs of `samples`.
    """
    old = [s == 1.0 for s in before[f"score_{correctness_before}"].to_pylist()]
    new = [s == 1.0 for s in after[f"score_{correctness_after}"].to_pylist()]
    prompts, answers, texts, ids = (before[c].to_pylist() for c in ("prompt", "answer", "completion", "prompt_id"))
    flips = []
    for start in range(0, len(old), samples):
        a, b = sum(old[start : start + samples]), sum(new[start : start + samples])
        if a != b:
            changed = next(i for i in range(start, start + samples) if old[i] != new[i])
            flips.append({"prompt_id": ids[start], "prompt": prompts[start], "answer": answers[start], "correct_before": a,
                          "correct_after": b, "completion": texts[changed]})
    return flips


def rescore(params, data: Path, rewards: RewardsParams, correctness: str | None = None, promoted_id: str | None = None) -> dict:
    """Score the stored rollouts of rounds 1..params.rounds and the stored held-out completions of every checkpoint in
    <data>'s evaluation table with `rewards`; write them under <data>/rescored/<key>/ and return the report.

    `correctness` is the new rewards' score column that counts as correct (default: the first function's);
    `promoted_id` the promoted model's checkpoint id, to say whether its choice would change.
    """
    from rl_assets.eval.promotion import rank_candidates

    correctness = correctness or rewards.functions[0].score_name
    if (names := [f.score_name for f in rewards.functions]) and correctness not in names:
        raise ValueError(f"--correctness {correctness!r} is not one of the new reward functions {names}")
    key = rescoring_key(params, rewards, correctness)
    folder = data / RESCORED / key
    rounds = []
    for n in range(1, params.rounds + 1):
        rollouts_path = output_path(f"{round_prefix(n)}/rollouts", data)
        if not rollouts_path.is_file():
            continue
        rollouts = read_table(rollouts_path, "rollouts")
        after = score_rollouts(rollouts, rewards, rollouts_hash=file_hash(rollouts_path))
        write_table(after, folder / round_prefix(n) / "rewards.parquet", rewards_schema(names), "rewards",
                    lineage={"rescored_from": rollouts_path.as_posix(), "rewards": rewards.model_dump(mode="json"), "key": key})
        entry = {"round": n, "rollouts": rollouts.num_rows, "reward_mean_after": pc.mean(after["reward"]).as_py()}
        original = output_path(f"{round_prefix(n)}/rewards", data)
        if original.is_file():
            before = read_table(original, "rewards")
            entry["reward_mean_before"] = pc.mean(before["reward"]).as_py()
            old_correctness = correctness_function(params.evaluation, params.rewards)
            if f"score_{old_correctness}" in before.column_names and before.num_rows == after.num_rows:
                entry["correct_agreement"] = agreement(before[f"score_{old_correctness}"].to_pylist(), after[f"score_{correctness}"].to_pylist())
        rounds.append(entry)

    evaluation = read_table(output_path("evaluation", data), "evaluation").to_pylist()
    checkpoints, missing, rescored_rows = [], [], []
    by_checkpoint: dict[str, list[dict]] = {}
    for row in evaluation:
        by_checkpoint.setdefault(row["checkpoint"], []).append(row)
    for name, rows in by_checkpoint.items():
        stored = _stored_evaluation(data, rows)
        if stored is None:
            missing.append(name)
            continue
        before = stored_completions(stored)
        after = {mode: with_scores(table, rewards) for mode, table in before.items()}
        new_rows = evaluation_rows(after, params.evaluation, rows[0]["seed"], correctness)
        out = folder / EVALUATIONS / f"{rows[0]['checkpoint_id']}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            pq.write_table(completions_table(after), tmp)
        entry = {"checkpoint": name, "checkpoint_id": rows[0]["checkpoint_id"]}
        for old, new in zip(rows, new_rows):
            entry[f"{old['mode']}_before"], entry[f"{new['mode']}_after"] = old["accuracy"], new["accuracy"]
            rescored_rows.append({"checkpoint": name, "checkpoint_id": rows[0]["checkpoint_id"], "mode": new["mode"], "accuracy": new["accuracy"]})
        sampled = next(r for r in rows if r["mode"] == "sampled")
        entry["flipped"] = flipped_prompts(before["sampled"], after["sampled"], sampled["n_samples"], sampled["correctness"], correctness)
        checkpoints.append(entry)

    best_before = next((c for c in rank_candidates(evaluation, data, params) if not c["failed"]), None)
    best_after = next((c for c in rank_candidates(rescored_rows, data, params) if not c["failed"]), None) if rescored_rows else None
    report = {"key": key, "folder": folder.as_posix(), "rewards": rewards.model_dump(mode="json"), "correctness": correctness,
              "rounds": rounds, "checkpoints": checkpoints, "not_rescored": missing,
              "best_before": best_before and best_before["checkpoint"], "best_after": best_after and best_after["checkpoint"]}
    if promoted_id is not None:
        report["promoted_id"] = promoted_id
        report["promotion_would_change"] = bool(best_after) and best_after["checkpoint_id"] != promoted_id
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "rescore.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _stored_evaluation(data: Path, rows: list[dict]) -> Path | None:
    """The stored completions of the evaluation these rows came from: of their checkpoint, with the same results
    (an evaluation under other params or code has other completions, and its rows differ)."""
    checkpoint_id = rows[0]["checkpoint_id"]
    for result in sorted((data / EVALUATIONS).glob(f"{checkpoint_id}-*.json")):
        completions = result.with_suffix(".parquet")
        if not completions.is_file():
            continue
        cached = {r["mode"]: r for r in json.loads(result.read_text())}
        if all(r["mode"] in cached and cached[r["mode"]]["correct_per_prompt"] == r["correct_per_prompt"]
               and cached[r["mode"]]["accuracy"] == r["accuracy"] for r in rows):
            return completions
    return None


def rescore_text(report: dict) -> str:
    """The report as the CLI prints it."""
    functions = ", ".join(f"{f['name']} x{f['weight']:g}" for f in report["rewards"]["functions"])
    lines = [f"rescored with {functions} (correct: score_{report['correctness']} = 1), written to {report['folder']}/", "",
             f"{'round':<8}{'rollouts':>9}{'reward before':>15}{'after':>8}{'correct agree':>15}"]
    for r in report["rounds"]:
        before = f"{r['reward_mean_before']:>15.3f}" if "reward_mean_before" in r else f"{'-':>15}"
        agree = f"{r['correct_agreement']:>15.3f}" if r.get("correct_agreement") is not None else f"{'-':>15}"
        lines.append(f"{round_prefix(r['round']):<8}{r['rollouts']:>9}{before}{r['reward_mean_after']:>8.3f}{agree}")
    lines += ["", f"{'checkpoint':<16}{'sampled before':>15}{'after':>8}{'greedy before':>15}{'after':>8}{'prompts flipped':>17}"]
    for c in report["checkpoints"]:
        greedy = f"{c['greedy_before']:>15.3f}{c['greedy_after']:>8.3f}" if "greedy_before" in c else f"{'-':>15}{'-':>8}"
        lines.append(f"{c['checkpoint']:<16}{c['sampled_before']:>15.3f}{c['sampled_after']:>8.3f}{greedy}{len(c['flipped']):>17}")
    if report["not_rescored"]:
        lines.append(f"not rescored (no stored held-out completions here): {', '.join(report['not_rescored'])}")
    change = "unchanged" if report["best_before"] == report["best_after"] else "would change"
    lines += ["", f"best checkpoint: {report['best_before']} before, {report['best_after']} after ({change})"]
    if "promotion_would_change" in report:
        lines.append(f"promoted model {report['promoted_id'][:12]}: " + ("another checkpoint would be promoted" if report["promotion_would_change"]
                                                                         else "still the best under the new reward"))
    flips = [(c["checkpoint"], f) for c in report["checkpoints"] for f in c["flipped"]][:5]
    if flips:
        lines += ["", "prompts flipped (sampled; correct completions before -> after):"]
        lines += [f"  {name} {f['prompt_id'][:10]} {f['correct_before']}->{f['correct_after']}  {f['prompt'][-40:]!r} answer {f['answer']!r}: "
                  f"{f['completion'][:40]!r}" for name, f in flips]
    return "\n".join(lines)
