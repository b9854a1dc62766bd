"""rl-assets: RL post-training of language models as versioned, rerunnable assets.

The library is grouped by the flow (core, data, rollout, rewards, train, eval, serve, run); it never imports
Dagster, which lives in `pipelines`. Modules of the flat layout before 0.2 fail to import with their new path.
"""

import importlib.abc
import sys

__version__ = "0.2.0"

# Module of the flat layout (rl-assets 0.1) -> where it is now, under rl_assets.
MOVED = {
    "config": "core.config", "paths": "core.paths", "storage": "core.storage", "schemas": "core.schemas",
    "checkpoints": "core.checkpoints", "user_code": "core.user_code", "precision": "core.precision", "sandbox": "core.sandbox",
    "models": "core.policy", "tokenizer": "core.tokenizer", "verify": "core.verify", "import_model": "core.import_model",
    "raw_data": "data.raw_data", "raw_files": "data.raw_files", "raw_generators": "data.raw_generators", "prompts": "data.prompts",
    "rollouts": "rollout.sampling", "rollouts_vllm": "rollout.vllm_sampling", "episodes": "rollout.episodes",
    "environments": "rollout.environments", "tools": "rollout.tools",
    "train": "train.policy_gradient", "advantages": "train.advantages", "losses": "train.losses", "train_state": "train.train_state",
    "preference": "train.preference", "sft": "train.sft", "reward_model": "train.reward_model",
    "evaluation": "eval.evaluation", "guards": "eval.guards", "output_guards": "eval.output_guards", "promotion": "eval.promotion",
    "lineage": "eval.lineage", "reports": "eval.reports",
    "serve": "serve.app", "serve_models": "serve.models", "serve_metrics": "serve.metrics", "health": "serve.health",
    "deployment": "serve.deployment", "generate": "serve.generate",
    "stages": "run.stages", "resident": "run.resident", "loaded": "run.loaded", "stage_code": "core.stage_table",
    "heartbeat": "run.heartbeat", "process": "run.process", "status": "run.status", "compute": "run.step",
    "tracking": "eval.curves", "trackers": "eval.trackers",
}


class _MovedModule(importlib.abc.MetaPathFinder):
    """Asked last, so only for a module that no longer exists: name where it went (`rl_assets.train` and `rl_assets.serve`
    are packages now: `moved_name` names where their old functions went)."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix("rl_assets.")
        if fullname.startswith("rl_assets.") and old in MOVED:
            raise ModuleNotFoundError(f"No module named {fullname!r}: since rl-assets 0.2 it is rl_assets.{MOVED[old]}", name=fullname)
        return None


if not any(isinstance(finder, _MovedModule) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModule())


def moved_name(package: str, name: str):
    """For a package's module `__getattr__`: a name of the 0.1 module the package replaced fails naming its new module.

    The new module's source is read, not imported (it may import torch); any other name is a plain AttributeError.
    """
    import ast
    import importlib.util
    from pathlib import Path

    module = f"rl_assets.{MOVED[package.removeprefix('rl_assets.')]}"
    if not name.startswith("_"):
        source = Path(importlib.util.find_spec(module).origin).read_text()
        defined = {n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if name in defined:
            raise ImportError(f"cannot import name {name!r} from {package!r}: since rl-assets 0.2 it is {module}.{name}", name=package)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

