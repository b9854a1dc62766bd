"""The round factory: rNN/rollouts -> rNN/rewards -> rNN/checkpoint for N = 1..R, unrolled.

Each round depends on the previous round's checkpoint, so the graph stays acyclic and both
Dagster's lineage view and dvc.lock show the whole chain.
"""


from typing import Iterator

from dagster import AssetExecutionContext, AssetKey, AssetsDefinition, MaterializeResult, PipesSubprocessClient, asset

from pipelines.assets import COMPUTE_TAGS, TRAINING_RETRY, stage_tracking
from pipelines.checks import guard_specs
from pipelines.reward_model import uses_reward_model
from pipelines.steps import ParamsResource, load_project_params, materialized, run_compute
from rl_assets.paths import checkpoint_key, output_path, round_prefix


def round_assets(n: int) -> list[AssetsDefinition]:
    prefix = round_prefix(n)
    previous = AssetKey(checkpoint_key(n - 1).split("/"))

    @asset(
        key=AssetKey([prefix, "rollouts"]),
        deps=[previous, AssetKey("prompts")],
        group_name=prefix,
        kinds={"parquet"},
        pool="gpu",
        op_tags=COMPUTE_TAGS,
        description=f"Round {n}: G completions per training prompt sampled from {checkpoint_key(n - 1)}, with per-token log-probs.",
        **stage_tracking("rollouts", ["seed", "rollouts"]),
        check_specs=guard_specs(f"{prefix}/rollouts"),
    )
    def rollouts(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult]:
        yield from run_compute(context, pipes, params, "rollouts", n)

    # The code version hashes the `rewards` section and the reward code (the user's modules included): after
    # editing either, the UI shows this asset as changed and the rollouts as up to date (as `dvc status` does);
    # once it is rescored, what follows shows as stale.
    @asset(
        key=AssetKey([prefix, "rewards"]),
        deps=[rollouts, *([AssetKey("reward_model")] if uses_reward_model() else [])],
        group_name=prefix,
        kinds={"parquet"},
        description=f"Round {n}: every rollout scored by the configured reward functions (rescored without resampling).",
        **stage_tracking("rewards", ["rewards"]),
        check_specs=guard_specs(f"{prefix}/rewards"),
    )
    def rewards(context: AssetExecutionContext, params: ParamsResource) -> Iterator[MaterializeResult]:
        from rl_assets.rewards import score_rollouts, summarize_rewards
        from rl_assets.schemas import read_table, write_table
        from rl_assets.stage_code import stage_lineage
        from rl_assets.storage import file_hash

        p = params.load()
        source = output_path(f"{prefix}/rollouts")
        table = score_rollouts(read_table(source, "rollouts"), p.rewards, file_hash(source))
        path = write_table(table, output_path(f"{prefix}/rewards"), table.schema, "rewards",  # keeps each score's weight
                           lineage=stage_lineage("rewards", p, ["rewards"]))
        yield from materialized(context, params, path, summarize_rewards(table, p.rollouts.samples_per_prompt))

    reference = [AssetKey(checkpoint_key(0).split("/"))] if load_project_params().train.beta > 0 and n > 1 else []

    @asset(
        key=AssetKey([prefix, "checkpoint"]),
        deps=[rewards, rollouts, previous, *reference],  # r00 is the KL reference when train.beta > 0
        group_name=prefix,
        kinds={"pytorch"},
        pool="gpu",
        op_tags=COMPUTE_TAGS,
        retry_policy=TRAINING_RETRY,
        description=f"Round {n}: {checkpoint_key(n - 1)} updated by {load_project_params().train.algorithm} on this round's stored rollouts and rewards.",
        **stage_tracking("train", ["seed", "train"]),
        check_specs=guard_specs(checkpoint_key(n)),
    )
    def checkpoint(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult]:
        yield from run_compute(context, pipes, params, "train", n)

    return [rollouts, rewards, checkpoint]
