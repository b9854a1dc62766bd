"""The round factory: rNN/rollouts -> rNN/rewards -> rNN/checkpoint for N = 1..R, unrolled.

Each round depends on the previous round's checkpoint, so the graph stays acyclic and both
Dagster's lineage view and dvc.lock show the whole chain. These are specs: the compute multi-asset
(pipelines/compute.py) writes them.
"""


from dagster import AssetSpec

from pipelines.assets import stage_tracking
from pipelines.params import asset_key
from pipelines.reward_model import uses_reward_model
from rl_assets.core.config import Params
from rl_assets.core.paths import checkpoint_key, round_prefix


def round_specs(n: int, params: Params) -> list[AssetSpec]:
    prefix, previous = round_prefix(n), asset_key(checkpoint_key(n - 1))
    rollouts, rewards, checkpoint = (asset_key(f"{prefix}/{name}") for name in ("rollouts", "rewards", "checkpoint"))
    reference = [asset_key(checkpoint_key(0))] if params.train.beta > 0 and n > 1 else []  # r00 is the KL reference
    return [
        AssetSpec(rollouts, deps=[previous, asset_key("prompts")], group_name=prefix, kinds={"parquet"},
                  description=f"Round {n}: G completions per training prompt sampled from {checkpoint_key(n - 1)}, with per-token log-probs.",
                  **stage_tracking("rollouts", params)),
        # The code version hashes the `rewards` section and the reward code (the user's modules included): after
        # editing either, the UI shows this asset as changed and the rollouts as up to date (as `dvc status` does).
        AssetSpec(rewards, deps=[rollouts, *([asset_key("reward_model")] if uses_reward_model(params) else [])], group_name=prefix, kinds={"parquet"},
                  description=f"Round {n}: every rollout scored by the configured reward functions (rescored without resampling).",
                  **stage_tracking("rewards", params)),
        AssetSpec(checkpoint, deps=[rewards, rollouts, previous, *reference], group_name=prefix, kinds={"pytorch"},
                  description=f"Round {n}: {checkpoint_key(n - 1)} updated by {params.train.algorithm} on this round's stored rollouts and rewards.",
                  **stage_tracking("train", params)),
    ]
