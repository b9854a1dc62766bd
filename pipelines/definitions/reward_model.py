"""reward_model: a reward model trained from preference pairs, when params.yaml has a `reward_model` section.

Reward functions named `reward_model` then score with it, and every rNN/rewards depends on it
(rl_assets.core.graph), so retraining it rescores every round without resampling.
"""

from typing import Iterator

from dagster import AssetExecutionContext, AssetsDefinition, MaterializeResult, PipesSubprocessClient, asset

from pipelines.definitions.tracking import stage_tracking
from pipelines.launch.params import ParamsResource, asset_key
from pipelines.launch.resources import compute_tags
from pipelines.launch.steps import run_compute
from rl_assets.core.config import Params


def reward_model_asset(params: Params) -> AssetsDefinition | None:
    """The asset, or None when params configure no reward model."""
    configured = params.reward_model
    if configured is None:
        return None

    @asset(
        name="reward_model",
        key_prefix=asset_key("reward_model").path[:-1],
        group_name="reward_model",
        kinds={"pytorch"},
        pool="gpu",
        op_tags=compute_tags(params.compute),
        description="A sequence-classification reward model trained with TRL's RewardTrainer on chosen/rejected pairs.",
        **stage_tracking("reward_model", params, [configured.preference_data]),
    )
    def reward_model(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult]:
        yield from run_compute(context, pipes, params, ["reward_model"])

    return reward_model
