"""Preflight: what a run checks before it starts, so that a typo fails in a second, not after the first step.

Parsing params (rl_assets.core.config) checks their shape only. Loading the user's code that they name
(reward functions, tools, an environment) runs that code, and reading the inputs touches the disk, so both
are this step of their own, taken once by each command that runs stages (`rl-assets run`/`materialize`,
`python -m rl_assets.run.step`); commands that only read outputs (report, query, lineage, status) skip it.
"""

from __future__ import annotations

from pathlib import Path

from rl_assets.core.config import Params, ParamsError
from rl_assets.data.raw_data import check_sources
from rl_assets.rewards import check_options, load_reward_function
from rl_assets.rollout.environments import load_environment
from rl_assets.rollout.tools import load_tool


def preflight(params: Params, source: str = "params.yaml", keys: list[str] | None = None, root: Path = Path(".")) -> None:
    """Before a run of `keys` (None: the whole graph): the user's code loads, the inputs exist, the models fit their tokenizers."""
    check_user_code(params, source)
    check_run_inputs(params, source, keys, root)


def check_user_code(params: Params, source: str = "params.yaml") -> None:
    """Every reward function, tool and environment that `params` name imports, with the options it is given, and
    evaluation.correctness names one of the reward functions.

    One `ParamsError` lists every problem, each under its key as the params file spells it:

    >>> from rl_assets.core.params_file import parse_params
    >>> params = parse_params({"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]},
    ...                        "rewards": {"functions": [{"name": "nope"}, {"name": "format_regex"}]}})
    >>> check_user_code(params)
    Traceback (most recent call last):
    ...
    rl_assets.core.config.ParamsError: params.yaml: rewards.functions[0].name: rewards.functions: unknown reward 'nope'; ...
    params.yaml: rewards.functions[1].options: reward 'format_regex' needs option 'pattern'
    """
    problems, unloaded = [], False
    for i, function in enumerate(params.rewards.functions):
        try:
            loaded = load_reward_function(function.name)
        except ValueError as error:
            problems.append(f"{source}: rewards.functions[{i}].name: {error}")
            unloaded = True
            continue
        try:
            check_options(function.name, loaded, function.options)
        except ValueError as error:
            problems.append(f"{source}: rewards.functions[{i}].options: {error}")
    # Only once every function loads: a misspelt one ('my_rewards:corect') also misses the score column correctness names,
    # and its own error above is the one to fix.
    if not unloaded and (why := params.evaluation.correctness_problem(params.rewards)):
        problems.append(f"{source}: {why}")
    rollouts = params.rollouts
    for name in rollouts.tools:  # importable, typed, documented
        try:
            load_tool(name)
        except ValueError as error:  # the loaders name their key: "rollouts.tools: unknown tool 'x'"
            problems.append(f"{source}: {error}")
    if episodes := rollouts.episodes:  # builds one environment now: a bad name or option fails before any compute
        name, options = episodes
        try:
            load_environment(name, options)
        except ValueError as error:
            problems.append(f"{source}: {error}")
    if problems:
        raise ParamsError("\n".join(problems))


def check_run_inputs(params: Params, source: str = "params.yaml", keys: list[str] | None = None, root: Path = Path(".")) -> None:
    """Before a run of `keys` (None: the whole graph): the inputs those assets read exist and the models fit their tokenizers.

    `check_sources` for raw_data and reward_model, `rl_assets.core.policy.check_model` for a local model folder
    (prompts and r00/checkpoint read the policy's, reward_model its base's); a `ParamsError` says what is wrong.
    """
    wanted = lambda *names: keys is None or any(name in keys for name in names)  # noqa: E731
    check_sources(params, source, root, [section for section in ("raw_data", "reward_model") if wanted(section)])
    models = ([("model", params.model)] if wanted("prompts", "r00/checkpoint") else []) + (
        [("reward_model", params.reward_model)] if params.reward_model is not None and wanted("reward_model") else [])
    if any(model.name_or_path != "tiny" for _, model in models):  # rl_assets.core.policy imports torch and transformers
        from rl_assets.core.policy import check_model

        for key, model in models:
            check_model(model, source, key)
