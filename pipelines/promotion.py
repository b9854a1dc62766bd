"""promoted_model: after the evaluation, the best checkpoint that passed its guards, if it beats the current one.

Not a DVC stage: what it writes (models/promoted, versions, history.jsonl) depends on the models
promoted before, so it is a decision with a history, not a reproducible output, and DVC would
delete it before each rerun.
"""

from typing import Iterator

from dagster import AssetExecutionContext, AssetKey, MaterializeResult, PipesSubprocessClient, asset

from pipelines.assets import COMPUTE_TAGS
from pipelines.steps import ParamsResource, run_compute


@asset(
    deps=[AssetKey("evaluation")],
    group_name="promotion",
    kinds={"pytorch"},
    pool="gpu",  # may evaluate the current promoted model again when the evaluation changed
    op_tags=COMPUTE_TAGS,
    description="The best evaluated checkpoint whose guards pass, copied to models/promoted/ with a model card, only when it "
                "beats the current promoted model on the same evaluation; models/history.jsonl keeps every promotion and rollback.",
)
def promoted_model(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult]:
    for result in run_compute(context, pipes, params, ["promoted_model"]):
        context.log.info(f"promotion: {getattr(result.metadata['reason'], 'value', result.metadata['reason'])}")
        yield result
