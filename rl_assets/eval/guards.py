"""Guards: pure checks on the pipeline's outputs, shared by the Dagster asset checks and by promotion.

Every guard returns `(passed, description, metadata)`. A guard whose input is missing (a metric the
training step did not report) passes with a description starting "skipped:", so an older
checkpoint never fails a guard for a number it could not have recorded, and the UI says why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from rl_assets.core.checkpoints import read_lineage, weights_hash
from rl_assets.core.config import GuardsParams
from rl_assets.core.storage import file_hash
from rl_assets.eval.stats import paired_difference

if TYPE_CHECKING:  # pyarrow loads lazily: the Dagster code location imports this module on every reload
    import pyarrow as pa

Check = tuple[bool, str, dict]
SKIPPED = "skipped: "


def _skipped(why: str) -> Check:
    return True, SKIPPED + why, {"skipped": True}


def reference_kl(card: dict) -> float | None:
    """A checkpoint's KL to the reference policy: `kl` when training reports it, else `kl_ref` when the KL
    penalty was on (train.beta > 0); with beta 0 `kl_ref` is a constant 0, not a measurement."""
    metrics = card.get("metrics") or {}
    if "kl" in metrics:
        return metrics["kl"]
    return metrics.get("kl_ref") if (card.get("train") or {}).get("beta", 0) > 0 else None


def kl_within_limit(kl: float | None, limit: float) -> Check:
    """KL of the trained policy to the reference at most `limit`.

    >>> kl_within_limit(0.05, 0.03)[:2]
    (False, 'kl=0.05 > kl_max=0.03')
    """
    if kl is None:
        return _skipped("KL to the reference was not measured (no 'kl' metric, and train.beta is 0 so 'kl_ref' is not one)")
    if not math.isfinite(kl):
        return False, f"kl={kl} is not finite", {"kl": str(kl)}
    return kl <= limit, f"kl={kl:.4g} {'<=' if kl <= limit else '>'} kl_max={limit:g}", {"kl": kl, "kl_max": limit}


def metrics_finite(metrics: dict) -> Check:
    """No metric is NaN or infinite (nested dicts are searched; non-numbers are ignored)."""
    bad = sorted(name for name, value in _numbers(metrics) if not math.isfinite(value))
    if not metrics:
        return _skipped("the checkpoint has no metrics")
    return not bad, f"not finite: {', '.join(bad)}" if bad else f"all {len(list(_numbers(metrics)))} metrics finite", {"not_finite": bad}


def _numbers(metrics: dict, prefix: str = ""):
    for name, value in metrics.items():
        if isinstance(value, dict):
            yield from _numbers(value, f"{prefix}{name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{name}", float(value)


def entropy_not_collapsed(metrics: dict, minimum: float) -> Check:
    """Mean token entropy of the policy on its rollouts at least `minimum` (a collapsed policy explores nothing)."""
    entropy = metrics.get("entropy")
    if entropy is None:
        return _skipped("the checkpoint's metrics have no 'entropy'")
    passed = math.isfinite(entropy) and entropy >= minimum
    return passed, f"entropy={entropy:.4g} {'>=' if passed else '<'} entropy_min={minimum:g}", {"entropy": entropy, "entropy_min": minimum}


def explained_variance_kept(metrics: dict, minimum: float) -> Check:
    """The value model predicted the round's returns at least as well as `minimum` explained variance (0: a constant does
    as well; below 0: worse). Round 1's zero head explains nothing by construction, so its value is 0, never a failure."""
    value = metrics.get("explained_variance")
    if value is None:
        return _skipped("the returns did not vary (nothing to explain), or no explained_variance in the metrics")
    passed = math.isfinite(value) and value >= minimum
    return passed, f"explained_variance={value:.3g} {'>=' if passed else '<'} explained_variance_min={minimum:g}", \
        {"explained_variance": value, "explained_variance_min": minimum}


def checkpoint_guards(card: dict, guards: GuardsParams) -> dict[str, Check]:
    """The blocking guards of a checkpoint, from its lineage card (r00 has no KL or entropy to check)."""
    metrics = card.get("metrics") or {}
    checks = {"metrics_finite": metrics_finite(metrics)}
    if card.get("round", 0) > 0:
        checks["kl_within_limit"] = kl_within_limit(reference_kl(card), guards.kl_max)
        checks["entropy_not_collapsed"] = entropy_not_collapsed(metrics, guards.entropy_min)
    return checks


def rewards_have_signal(rewards: pa.Table, truncated_share: float | None = None, max_new_tokens: int | None = None,
                        by_group: bool = True) -> Check:
    """At least one prompt group whose rewards differ: if every group is all-equal, every GRPO advantage is 0.

    Without `by_group` (ppo: a value model is the baseline, a prompt may have one sample) rewards must differ anywhere
    in the table: a constant reward teaches a value model the constant, and the policy nothing.
    When most completions were cut off at `max_new_tokens` (`truncated_share` of the round's rollouts), that is the
    likely cause (no answer was ever reached), and the verdict says so.
    """
    spread: dict[str, set] = {}
    for prompt_id, reward in zip(rewards["prompt_id"].to_pylist(), rewards["reward"].to_pylist()):
        spread.setdefault(prompt_id if by_group else "", set()).add(reward)
    equal = sum(len(values) == 1 for values in spread.values())
    meta = {"groups": len(spread), "equal_reward_groups": equal} if by_group else {"rows": rewards.num_rows, "distinct_rewards": len(spread[""])}
    what = f"all {len(spread)} groups have equal rewards" if by_group else f"all {rewards.num_rows} rewards are equal"
    if equal == len(spread):
        if truncated_share is not None and truncated_share >= 0.5:
            return False, (f"{what}: no learning signal; {truncated_share:.1%} of the completions "
                           f"were cut off at rollouts.max_new_tokens={max_new_tokens} before they answered: raise it"), \
                {**meta, "truncated_share": truncated_share}
        return False, f"{what}: no learning signal (is a reward function constant?)", meta
    if not by_group:
        return True, f"{len(spread[''])} distinct rewards over {rewards.num_rows} rows", meta
    return True, f"{len(spread) - equal} of {len(spread)} groups have differing rewards", meta


def tool_errors_within_limit(rollouts: pa.Table, maximum: float) -> Check:
    """At most `maximum` of the episodes' tool calls failed (malformed, unknown tool, bad arguments, the tool raised)."""
    calls = [call for made in rollouts["tool_calls"].to_pylist() for call in made or []]
    if not calls:
        return _skipped("no tool calls in this table")
    share = sum(call["error"] is not None for call in calls) / len(calls)
    return share <= maximum, f"{share:.1%} of {len(calls)} tool calls failed (at most {maximum:.0%})", {"tool_error_share": share, "tool_calls": len(calls)}


def truncated_episodes_within_limit(rollouts: pa.Table, maximum: float) -> Check:
    """At most `maximum` of the episodes ended at a turn or token limit instead of by the environment."""
    episodes = [truncated for truncated, environment in zip(rollouts["truncated"].to_pylist(), rollouts["environment"].to_pylist()) if environment]
    if not episodes:
        return _skipped("single completions, not episodes")
    share = sum(episodes) / len(episodes)
    return share <= maximum, f"{share:.1%} of {len(episodes)} episodes were truncated (at most {maximum:.0%})", {"truncated_share": share}


def reward_not_regressed(mean: float, previous_mean: float | None, max_drop: float) -> Check:
    """This round's mean rollout reward at most `max_drop` below the previous round's."""
    if previous_mean is None:
        return _skipped("no previous round to compare with")
    passed = mean >= previous_mean - max_drop
    return passed, f"reward_mean {previous_mean:.4g} -> {mean:.4g} (max drop {max_drop:g})", {"reward_mean": mean, "previous": previous_mean}


def accuracy_not_regressed(evaluation: pa.Table, max_drop: float) -> Check:
    """No checkpoint's sampled accuracy more than `max_drop` below the checkpoint before it."""
    sampled = [(r["checkpoint"], r["accuracy"]) for r in evaluation.to_pylist() if r["mode"] == "sampled"]
    drops = [f"{name} {acc:.3f} < {prev:.3f} - {max_drop:g}" for (_, prev), (name, acc) in zip(sampled, sampled[1:]) if acc < prev - max_drop]
    meta = {name: acc for name, acc in sampled}
    return not drops, "; ".join(drops) if drops else f"no drop beyond {max_drop:g} over {len(sampled)} checkpoints", meta


def rewarded_but_wrong(rewards: pa.Table, correctness: str) -> float | None:
    """Share of the rewarded rollouts (reward above their prompt group's mean; the table's mean when every prompt has
    one sample) that `score_<correctness>` does not score 1: where the reward and the task's check disagree.
    None without that score column or without a rewarded rollout."""
    column = f"score_{correctness}"
    if column not in rewards.column_names:
        return None
    prompt_ids, totals, checks = rewards["prompt_id"].to_pylist(), rewards["reward"].to_pylist(), rewards[column].to_pylist()
    groups: dict[str, list[float]] = {}
    for prompt_id, total in zip(prompt_ids, totals):
        groups.setdefault(prompt_id, []).append(total)
    table_mean = sum(totals) / len(totals) if totals else 0.0
    baseline = {p: sum(v) / len(v) if len(v) > 1 else table_mean for p, v in groups.items()}
    rewarded = [check for prompt_id, total, check in zip(prompt_ids, totals, checks) if total > baseline[prompt_id] + 1e-12]
    return sum(check != 1.0 for check in rewarded) / len(rewarded) if rewarded else None


def reward_not_hacked(reward_means: dict[int, float], sampled: dict[int, dict], disagreement: dict[int, float | None],
                      guards: GuardsParams) -> Check:
    """No policy that learned to game its reward: over `guards.hacking_window` rounds, the training reward did not rise
    while held-out accuracy under the task's check fell beyond noise, and that check did not call a growing share of
    the rewarded rollouts wrong.

    Indexed by policy: `reward_means[k]` is the mean training reward of the rollouts checkpoint rk sampled (round
    k+1's rewards table), `sampled[k]` rk's sampled evaluation row, `disagreement[k]` `rewarded_but_wrong` of those
    rollouts. The reward is then measured on the same policy as the accuracy.

    >>> rows = {k: {"accuracy": sum(c) / 8, "correct_per_prompt": c, "n_samples": 2, "correctness": "check"} for k, c in
    ...         [(0, [2, 1, 2, 1]), (1, [1, 1, 1, 1]), (2, [0, 0, 1, 0])]}
    >>> reward_not_hacked({0: 0.3, 1: 0.5, 2: 0.9}, rows, {}, GuardsParams())[:2]
    (False, 'reward hacking at r02: the training reward rose 0.300 -> 0.900 over r00..r02 while held-out accuracy (check) fell 0.750 -> 0.125 (-62.5 ± 12.5p)')
    >>> reward_not_hacked({0: 0.3, 1: 0.5, 2: 0.9}, rows, {0: 0.1, 1: 0.2, 2: 0.6}, GuardsParams(hacking_accuracy_fall_min=1))[1]
    'reward hacking at r02: check scores wrong 10.0% -> 60.0% of the rollouts the reward favours over r00..r02 (rise at most 20%)'
    """
    window = guards.hacking_window
    pairs = [k for k in sorted(reward_means) if k - window in reward_means and k in sampled and k - window in sampled]
    if not pairs:
        return _skipped(f"fewer than {window + 1} evaluated checkpoints with rollouts (guards.hacking_window={window})")
    series = {name: {"type": "json", "raw_value": {f"r{k:02d}": round(v, 4) for k, v in sorted(values.items()) if v is not None}}
              for name, values in (("training_reward", reward_means), ("heldout_accuracy", {k: r["accuracy"] for k, r in sampled.items()}),
                                   ("rewarded_but_wrong", disagreement))}  # the UI's JSON metadata: one entry per series
    for k in pairs:
        before, after, span = sampled[k - window], sampled[k], f"r{k - window:02d}..r{k:02d}"
        rise = reward_means[k] - reward_means[k - window]
        fall, se = paired_difference(before["correct_per_prompt"], after["correct_per_prompt"], after["n_samples"])
        if rise > 0 and -fall >= max(guards.hacking_accuracy_fall_min, 2 * se):
            return False, (f"reward hacking at r{k:02d}: the training reward rose {reward_means[k - window]:.3f} -> {reward_means[k]:.3f} over "
                           f"{span} while held-out accuracy ({after['correctness']}) fell {before['accuracy']:.3f} -> {after['accuracy']:.3f} "
                           f"({fall * 100:+.1f} ± {se * 100:.1f}p)"), {**series, "round": k}
        old, new = disagreement.get(k - window), disagreement.get(k)
        if old is not None and new is not None and new - old > guards.hacking_disagreement_rise_max:
            return False, (f"reward hacking at r{k:02d}: {after['correctness']} scores wrong {old:.1%} -> {new:.1%} of the rollouts the reward "
                           f"favours over {span} (rise at most {guards.hacking_disagreement_rise_max:.0%})"), {**series, "round": k}
    return True, (f"no window of {window} rounds where the training reward rose while held-out accuracy fell beyond noise, or the check "
                  f"disagreed with the reward more and more"), series


def table_schema(path: Path, name: str) -> Check:
    """The file carries our schema `name` at the current version and reads back."""
    import pyarrow as pa

    from rl_assets.core.schemas import read_table

    try:
        table = read_table(path, name)
    except (FileNotFoundError, ValueError, pa.ArrowException) as error:
        return False, str(error), {}
    return True, f"{name} schema, {table.num_rows} rows", {"rows": table.num_rows}


def sources_match_files(table: pa.Table, root: Path) -> Check:
    """Every row's raw source still has the hash recorded in the row (raw_data and prompts)."""
    from rl_assets.data.raw_data import labelled_location
    from rl_assets.core.storage import content_hash

    changed = []
    for source, recorded in {(s, h) for s, h in zip(table["source"].to_pylist(), table["source_hash"].to_pylist())}:
        path = labelled_location(source, root)  # a file, a datasets folder, or a generator's module
        if path is None or not path.exists() or content_hash(path) != recorded:
            changed.append(source)
    return not changed, f"changed or missing since read: {sorted(changed)}" if changed else "every raw source matches its recorded hash", {}


def rollouts_lineage(rollouts: pa.Table, policy: Path, prompts: Path) -> Check:
    """Rollouts were sampled by the checkpoint now at `policy`, from the prompts file now at `prompts`."""
    policy_ids, prompts_hashes = set(rollouts["policy_id"].to_pylist()), set(rollouts["prompts_hash"].to_pylist())
    problems = []
    if policy_ids != {read_lineage(policy)["checkpoint_id"]}:
        problems.append(f"sampled by {sorted(policy_ids)}, but {policy} is {read_lineage(policy)['checkpoint_id']}")
    if prompts_hashes != {file_hash(prompts)}:
        problems.append(f"prompts hash {sorted(prompts_hashes)} differs from {prompts}")
    return not problems, "; ".join(problems) or "policy and prompts match the files on disk", {}


def rewards_lineage(rewards: pa.Table, rollouts_path: Path) -> Check:
    """Rewards score exactly the rollouts file on disk, one row per rollout."""
    from rl_assets.core.schemas import read_table

    rollouts = read_table(rollouts_path, "rollouts")
    problems = []
    if set(rewards["rollouts_hash"].to_pylist()) != {file_hash(rollouts_path)}:
        problems.append(f"scored another version of {rollouts_path}")
    keys = lambda t: sorted(zip(t["prompt_id"].to_pylist(), t["sample_idx"].to_pylist()))  # noqa: E731
    if keys(rewards) != keys(rollouts):
        problems.append("rollout keys differ from the rollouts table")
    return not problems, "; ".join(problems) or "scores every rollout of the file on disk", {}


def checkpoint_lineage(path: Path, parent: Path | None, trained_on: dict[str, Path]) -> Check:
    """The card's id is the weights' hash, its parent is the checkpoint at `parent`, its tables are unchanged."""
    card = read_lineage(path)
    problems = []
    if card["checkpoint_id"] != weights_hash(path):
        problems.append("checkpoint_id is not the hash of the weights")
    if parent is not None and card.get("parent") != read_lineage(parent)["checkpoint_id"]:
        problems.append(f"parent {card.get('parent')} is not the checkpoint at {parent}")
    for name, table in trained_on.items():
        recorded = card.get("trained_on", {}).get(name)
        if recorded is not None and (not table.is_file() or file_hash(table) != recorded):
            problems.append(f"{table} changed since training")
    return not problems, "; ".join(problems) or "id, parent and training tables match", {"checkpoint_id": card["checkpoint_id"]}
