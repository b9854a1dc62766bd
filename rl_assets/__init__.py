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
    are packages now, so their old functions are found under train.policy_gradient and serve.app)."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix("rl_assets.")
        if fullname.startswith("rl_assets.") and old in MOVED:
            raise ModuleNotFoundError(f"No module named {fullname!r}: since rl-assets 0.2 it is rl_assets.{MOVED[old]}", name=fullname)
        return None


if not any(isinstance(finder, _MovedModule) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModule())
