"""The rounds: rNN/rollouts -> rNN/rewards -> rNN/checkpoint for N = 1..R, unrolled, as one resident multi-asset.

Each round depends on the previous round's checkpoint, so the graph stays acyclic and both
Dagster's lineage view and dvc.lock show the whole chain. Every output is an asset of its own (its
materialization, data version, code version, metadata and guards), and the one op that writes them
can be subset: a run asks for the outputs it needs (all of them, `r04/*`, or `r03/rewards` alone
to rescore), and one child process writes them in flow order with the models kept loaded
(rl_assets.resident), reporting each the moment it is done, so the UI fills in round by round.
"""


from typing import Iterator

from dagster import AssetCheckResult, AssetExecutionContext, AssetKey, AssetSpec, DataVersion, MaterializeResult, PipesSubprocessClient, multi_asset

from pipelines.assets import COMPUTE_TAGS, TRAINING_RETRY, stage_tracking
from pipelines.checks import guard_specs
from pipelines.reward_model import uses_reward_model
from pipelines.steps import ParamsResource, load_project_params, run_compute
from rl_assets.paths import checkpoint_key, flow_order, round_prefix


def round_specs(n: int) -> list[AssetSpec]:
    prefix, previous = round_prefix(n), AssetKey(checkpoint_key(n - 1).split("/"))
    params = load_project_params()
    rollouts, rewards, checkpoint = (AssetKey([prefix, name]) for name in ("rollouts", "rewards", "checkpoint"))
    reference = [AssetKey(checkpoint_key(0).split("/"))] if params.train.beta > 0 and n > 1 else []  # r00 is the KL reference
    return [
        AssetSpec(rollouts, deps=[previous, AssetKey("prompts")], group_name=prefix, kinds={"parquet"},
                  description=f"Round {n}: G completions per training prompt sampled from {checkpoint_key(n - 1)}, with per-token log-probs.",
                  **stage_tracking("rollouts", ["seed", "rollouts"])),
        # The code version hashes the `rewards` section and the reward code (the user's modules included): after
        # editing either, the UI shows this asset as changed and the rollouts as up to date (as `dvc status` does).
        AssetSpec(rewards, deps=[rollouts, *([AssetKey("reward_model")] if uses_reward_model() else [])], group_name=prefix, kinds={"parquet"},
                  description=f"Round {n}: every rollout scored by the configured reward functions (rescored without resampling).",
                  **stage_tracking("rewards", ["rewards"])),
        AssetSpec(checkpoint, deps=[rewards, rollouts, previous, *reference], group_name=prefix, kinds={"pytorch"},
                  description=f"Round {n}: {checkpoint_key(n - 1)} updated by {params.train.algorithm} on this round's stored rollouts and rewards.",
                  **stage_tracking("train", ["seed", "train"])),
    ]


def rounds_asset(rounds: int):
    """Every round's outputs as one op that can be subset; each keeps its own guards as blocking or warning checks."""
    specs = [spec for n in range(1, rounds + 1) for spec in round_specs(n)]

    @multi_asset(
        name="rounds",
        specs=specs,
        check_specs=[check for spec in specs for check in guard_specs(spec.key.to_user_string())],
        can_subset=True,
        pool="gpu",
        op_tags=COMPUTE_TAGS,
        retry_policy=TRAINING_RETRY,
    )
    def rounds_op(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult | AssetCheckResult]:
        wanted = flow_order([key.to_user_string() for key in context.selected_asset_keys])
        done = done_in_this_run(context, wanted)
        yield from reported_again(context, [key for key in wanted if key in done])
        checks = {(c.asset_key, c.name) for c in context.selected_asset_check_keys}
        todo = [key for key in wanted if key not in done]
        for result in run_compute(context, pipes, params, todo) if todo else ():
            if not isinstance(result, AssetCheckResult) or (result.asset_key, result.check_name) in checks:
                yield result

    return rounds_op


def done_in_this_run(context: AssetExecutionContext, keys: list[str]) -> set[str]:
    """Outputs an earlier attempt of this step already materialized in this run (a retry after a crash continues after them)."""
    if context.retry_number == 0:
        return set()
    done = set()
    for key in keys:
        event = context.instance.get_latest_materialization_event(AssetKey(key.split("/")))
        if event is not None and event.run_id == context.run_id:
            done.add(key)
    return done


def reported_again(context: AssetExecutionContext, keys: list[str]) -> Iterator[MaterializeResult]:
    """The outputs an earlier attempt wrote, reported by this one with their data versions (a step reports every output it was asked for)."""
    for key in keys:
        materialization = context.instance.get_latest_materialization_event(AssetKey(key.split("/"))).asset_materialization
        yield MaterializeResult(asset_key=materialization.asset_key, metadata={**materialization.metadata, "written_by_an_earlier_attempt": True},
                                data_version=DataVersion(materialization.tags["dagster/data_version"]))
