"""rewards: score stored rollouts with plain reward functions, without resampling.

Every reward function has TRL's signature, `f(completions, **kwargs) -> list[float | None]`, where
the keyword arguments are the rollout table's columns (`answer`, `prompt`, ...). The same function
therefore scores stored rollouts here, runs inside a TRL trainer, and tests with a list of strings.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
from decimal import Decimal
from typing import Callable

import pyarrow as pa

from rl_assets.config import RewardsParams
from rl_assets.schemas import reward_function_names, rewards_schema

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def arithmetic_answer(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1.0 when the first number in the completion equals the reference answer exactly, else 0.0.

    A reference that is not a number never matches.

    >>> arithmetic_answer(["42", " 42 apples", "41", "no idea", "5"], answer=["42", "42", "42", "42", "five"])
    [1.0, 1.0, 0.0, 0.0, 0.0]
    """
    scores = []
    for completion, reference in zip(completions, answer):
        found = _NUMBER.search(completion)
        expected = reference.strip()
        matches = found is not None and _NUMBER.fullmatch(expected) is not None and Decimal(found.group()) == Decimal(expected)
        scores.append(1.0 if matches else 0.0)
    return scores


def answer_format(completions: list[str], **kwargs) -> list[float]:
    """1.0 when the completion is a bare number, so the policy learns to stop after the answer.

    >>> answer_format(["12", "12 and more", ""])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if _NUMBER.fullmatch(c.strip()) else 0.0 for c in completions]


def resolve_reward_function(name: str) -> Callable:
    """A function of this module by name, or `package.module:function` from the user's code."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"rewards.functions: cannot load {name!r}: {error}") from None
    elif name in BUILT_IN:
        function = BUILT_IN[name]
    else:
        raise ValueError(f"rewards.functions: unknown reward {name!r}; built in: {sorted(BUILT_IN)}, or use 'module:function'")
    if not callable(function):
        raise ValueError(f"rewards.functions: {name!r} is not callable")
    return function


def reward_config_hash(params: RewardsParams) -> str:
    return hashlib.sha256(json.dumps(params.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def _column_name(name: str) -> str:
    return name.rpartition(":")[2]


def score_rollouts(rollouts: pa.Table, params: RewardsParams, rollouts_hash: str) -> pa.Table:
    """The rewards table: one `score_<fn>` column per function and the weighted total `reward`."""
    kwargs = {column: rollouts[column].to_pylist() for column in ("prompt", "answer", "prompt_id", "completion_ids", "truncated")}
    completions = rollouts["completion"].to_pylist()
    names = [_column_name(f.name) for f in params.functions]
    total = [0.0] * rollouts.num_rows
    columns = {}
    for spec, column in zip(params.functions, names):
        scores = resolve_reward_function(spec.name)(completions, **kwargs)
        if len(scores) != rollouts.num_rows:
            raise ValueError(f"reward {spec.name!r} returned {len(scores)} scores for {rollouts.num_rows} rollouts")
        for row, score in enumerate(scores):
            if score is not None and not math.isfinite(score):
                key = f"prompt_id={kwargs['prompt_id'][row]} sample_idx={rollouts['sample_idx'][row].as_py()}"
                raise ValueError(f"reward {spec.name!r} returned {score} for rollout {key}")
            total[row] += spec.weight * (score or 0.0)
        columns[f"score_{column}"] = scores
    n = rollouts.num_rows
    return pa.table(
        {
            "round": rollouts["round"],
            "prompt_id": rollouts["prompt_id"],
            "sample_idx": rollouts["sample_idx"],
            "policy_id": rollouts["policy_id"],
            "reward": total,
            "reward_config_hash": [reward_config_hash(params)] * n,
            "rollouts_hash": [rollouts_hash] * n,
            **columns,
        },
        schema=rewards_schema(names),
    )


def summarize_rewards(rewards: pa.Table, group_size: int) -> dict:
    """Mean and std of the total, the mean of each function, and the share of all-equal groups."""
    totals = rewards["reward"].to_pylist()
    mean = sum(totals) / len(totals)
    groups = [totals[i : i + group_size] for i in range(0, len(totals), group_size)]
    summary = {
        "rows": rewards.num_rows,
        "reward_mean": mean,
        "reward_std": (sum((t - mean) ** 2 for t in totals) / max(len(totals) - 1, 1)) ** 0.5,
        "equal_reward_group_share": sum(max(g) == min(g) for g in groups) / len(groups),
    }
    for name in reward_function_names(rewards):
        values = [v for v in rewards[f"score_{name}"].to_pylist() if v is not None]
        summary[f"mean_score_{name}"] = sum(values) / len(values) if values else float("nan")
    return summary


BUILT_IN = {"arithmetic_answer": arithmetic_answer, "answer_format": answer_format}
