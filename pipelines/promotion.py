"""promoted_model: after the evaluation, the best checkpoint that passed its guards, if it beats the current one.

A spec of the compute multi-asset (pipelines/compute.py): it may evaluate the current promoted model again when the
evaluation changed.

Not a DVC stage: what it writes (models/promoted, versions, history.jsonl) depends on the models
promoted before, so it is a decision with a history, not a reproducible output, and DVC would
delete it before each rerun.
"""

from dagster import AssetSpec

from pipelines.params import asset_key


def promoted_model_spec() -> AssetSpec:
    return AssetSpec(asset_key("promoted_model"), deps=[asset_key("evaluation")], group_name="promotion", kinds={"pytorch"},
                     description="The best evaluated checkpoint whose guards pass, copied to models/promoted/ with a model card, only when it "
                                 "beats the current promoted model on the same evaluation; models/history.jsonl keeps every promotion and rollback.")
