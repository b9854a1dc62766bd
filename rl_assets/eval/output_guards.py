"""Which guards each output has, and their verdict on it: the table behind every asset check.

Dagster-free, so the compute child that writes an output evaluates its guards right after writing
it and stops there when a blocking one fails (nothing after it is written); `pipelines.launch.checks`
turns the same table into Dagster check specs and results.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rl_assets.eval import guards
from rl_assets.core.algorithms import algorithm
from rl_assets.core.config import Params
from rl_assets.core.graph import sampling_checkpoint
from rl_assets.core.paths import checkpoint_key, data_dir, output_path, round_prefix

# guard name -> (blocking, description)
TABLE = {"schema": (True, "The file carries this table's schema and version and reads back.")}
SOURCES = {"sources_unchanged": (True, "Every raw source still has the hash recorded in the rows.")}
CHECKPOINT = {
    "metrics_finite": (True, "No training metric is NaN or infinite."),
    "kl_within_limit": (True, "KL to the reference policy at most guards.kl_max (default 0.03); a failure stops the later rounds."),
    "entropy_not_collapsed": (True, "Mean token entropy of the policy at least guards.entropy_min."),
    "lineage": (True, "Checkpoint id is the weights' hash; parent and training tables match the files on disk."),
}
CRITIC = {
    "metrics_finite": (True, "No value-model metric (value loss, clip fraction, explained variance) is NaN or infinite."),
    "explained_variance": (False, "The parent value model explained at least guards.explained_variance_min of the variance of "
                                  "this round's returns (a collapsing value model gives the policy noise for advantages)."),
}
ROLLOUTS = {**TABLE, "lineage": (True, "Sampled by the checkpoint on disk the round samples from (the previous one, or an older one with "
                                        "rollouts.staleness), from the prompts file on disk."),
            "tool_errors": (False, "Episodes: at most guards.tool_error_share_max of the tool calls failed."),
            "truncated_episodes": (False, "Episodes: at most guards.truncated_episode_share_max ended at a turn or token limit.")}
REWARDS = {
    **TABLE,
    "lineage": (True, "Scores every rollout of the rollouts file on disk."),
    "reward_signal": (True, "Some prompt group has differing rewards; otherwise every GRPO advantage is 0 (ppo: some rewards differ)."),
    "reward_not_regressed": (False, "Mean rollout reward at most guards.reward_drop_max below the previous round's."),
}
EVALUATION = {**TABLE, "accuracy_not_regressed": (False, "No checkpoint's sampled accuracy more than guards.accuracy_drop_max below the one before."),
              "reward_not_hacked": (True, "The training reward did not rise while held-out accuracy under evaluation.correctness fell, nor "
                                          "did that check call a growing share of rewarded rollouts wrong (guards.hacking_*); a failure "
                                          "stops the run before promotion.")}

Guards = dict[str, Callable[[], guards.Check]]


def _out(key: str, p: Params) -> Path:
    """Where output `key` of the experiment of `p` lies (paths.data_dir)."""
    return output_path(key, data_dir(p.experiment))


def _read(path: Path, name: str):
    """The table as on disk now, read once however many guards look at it."""
    return _read_version(path, name, path.stat().st_mtime_ns if path.is_file() else None)


@functools.lru_cache(maxsize=4)
def _read_version(path: Path, name: str, mtime_ns: int | None):
    from rl_assets.core.schemas import read_table

    return read_table(path, name)


def _mean_reward(path: Path) -> float:
    import pyarrow.compute as pc

    return pc.mean(_read(path, "rewards")["reward"]).as_py()


def _checkpoint(n: int):
    def make(p: Params) -> Guards:
        from rl_assets.core.checkpoints import read_lineage

        path = _out(checkpoint_key(n), p)
        card = lambda: read_lineage(path)  # noqa: E731
        found = {"metrics_finite": lambda: guards.checkpoint_guards(card(), p.guards)["metrics_finite"]}
        if n == 0:
            return {**found, "lineage": lambda: guards.checkpoint_lineage(path, None, {"prompts": _out("prompts", p)})}
        tables = {t: _out(f"{round_prefix(n)}/{t}", p) for t in ("rollouts", "rewards")}
        return {**found,
                "kl_within_limit": lambda: guards.kl_within_limit(guards.reference_kl(card()), p.guards.kl_max),
                "entropy_not_collapsed": lambda: guards.entropy_not_collapsed(card().get("metrics") or {}, p.guards.entropy_min),
                "lineage": lambda: guards.checkpoint_lineage(path, _out(checkpoint_key(n - 1), p), tables)}

    specs = CHECKPOINT if n else {k: CHECKPOINT[k] for k in ("metrics_finite", "lineage")}
    return specs, make


def _critic(n: int):
    def make(p: Params) -> Guards:
        from rl_assets.core.checkpoints import read_lineage

        metrics = lambda: read_lineage(_out(f"{round_prefix(n)}/critic", p)).get("metrics") or {}  # noqa: E731
        return {"metrics_finite": lambda: guards.metrics_finite(metrics()),
                "explained_variance": lambda: guards.explained_variance_kept(metrics(), p.guards.explained_variance_min)}

    return CRITIC, make


def _rollouts(n: int):
    key = f"{round_prefix(n)}/rollouts"
    return ROLLOUTS, lambda p: {
        "schema": lambda: guards.table_schema(_out(key, p), "rollouts"),
        "lineage": lambda: guards.rollouts_lineage(_read(_out(key, p), "rollouts"), _out(sampling_checkpoint(p, n), p), _out("prompts", p)),
        "tool_errors": lambda: guards.tool_errors_within_limit(_read(_out(key, p), "rollouts"), p.guards.tool_error_share_max),
        "truncated_episodes": lambda: guards.truncated_episodes_within_limit(_read(_out(key, p), "rollouts"), p.guards.truncated_episode_share_max)}


def _rewards(n: int):
    key, previous = f"{round_prefix(n)}/rewards", f"{round_prefix(n - 1)}/rewards"
    return REWARDS, lambda p: {
        "schema": lambda: guards.table_schema(_out(key, p), "rewards"),
        "lineage": lambda: guards.rewards_lineage(_read(_out(key, p), "rewards"), _out(f"{round_prefix(n)}/rollouts", p)),
        "reward_signal": lambda: guards.rewards_have_signal(_read(_out(key, p), "rewards"), _truncated_share(_out(f"{round_prefix(n)}/rollouts", p)),
                                                            p.rollouts.max_new_tokens, by_group=not algorithm(p.train.algorithm).value_model),
        "reward_not_regressed": lambda: guards.reward_not_regressed(_mean_reward(_out(key, p)), _mean_reward(_out(previous, p)) if n > 1 else None,
                                                                    p.guards.reward_drop_max)}


def _truncated_share(path: Path) -> float | None:
    """The share of a rollouts table's completions that hit max_new_tokens (None when the table cannot be read)."""
    try:
        truncated = _read(path, "rollouts")["truncated"].to_pylist()
    except (OSError, ValueError, KeyError):
        return None
    return sum(truncated) / len(truncated) if truncated else None


def _with_sources(key: str):
    return {**TABLE, **SOURCES}, lambda p: {
        "schema": lambda: guards.table_schema(_out(key, p), key),
        "sources_unchanged": lambda: guards.sources_match_files(_read(_out(key, p), key), Path("."))}


def _evaluation():
    return EVALUATION, lambda p: {
        "schema": lambda: guards.table_schema(_out("evaluation", p), "evaluation"),
        "accuracy_not_regressed": lambda: guards.accuracy_not_regressed(_read(_out("evaluation", p), "evaluation"), p.guards.accuracy_drop_max),
        "reward_not_hacked": lambda: _reward_not_hacked(p)}


def _reward_not_hacked(p: Params) -> guards.Check:
    """The hacking guard's series: each policy's training reward and rewarded-but-wrong share (from the next round's
    rewards table) beside its sampled held-out row."""
    import pyarrow.compute as pc

    sampled = {int(r["checkpoint"][1:3]): r for r in _read(_out("evaluation", p), "evaluation").to_pylist() if r["mode"] == "sampled"}
    correctness = next(iter(sampled.values()))["correctness"]
    means, disagreement = {}, {}
    for n in range(1, p.rounds + 1):
        path = _out(f"{round_prefix(n)}/rewards", p)
        if path.is_file():
            table = _read(path, "rewards")
            means[n - 1], disagreement[n - 1] = pc.mean(table["reward"]).as_py(), guards.rewarded_but_wrong(table, correctness)
    return guards.reward_not_hacked(means, sampled, disagreement, p.guards)


def _guards_of(key: str):
    """(specs, make) of an asset's guards, or None for an asset without any (promoted_model, reward_model)."""
    if key in ("raw_data", "prompts"):
        return _with_sources(key)
    if key == "evaluation":
        return _evaluation()
    found = re.fullmatch(r"r(\d{2})/(rollouts|rewards|critic|checkpoint)", key)
    if not found:
        return None
    n, kind = int(found.group(1)), found.group(2)
    return {"checkpoint": _checkpoint, "rollouts": _rollouts, "rewards": _rewards, "critic": _critic}[kind](n)


@dataclass
class GuardResult:
    name: str
    passed: bool
    blocking: bool
    description: str
    metadata: dict = field(default_factory=dict)


class GuardFailed(ValueError):
    """A blocking guard failed on an output: the run stops there (a retry would write the same output)."""


def guard_table(key: str) -> dict[str, tuple[bool, str]]:
    """{guard name: (blocking, description)} of an output; empty for one without guards (promoted_model, reward_model)."""
    found = _guards_of(key)
    return found[0] if found else {}


def evaluate_guards(key: str, params: Params) -> list[GuardResult]:
    """Every guard of output `key` on what is on disk now; a guard that raises fails with its error."""
    found = _guards_of(key)
    if not found:
        return []
    specs, make = found
    results = []
    for name, guard in make(params).items():
        try:
            passed, description, metadata = guard()
        except (FileNotFoundError, ValueError, KeyError) as error:
            passed, description, metadata = False, f"{type(error).__name__}: {error}", {}
        results.append(GuardResult(name, passed, specs[name][0], description, metadata))
    return results


def stop_if_blocked(key: str, results: list[GuardResult]) -> None:
    """Raise GuardFailed when a blocking guard of `key` failed."""
    failed = [r for r in results if r.blocking and not r.passed]
    if failed:
        names = ", ".join(f"{r.name} ({r.description})" for r in failed)
        raise GuardFailed(f"blocking guard failed on {key}: {names}; nothing after it runs")
