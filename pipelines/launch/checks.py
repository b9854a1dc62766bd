"""Asset checks: the guards of rl_assets.eval.output_guards on every output, blocking where a failure must stop the run.

Each asset declares its guards as check specs and evaluates them in its own step, right after
writing its output: no step of their own, so a round is three steps, not six. A compute child
evaluates them itself and stops at a failed blocking guard before writing anything more
(`rl_assets.run.resident`); the parent turns what it reported into check results (`check_result`). An
in-process asset evaluates them here (`guarded`). Either way a blocking guard that fails is reported
with ERROR severity and then fails the step with `Failure(allow_retries=False)` (a retry would
write the same output and fail the same way), so Dagster skips everything downstream in the same
run: a checkpoint whose KL to the reference is over `guards.kl_max` stops every later round, the
evaluation and the promotion. Regression guards only warn (ranking is promotion's job).
"""

from __future__ import annotations

from typing import Iterator

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, Failure, MaterializeResult

from pipelines.launch.pipes_child import GUARD_DESCRIPTION
from rl_assets.core.config import Params
from rl_assets.eval.output_guards import GuardFailed, GuardResult, evaluate_guards, guard_table, stop_if_blocked
from rl_assets.core.paths import asset_key_path, output_key


def guard_specs(asset_key: AssetKey) -> list[AssetCheckSpec]:
    """The check specs an asset declares: one per guard of its output, blocking where a failure must stop the run."""
    return [AssetCheckSpec(name, asset=asset_key, blocking=blocking, description=text)
            for name, (blocking, text) in guard_table(output_key(asset_key.path)).items()]


def _check_result(key: str, result: GuardResult, experiment: str) -> AssetCheckResult:
    return AssetCheckResult(asset_key=AssetKey(asset_key_path(key, experiment)), check_name=result.name, passed=result.passed,
                            description=result.description, metadata=result.metadata,
                            severity=AssetCheckSeverity.ERROR if result.blocking else AssetCheckSeverity.WARN)


def check_result(reported: AssetCheckResult) -> AssetCheckResult:
    """A guard's result as a Pipes child reported it, with its verdict text as the description."""
    metadata = dict(reported.metadata or {})
    description = metadata.pop(GUARD_DESCRIPTION, None)
    return AssetCheckResult(asset_key=reported.asset_key, check_name=reported.check_name, passed=reported.passed,
                            severity=reported.severity, metadata=metadata, description=getattr(description, "value", description))


def guarded(key: str, params: Params, result: MaterializeResult) -> Iterator[MaterializeResult | AssetCheckResult]:
    """Yield the asset's materialization with its guards' results; then fail, without retries, if a blocking one failed."""
    results = evaluate_guards(key, params)
    yield result
    yield from (_check_result(key, r, params.experiment) for r in results)
    try:
        stop_if_blocked(key, results)
    except GuardFailed as error:
        raise Failure(description=str(error), metadata={"failed_guards": [r.name for r in results if r.blocking and not r.passed]},
                      allow_retries=False) from None
