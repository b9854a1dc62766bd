"""The stage table: every stage of the flow in one place, read by the runner, the Dagster specs, the DVC stages and the lineage.

A stage writes its outputs (asset keys; `rNN/...` in every round 1..R) from its params (sections or dotted
keys: the output's params hash, its DVC params, its Dagster code version) and its code: the files declared
here (a folder counts with every .py file in it, a module with its packages' __init__.py), plus the user's
modules that params name, for the stages that call the reward functions. Declared, not inferred: moving an
import never changes what is stale. tests/rl_assets/core/test_stage_table.py checks that each stage's code
covers every project module its runner imports. The content hashes of that code go into the Dagster code
version and into the output's lineage, so editing any of these files shows the stage changed in
`dvc status` and stale in the UI, and nothing upstream.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rl_assets.core.config import EPISODE_KEYS
from rl_assets.core.storage import file_hash

PACKAGE = "rl_assets"
PROJECT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Stage:
    """One stage: the function that writes its outputs, and what shapes them."""

    runner: str  # file:function; a compute stage's is (params, round_number, root, device, loaded) -> (metadata, path written)
    outputs: tuple[str, ...]  # asset keys; rNN/<name> in every round 1..R
    params: tuple[str, ...]  # params sections or dotted keys
    code: tuple[str, ...]  # files under rl_assets/, or folders (every .py file in them)
    compute: bool = True  # runs in a compute step (raw_data and prompts run in the Dagster asset body)
    distributed: bool = False  # may run in several processes under torchrun
    uses_rewards: bool = False  # calls the configured reward functions: their modules are its code too
    kind: str = "table"  # what each output is: a Parquet "table", or a "model" folder (save_pretrained and its lineage card)
    heldout: bool = False  # a policy checkpoint: evaluated on the held-out prompts by the step that writes it


_CONFIG = ("core/algorithms.py", "core/config.py", "core/params_file.py", "core/run_params.py", "core/sections.py")  # params.yaml: every stage reads it
# What every compute step runs through: the stage functions, the loaded models, the shared core and the UI text.
_RUNNER = ("run/stages.py", "run/loaded.py", *_CONFIG, "core/schemas.py", "core/storage.py", "core/paths.py",
           "core/checkpoints.py", "core/precision.py", "core/stage_table.py", "core/graph.py", "eval/reports.py")
_POLICY = ("core/policy.py", "core/tokenizer.py", "core/import_model.py", "core/verify.py", "core/vision.py", "data/prompts.py",
           "data/images.py", "data/raw_files.py")  # a VLM's images are read where they were stored (images.py names bad rows with raw_files')
_EPISODES = ("rollout/environments.py", "rollout/episodes.py", "rollout/generation.py", "rollout/tools.py", "core/sandbox.py", "core/user_code.py")

STAGE_TABLE = {
    "raw_data": Stage("data/raw_data.py:load_raw_data", ("raw_data",), ("seed", "raw_data"),
                      (*_CONFIG, "core/schemas.py", "core/storage.py", "data/images.py", "data/raw_data.py", "data/raw_files.py",
                       "data/raw_generators.py"),
                      compute=False),
    "prompts": Stage("data/prompts.py:build_prompts", ("prompts",), ("prompts", "model.name_or_path", "model.vision"),
                     (*_CONFIG, "core/schemas.py", "core/storage.py", "core/tokenizer.py", "data/images.py", "data/prompts.py",
                      "data/raw_files.py"), compute=False),
    # with sft.demonstration the rollouts' tools or environment answer the demonstrations
    "sft": Stage("run/stages.py:run_sft", ("r00/checkpoint",), ("seed", "model", "sft", *EPISODE_KEYS[:3]),
                 (*_RUNNER, *_POLICY, *_EPISODES, "train/sft.py", "eval/promotion.py", "eval/guards.py", "eval/stats.py"), distributed=True, kind="model", heldout=True),
    # trained from its own preference file before the rounds, whose rewards (and PPO's first critic) may read it
    "reward_model": Stage("train/reward_model.py:run_reward_model", ("reward_model",), ("seed", "reward_model"),
                          (*_CONFIG, "core/schemas.py", "core/storage.py", "core/checkpoints.py", "core/precision.py", "core/paths.py",
                           "core/stage_table.py", *_POLICY, "core/sandbox.py", "core/user_code.py", "rewards/", "train/reward_model.py",
                           "train/sft.py"), kind="model"),
    "rollouts": Stage("run/stages.py:run_rollouts", ("rNN/rollouts",), ("seed", "rollouts"),
                      (*_RUNNER, *_POLICY, *_EPISODES, "core/logprobs.py", "rollout/")),
    "rewards": Stage("run/stages.py:run_rewards", ("rNN/rewards",), ("rewards",),
                     (*_RUNNER, "core/sandbox.py", "core/user_code.py", "rewards/"), uses_rewards=True),
    "train": Stage("run/stages.py:run_train", ("rNN/checkpoint",), ("seed", "train", "guards.kl_rows"),
                   (*_RUNNER, *_POLICY, "core/logprobs.py", "train/policy_gradient.py", "train/staleness.py", "train/advantages.py",
                    "train/losses.py", "train/train_state.py", "train/preference.py", "train/sft.py", "train/critic.py", "run/hardware.py"), distributed=True, kind="model", heldout=True),
    # ppo only: the value model, fitted to the round's returns. After train in a round: both read the parent's estimates,
    # which a resident process then holds for the policy's advantages before this stage trains them in place
    "critic": Stage("run/stages.py:run_critic", ("rNN/critic",), ("seed", "train"),
                    (*_RUNNER, *_POLICY, "core/logprobs.py", "train/critic.py", "train/policy_gradient.py", "train/advantages.py",
                     "train/losses.py", "train/train_state.py"), distributed=True, kind="model"),
    "evaluation": Stage("run/stages.py:run_evaluation", ("evaluation",), ("seed", "rounds", "evaluation", "rewards", *EPISODE_KEYS),
                        (*_RUNNER, *_POLICY, *_EPISODES, "eval/evaluation.py", "eval/curves.py", "eval/guards.py", "eval/output_guards.py",
                         "eval/stats.py", "rewards/"), uses_rewards=True),
    # Not a DVC stage: what it writes depends on the models promoted before (a decision with a history).
    "promote": Stage("eval/promotion.py:run_promotion", ("promoted_model",), ("promotion",),
                     (*_RUNNER, *_POLICY, *_EPISODES, "eval/", "rewards/", "data/"), kind="model"),
}
COMPUTE_STAGES = tuple(name for name, stage in STAGE_TABLE.items() if stage.compute)
ROUND_STAGES = tuple(name for name, stage in STAGE_TABLE.items() if any(key.startswith("rNN/") for key in stage.outputs))


def runner(stage: str):
    """The function that writes a compute stage's outputs, imported from its `file:function` in the table."""
    location, _, name = STAGE_TABLE[stage].runner.partition(":")
    return getattr(importlib.import_module(f"{PACKAGE}." + location.removesuffix(".py").replace("/", ".")), name)


def stage_params(stage: str, params) -> list[str]:
    """The params keys that shape `stage`'s output under `params` (sft also reads the promoted model's choice when it starts there,
    rollouts the correctness check when they choose prompts by pass rate)."""
    keys = list(STAGE_TABLE[stage].params)
    if stage == "sft" and params.promotion.warm_start == "promoted":
        keys.append("promotion.warm_start")
    if stage == "rollouts" and params.rollouts.selection.kind != "uniform":  # pass rates are counted by the task's check
        keys.append("evaluation.correctness")
    return keys


def project_code(stage: str) -> list[str]:
    """The files of `stage`'s declared code with the __init__.py of their packages: as the project at the working directory
    has them (`rl_assets/...`, what DVC lists and hashes), or absolute when the package is installed elsewhere.

    >>> project_code("prompts")
    ['rl_assets/__init__.py', 'rl_assets/core/__init__.py', 'rl_assets/core/algorithms.py', 'rl_assets/core/config.py', 'rl_assets/core/params_file.py', 'rl_assets/core/run_params.py', 'rl_assets/core/schemas.py', 'rl_assets/core/sections.py', 'rl_assets/core/storage.py', 'rl_assets/core/tokenizer.py', 'rl_assets/data/__init__.py', 'rl_assets/data/images.py', 'rl_assets/data/prompts.py', 'rl_assets/data/raw_files.py']
    """
    files = _expanded(STAGE_TABLE[stage].code)
    if (Path.cwd() / PACKAGE).is_dir():  # the project's own copy of the code (a run's cwd is its root)
        return list(files)
    return [(PROJECT / path).as_posix() for path in files]


@lru_cache(maxsize=64)
def _expanded(code: tuple[str, ...]) -> tuple[str, ...]:
    package = PROJECT / PACKAGE
    files = set()
    for entry in code:
        path = package / entry
        if entry.endswith("/"):
            if not path.is_dir():
                raise ValueError(f"stage_table: {PACKAGE}/{entry} is not a folder")
            found = sorted(path.rglob("*.py"))
        elif path.is_file():
            found = [path]
        else:
            raise ValueError(f"stage_table: {PACKAGE}/{entry} does not exist")
        for file in found:
            files.add(file)
            files.update(parent / "__init__.py" for parent in file.parents if parent == package or package in parent.parents)
    return tuple(sorted(file.relative_to(PROJECT).as_posix() for file in files))


def user_module_file(name: str) -> str | None:
    """The source file of the module in a `module:function` reference, found without importing it (None: built in)."""
    if ":" not in name:
        return None
    module = name.partition(":")[0]
    if module.split(".")[0] == PACKAGE:
        return None  # part of the project code, declared in the table
    relative = Path(*module.split("."))
    for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):  # in the project, as `python -m` in its root imports it
        if candidate.is_file():
            return candidate.as_posix()
    if os.getcwd() not in sys.path:  # as load_reward_function looks for it
        sys.path.append(os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None  # the preflight reports an unloadable module with its own message
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    return _relative_to(spec.origin, os.getcwd())


@lru_cache(maxsize=4096)  # every asset of a stage lists the same files; resolving each costs a stat per path component
def _relative_to(path: str, cwd: str) -> str:
    """`path` relative to `cwd` when inside it, else absolute."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path(cwd).resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def stage_code(stage: str, params) -> list[str]:
    """Every source file that shapes `stage`'s output under `params`: the declared project code, then the user's modules."""
    files = set(project_code(stage))
    if STAGE_TABLE[stage].uses_rewards:
        files.update(f for f in (user_module_file(function.name) for function in params.rewards.functions) if f)
    return sorted(files)


def code_hashes(files: list[str]) -> dict[str, str]:
    """{path: md5 of its content}: what the output records about the code that made it."""
    hashes = {}
    for path in files:
        try:
            info = os.stat(path)
        except OSError:
            hashes[path] = "missing"
            continue
        hashes[path] = _file_md5(path, info.st_mtime_ns, info.st_size)
    return hashes


@lru_cache(maxsize=1024)
def _file_md5(path: str, mtime_ns: int, size: int) -> str:  # every asset of a stage hashes the same files
    return file_hash(path)


def stage_version(stage: str, params) -> str:
    """The Dagster code version of a stage: its code's content and its params' effective values."""
    blob = json.dumps({"code": code_hashes(stage_code(stage, params)), "params": _sections(params, stage_params(stage, params))},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sections(params, keys: list[str]) -> dict:
    """{key: effective value} for params keys such as `train` or `model.name_or_path`."""
    values, found = params.model_dump(mode="json"), {}
    for key in keys:
        value = values
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        found[key] = value
    return found


def stage_lineage(stage: str, params) -> dict:
    """What an output records about how it was made: the experiment, its params' values and its code's hashes."""
    return {"experiment": params.experiment, "params": _sections(params, stage_params(stage, params)),
            "code": {stage: code_hashes(stage_code(stage, params))}}
