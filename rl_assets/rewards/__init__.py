"""rewards: score stored rollouts with plain reward functions, without resampling.

Every reward function has TRL's signature, `f(completions, **kwargs) -> list[float | None]`, where
the keyword arguments are the rollout table's columns (`answer`, `prompt`, ...) plus the keys of its
`extra` JSON column. The same function therefore scores stored rollouts here, runs inside a TRL
trainer, and tests with a list of strings. Settings come from `rewards.functions[i].options` and are
bound with `functools.partial`; a None score means "does not apply" and adds 0 to the total.

Built in: math answers (`math_answers.py`), LaTeX/symbolic answers through math-verify (`symbolic.py`),
text shape (`text.py`), running code against tests (`code_execution.py`), a sequence-classification
reward model (`reward_model.py`) and, for episodes, the environment's reward parts and tool success (`episodes.py`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from typing import TYPE_CHECKING, Callable


from rl_assets.core.config import RewardsParams
from rl_assets.rewards.code_execution import code_execution
from rl_assets.rewards.episodes import environment_reward, final_answer, tool_success
from rl_assets.rewards.math_answers import answer_format, arithmetic_answer, math_answer
from rl_assets.rewards.reward_model import reward_model
from rl_assets.rewards.symbolic import math_verify
from rl_assets.rewards.text import format_regex, length_penalty, repetition_penalty, required_tags
from rl_assets.core.user_code import load_named

if TYPE_CHECKING:  # pyarrow loads lazily: validating params (the code location, every UI reload) imports this module
    import pyarrow as pa

BUILT_IN = {f.__name__: f for f in (math_answer, math_verify, arithmetic_answer, answer_format, format_regex, required_tags,
                                    length_penalty, repetition_penalty, code_execution, reward_model, environment_reward, final_answer,
                                    tool_success)}

# The rollout columns every reward function receives as keyword arguments.
COLUMNS = ("prompt", "answer", "prompt_id", "completion_ids", "truncated")


def load_reward_function(name: str) -> Callable:
    """A built-in reward by name, or `package.module:function` from the user's code (imported now)."""
    return load_named(name, BUILT_IN, "rewards.functions", "reward")


def resolve_reward_function(name: str, options: dict | None = None) -> Callable:
    """`load_reward_function` with its checked `options` bound (the result keeps the function's name).

    >>> resolve_reward_function("format_regex", {"pattern": "[0-9]+"})(["12", "x"])
    [1.0, 0.0]
    """
    function = load_reward_function(name)
    check_options(name, function, options or {})
    if not options:
        return function
    return functools.update_wrapper(functools.partial(function, **options), function)


def check_options(name: str, function: Callable, options: dict) -> None:
    """Every option is a named parameter of `function`, and every keyword-only one without a default is given.

    `**kwargs` does not count: it receives the table's columns, and an option lost there is a typo.
    Nor do the columns themselves: each call passes them, so an option of that name would be ignored.

    >>> check_options("length_penalty", length_penalty, {"target": 4, "max_lenght": 8})
    Traceback (most recent call last):
    ...
    ValueError: reward 'length_penalty' has no option 'max_lenght'; its options: ['max_length', 'target', 'unit']
    """
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        if options:
            raise ValueError(f"reward {name!r}: cannot read its signature to check options {sorted(options)}") from None
        return
    # A table column passed as an option would be overridden by the column at every call: not an option.
    named = sorted(n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in ("completions", "prompts", *COLUMNS))
    for key in options:
        if key not in named:
            raise ValueError(f"reward {name!r} has no option {key!r}; its options: {named}")
    for parameter_name, parameter in parameters.items():
        if parameter.kind == parameter.KEYWORD_ONLY and parameter.default is parameter.empty and parameter_name not in options:
            raise ValueError(f"reward {name!r} needs option {parameter_name!r}")


def reward_config_hash(params: RewardsParams) -> str:
    return hashlib.sha256(json.dumps(params.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def reward_kwargs(rollouts: pa.Table) -> dict[str, list]:
    """The keyword arguments of every reward call: the COLUMNS (and `prompts`, as TRL names them), then each key of the `extra` JSON objects.

    Episodes add `num_turns`, `environment_rewards`, `tool_calls` and `turns`; prompts with images add `image_ids` (each row's
    list of SHA-256 ids; `rl_assets.data.images.stored_image(<data>/images, id)` is the file).

    A row without a key gets None for it. Extra keys never replace a column (the raw_data config
    refuses such names; this keeps tables written before that check safe too).
    """
    kwargs = {column: rollouts[column].to_pylist() for column in COLUMNS}
    kwargs["prompts"] = kwargs["prompt"]  # TRL's name, so a function written for TRL's trainers runs here unchanged
    if "tool_calls" in rollouts.column_names and rollouts["tool_calls"].null_count < rollouts.num_rows:  # episodes: what the environment reported
        kwargs["num_turns"] = rollouts["num_turns"].to_pylist()
        kwargs["environment_rewards"] = [json.loads(text) if text else {} for text in rollouts["environment_rewards"].to_pylist()]
        kwargs["tool_calls"] = [calls or [] for calls in rollouts["tool_calls"].to_pylist()]
        kwargs["turns"] = rollouts["turns"].to_pylist()
    if "image_ids" in rollouts.column_names and any(rollouts["image_ids"].to_pylist()):  # the prompts' images (rl_assets.data.images)
        kwargs["image_ids"] = [ids or [] for ids in rollouts["image_ids"].to_pylist()]
    if "extra" not in rollouts.column_names:
        return kwargs
    rows = []
    for row, text in enumerate(rollouts["extra"].to_pylist()):
        value = json.loads(text) if text else {}
        if not isinstance(value, dict):
            raise ValueError(f"rollout {_rollout_key(rollouts, row)}: `extra` is not a JSON object: {text[:80]!r}")
        rows.append(value)
    for key in sorted({k for r in rows for k in r} - set(kwargs)):
        kwargs[key] = [r.get(key) for r in rows]
    return kwargs


def _rollout_key(rollouts: pa.Table, row: int) -> str:
    return f"prompt_id={rollouts['prompt_id'][row].as_py()} sample_idx={rollouts['sample_idx'][row].as_py()}"


def _checked(name: str, scores, rollouts: pa.Table) -> list[float | None]:
    """Scores as floats or None; a wrong count, a non-number, NaN or inf stops with the function and rollout."""
    if len(scores) != rollouts.num_rows:
        raise ValueError(f"reward {name!r} returned {len(scores)} scores for {rollouts.num_rows} rollouts")
    checked = []
    for row, score in enumerate(scores):
        if score is not None:
            try:
                score = float(score) if not isinstance(score, (str, bytes)) else None
            except (TypeError, ValueError):
                score = None
            if score is None:
                raise ValueError(f"reward {name!r} returned {scores[row]!r}, not a number, for rollout {_rollout_key(rollouts, row)}")
            if not math.isfinite(score):
                raise ValueError(f"reward {name!r} returned {score} for rollout {_rollout_key(rollouts, row)}")
        checked.append(score)
    return checked


def score_rollouts(rollouts: pa.Table, params: RewardsParams, rollouts_hash: str) -> pa.Table:
    """The rewards table: one `score_<name>` column per function (its weight in the field metadata) and the weighted total `reward`."""
    import pyarrow as pa

    from rl_assets.core.schemas import rewards_schema

    kwargs = reward_kwargs(rollouts)
    completions = rollouts["completion"].to_pylist()
    total = [0.0] * rollouts.num_rows
    columns = {}
    for spec in params.functions:
        function = resolve_reward_function(spec.name, spec.options)
        try:
            scores = function(completions=completions, **kwargs)  # by keyword, as TRL calls it
        except Exception as error:
            raise RuntimeError(f"reward {spec.name!r} failed: {type(error).__name__}: {error}") from error
        scores = _checked(spec.name, scores, rollouts)
        for row, score in enumerate(scores):
            total[row] += spec.weight * (score or 0.0)
        columns[f"score_{spec.score_name}"] = scores
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
        schema=_described(rewards_schema([spec.score_name for spec in params.functions]), params),
    )


def _described(schema: pa.Schema, params: RewardsParams) -> pa.Schema:
    """Each score column's field metadata names its function, options and weight, so the file explains its total."""
    for spec in params.functions:
        index = schema.get_field_index(f"score_{spec.score_name}")
        meta = {"rl_assets.function": spec.name, "rl_assets.weight": repr(spec.weight), "rl_assets.options": json.dumps(spec.options, sort_keys=True)}
        schema = schema.set(index, schema.field(index).with_metadata(meta))
    return schema


def summarize_rewards(rewards: pa.Table, group_size: int) -> dict:
    """Mean and std of the total, the mean of each function, and the share of all-equal groups."""
    from rl_assets.core.schemas import reward_function_names

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
