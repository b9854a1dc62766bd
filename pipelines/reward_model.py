"""reward_model: a reward model trained from preference pairs, when params.yaml has a `reward_model` section.

Reward functions named `reward_model` then score with it, and every rNN/rewards depends on it
(see rounds.py), so retraining it rescores every round without resampling.
"""

from typing import Iterator

from dagster import AssetExecutionContext, AssetsDefinition, MaterializeResult, PipesSubprocessClient, asset

from pipelines.assets import COMPUTE_TAGS, stage_tracking
from pipelines.steps import ParamsResource, asset_key, load_project_params, run_compute


def reward_model_asset() -> AssetsDefinition | None:
    """The asset, or None when params configure no reward model."""
    configured = load_project_params().reward_model
    if configured is None:
        return None

    @asset(
        name="reward_model",
        key_prefix=asset_key("reward_model").path[:-1],
        group_name="reward_model",
        kinds={"pytorch"},
        pool="gpu",
        op_tags=COMPUTE_TAGS,
        description="A sequence-classification reward model trained with TRL's RewardTrainer on chosen/rejected pairs.",
        **stage_tracking("reward_model", [configured.preference_data]),
    )
    def reward_model(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult]:
        yield from run_compute(context, pipes, params, ["reward_model"])

    return reward_model


def uses_reward_model() -> bool:
    """Whether a reward function scores with the trained reward model (its rewards then depend on the asset)."""
    params = load_project_params()
    return params.reward_model is not None and any(f.name == "reward_model" for f in params.rewards.functions)
