"""The rl-assets code location: the asset graph in flow order, the job, the executor and resources.

Loads without importing torch, transformers or trl (each UI reload and schedule tick loads it).
"""

from dagster import AssetSelection, Definitions, PipesSubprocessClient, define_asset_job, multiprocess_executor

from pipelines.assets import base_checkpoint, evaluation_asset, prompts, raw_data
from pipelines.rounds import round_assets
from pipelines.steps import ParamsResource, load_project_params

ROUNDS = load_project_params().rounds

assets = [raw_data, prompts, base_checkpoint]
for n in range(1, ROUNDS + 1):
    assets += round_assets(n)
assets.append(evaluation_asset(ROUNDS))

rl_pipeline = define_asset_job("rl_pipeline", selection=AssetSelection.all(), description="raw data to evaluated checkpoints, every round.")

defs = Definitions(
    assets=assets,
    jobs=[rl_pipeline],
    executor=multiprocess_executor,
    resources={"pipes": PipesSubprocessClient(), "params": ParamsResource()},
)
