"""Asset checks: the guards of rl_assets.guards on every output, blocking where a failure must stop the run.

Each asset declares its guards as check specs and evaluates them in its own step, right after
writing its output (`guarded`): no step of their own, so a round is three steps, not six. A
blocking guard that fails is reported with ERROR severity and then fails the step with
`Failure(allow_retries=False)` (a retry would write the same output and fail the same way), so
Dagster skips everything downstream in the same run: a checkpoint whose KL to the reference is over
`guards.kl_max` stops every later round, the evaluation and the promotion. Regression guards only
warn (ranking is promotion's job).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, Failure, MaterializeResult

from rl_assets import guards
from rl_assets.config import Params
from rl_assets.paths import checkpoint_key, output_path, round_prefix

# guard name -> (blocking, description)
TABLE = {"schema": (True, "The file carries this table's schema and version and reads back.")}
SOURCES = {"sources_unchanged": (True, "Every raw source still has the hash recorded in the rows.")}
CHECKPOINT = {
    "metrics_finite": (True, "No training metric is NaN or infinite."),
    "kl_within_limit": (True, "KL to the reference policy at most guards.kl_max (default 0.03); a failure stops the later rounds."),
    "entropy_not_collapsed": (True, "Mean token entropy of the policy at least guards.entropy_min."),
    "lineage": (True, "Checkpoint id is the weights' hash; parent and training tables match the files on disk."),
}
ROLLOUTS = {**TABLE, "lineage": (True, "Sampled by the previous checkpoint on disk, from the prompts file on disk.")}
REWARDS = {
    **TABLE,
    "lineage": (True, "Scores every rollout of the rollouts file on disk."),
    "reward_signal": (True, "Some prompt group has differing rewards; otherwise every GRPO advantage is 0."),
    "reward_not_regressed": (False, "Mean rollout reward at most guards.reward_drop_max below the previous round's."),
}
EVALUATION = {**TABLE, "accuracy_not_regressed": (False, "No checkpoint's sampled accuracy more than guards.accuracy_drop_max below the one before.")}

Guards = dict[str, Callable[[], guards.Check]]


def _results(key: str, specs: dict[str, tuple[bool, str]], guards_now: Guards) -> list[AssetCheckResult]:
    """Every guard of `key` evaluated; a guard that raises fails with its error."""
    asset_key, results = AssetKey(key.split("/")), []
    for name, guard in guards_now.items():
        try:
            passed, description, metadata = guard()
        except (FileNotFoundError, ValueError, KeyError) as error:
            passed, description, metadata = False, f"{type(error).__name__}: {error}", {}
        results.append(AssetCheckResult(asset_key=asset_key, check_name=name, passed=passed, description=description, metadata=metadata,
                                        severity=AssetCheckSeverity.ERROR if specs[name][0] else AssetCheckSeverity.WARN))
    return results


def _read(key: str, name: str):
    from rl_assets.schemas import read_table

    return read_table(output_path(key), name)


def _mean_reward(key: str) -> float:
    import pyarrow.compute as pc

    return pc.mean(_read(key, "rewards")["reward"]).as_py()


def _checkpoint(n: int):
    def make(p: Params) -> Guards:
        from rl_assets.checkpoints import read_lineage

        path = output_path(checkpoint_key(n))
        card = lambda: read_lineage(path)  # noqa: E731
        found = {"metrics_finite": lambda: guards.checkpoint_guards(card(), p.guards)["metrics_finite"]}
        if n == 0:
            return {**found, "lineage": lambda: guards.checkpoint_lineage(path, None, {"prompts": output_path("prompts")})}
        tables = {t: output_path(f"{round_prefix(n)}/{t}") for t in ("rollouts", "rewards")}
        return {**found,
                "kl_within_limit": lambda: guards.kl_within_limit(guards.reference_kl(card()), p.guards.kl_max),
                "entropy_not_collapsed": lambda: guards.entropy_not_collapsed(card().get("metrics") or {}, p.guards.entropy_min),
                "lineage": lambda: guards.checkpoint_lineage(path, output_path(checkpoint_key(n - 1)), tables)}

    specs = CHECKPOINT if n else {k: CHECKPOINT[k] for k in ("metrics_finite", "lineage")}
    return specs, make


def _rollouts(n: int):
    key = f"{round_prefix(n)}/rollouts"
    return ROLLOUTS, lambda p: {
        "schema": lambda: guards.table_schema(output_path(key), "rollouts"),
        "lineage": lambda: guards.rollouts_lineage(_read(key, "rollouts"), output_path(checkpoint_key(n - 1)), output_path("prompts"))}


def _rewards(n: int):
    key, previous = f"{round_prefix(n)}/rewards", f"{round_prefix(n - 1)}/rewards"
    return REWARDS, lambda p: {
        "schema": lambda: guards.table_schema(output_path(key), "rewards"),
        "lineage": lambda: guards.rewards_lineage(_read(key, "rewards"), output_path(f"{round_prefix(n)}/rollouts")),
        "reward_signal": lambda: guards.rewards_have_signal(_read(key, "rewards")),
        "reward_not_regressed": lambda: guards.reward_not_regressed(_mean_reward(key), _mean_reward(previous) if n > 1 else None, p.guards.reward_drop_max)}


def _with_sources(key: str):
    return {**TABLE, **SOURCES}, lambda p: {
        "schema": lambda: guards.table_schema(output_path(key), key),
        "sources_unchanged": lambda: guards.sources_match_files(_read(key, key), Path("."))}


def _evaluation():
    return EVALUATION, lambda p: {
        "schema": lambda: guards.table_schema(output_path("evaluation"), "evaluation"),
        "accuracy_not_regressed": lambda: guards.accuracy_not_regressed(_read("evaluation", "evaluation"), p.guards.accuracy_drop_max)}


def _guards_of(key: str):
    """(specs, make) of an asset's guards, or None for an asset without any (promoted_model, reward_model)."""
    if key in ("raw_data", "prompts"):
        return _with_sources(key)
    if key == "evaluation":
        return _evaluation()
    found = re.fullmatch(r"r(\d{2})/(rollouts|rewards|checkpoint)", key)
    if not found:
        return None
    n, kind = int(found.group(1)), found.group(2)
    return _checkpoint(n) if kind == "checkpoint" else _rollouts(n) if kind == "rollouts" else _rewards(n)


def guard_specs(key: str) -> list[AssetCheckSpec]:
    """The check specs an asset declares: one per guard, blocking where a failure must stop the run."""
    found = _guards_of(key)
    asset_key = AssetKey(key.split("/"))
    return [AssetCheckSpec(name, asset=asset_key, blocking=blocking, description=text) for name, (blocking, text) in (found[0] if found else {}).items()]


def guarded(key: str, params: Params, result: MaterializeResult) -> Iterator[MaterializeResult | AssetCheckResult]:
    """Yield the asset's materialization with its guards' results; then fail, without retries, if a blocking one failed."""
    found = _guards_of(key)
    checks = _results(key, found[0], found[1](params)) if found else []
    yield result
    yield from checks
    failed = [check for check in checks if not check.passed and check.severity == AssetCheckSeverity.ERROR]
    if failed:
        names = ", ".join(f"{check.check_name} ({check.description})" for check in failed)
        raise Failure(description=f"blocking guard failed on {key}: {names}; nothing after it runs",
                      metadata={"failed_guards": [check.check_name for check in failed]}, allow_retries=False)
