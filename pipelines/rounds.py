"""The round factory: rNN/rollouts -> rNN/rewards -> (rNN/critic, with ppo) -> rNN/checkpoint for N = 1..R, unrolled.

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
    critic = []  # ppo: the value model whose estimates give this round's advantages, and the one this round trains
    if params.train.algorithm == "ppo":
        ppo = params.train.ppo
        parent_critic = (asset_key(f"{round_prefix(n - 1)}/critic") if n > 1 else
                         asset_key("reward_model") if ppo.critic_init == "reward_model" else previous)
        critic = [parent_critic]
        start = f"{round_prefix(n - 1)}/critic" if n > 1 else ("the reward model" if ppo.critic_init == "reward_model" else "r00 with a zero value head")
        critic_spec = AssetSpec(asset_key(f"{prefix}/critic"), deps=[rewards, rollouts, parent_critic, *reference], group_name=prefix,
                                kinds={"pytorch"}, description=f"Round {n}: PPO's value model, {start} fitted to this round's returns "
                                                               f"(GAE, gamma {ppo.gamma}, lambda {ppo.lam}).",
                                **stage_tracking("critic", params))
    specs = [
        AssetSpec(rollouts, deps=[previous, asset_key("prompts")], group_name=prefix, kinds={"parquet"},
                  description=f"Round {n}: G completions per training prompt sampled from {checkpoint_key(n - 1)}, with per-token log-probs.",
                  **stage_tracking("rollouts", params)),
        # The code version hashes the `rewards` section and the reward code (the user's modules included): after
        # editing either, the UI shows this asset as changed and the rollouts as up to date (as `dvc status` does).
        AssetSpec(rewards, deps=[rollouts, *([asset_key("reward_model")] if uses_reward_model(params) else [])], group_name=prefix, kinds={"parquet"},
                  description=f"Round {n}: every rollout scored by the configured reward functions (rescored without resampling).",
                  **stage_tracking("rewards", params)),
        AssetSpec(checkpoint, deps=[rewards, rollouts, previous, *reference, *(c for c in critic if c != previous)], group_name=prefix,
                  kinds={"pytorch"},
                  description=f"Round {n}: {checkpoint_key(n - 1)} updated by {params.train.algorithm} on this round's stored rollouts and rewards.",
                  **stage_tracking("train", params)),
    ]
    if critic:
        specs.insert(2, critic_spec)
    return specs
