"""The compute multi-asset: r00/checkpoint, every round's rollouts, rewards and checkpoint, the evaluation and the promotion.

Every output is an asset of its own (its materialization, data version, code version, metadata and
guards), and the one op that writes them can be subset: a run asks for the outputs it needs (all of
them, `r04/*`, or `r03/rewards` alone to rescore), and one child process writes them in flow order
with the models kept loaded (rl_assets.run.resident), reporting each the moment it is done, so the UI
fills in round by round. The op carries the GPU tags and the `gpu` pool, and launches through
torchrun or the k8s executor like any compute step (one child per output when the step uses
several processes).
"""

from typing import Iterator

from dagster import (AssetCheckResult, AssetExecutionContext, DagsterEventType, DataVersion, MaterializeResult, PipesSubprocessClient,
                     multi_asset)

from pipelines.definitions.specs import compute_specs
from pipelines.launch.checks import guard_specs
from pipelines.launch.params import ParamsResource, asset_key
from pipelines.launch.resources import TRAINING_RETRY, compute_tags
from pipelines.launch.steps import run_compute
from rl_assets.core.config import Params
from rl_assets.core.paths import flow_order, output_key


def compute_asset(params: Params):
    """Every output that needs a model, as one op that can be subset; each keeps its own guards as blocking or warning checks."""
    specs = compute_specs(params)

    @multi_asset(
        name="compute",
        specs=specs,
        check_specs=[check for spec in specs for check in guard_specs(spec.key)],
        can_subset=True,
        pool="gpu",
        op_tags=compute_tags(params.compute),
        retry_policy=TRAINING_RETRY,
    )
    def compute(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult | AssetCheckResult]:
        wanted = flow_order([output_key(key.path) for key in context.selected_asset_keys])
        done = done_in_this_run(context, wanted)
        checks = {(c.asset_key, c.name) for c in context.selected_asset_check_keys}
        yield from reported_again(context, [key for key in wanted if key in done], checks)
        todo = [key for key in wanted if key not in done]
        if done:
            context.log.info(f"attempt {context.retry_number + 1}: {len(done)} outputs were written by an earlier attempt of this run "
                             f"(reported again); continuing from {todo[0] if todo else 'nothing left'}")
        for result in run_compute(context, pipes, params, todo) if todo else ():
            if not isinstance(result, AssetCheckResult) or (result.asset_key, result.check_name) in checks:
                yield result

    return compute


def done_in_this_run(context: AssetExecutionContext, keys: list[str]) -> set[str]:
    """Outputs an earlier attempt of this step already materialized in this run (a retry after a crash continues after them)."""
    if context.retry_number == 0:
        return set()
    done = set()
    for key in keys:
        event = context.instance.get_latest_materialization_event(asset_key(key))
        if event is not None and event.run_id == context.run_id:
            done.add(key)
    return done


def reported_again(context: AssetExecutionContext, keys: list[str], checks: set) -> Iterator[MaterializeResult | AssetCheckResult]:
    """The outputs an earlier attempt wrote, reported by this one with their data versions and their guards' verdicts (a step reports
    every output and check it was asked for)."""
    for key in keys:
        materialization = context.instance.get_latest_materialization_event(asset_key(key)).asset_materialization
        yield MaterializeResult(asset_key=materialization.asset_key, metadata={**materialization.metadata, "written_by_an_earlier_attempt": True},
                                data_version=DataVersion(materialization.tags["dagster/data_version"]))
    done = {asset_key(key) for key in keys}
    for event in context.instance.all_logs(context.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        verdict = event.dagster_event.event_specific_data
        if verdict.asset_key in done and (verdict.asset_key, verdict.check_name) in checks:
            yield AssetCheckResult(asset_key=verdict.asset_key, check_name=verdict.check_name, passed=verdict.passed, severity=verdict.severity,
                                   description=verdict.description, metadata=verdict.metadata)
