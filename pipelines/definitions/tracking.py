"""What DVC and the UI know about a stage's asset: the params keys and code files it depends on (its DVC deps) and its code version."""

from pathlib import Path

from pipelines.launch.params import written_keys
from rl_assets.core.config import Params


def stage_tracking(stage: str, params: Params, inputs: list[str] | None = None, outputs: list[str] | None = None) -> dict:
    """The `metadata` and `code_version` of a stage's asset: what dvc-sync writes and what the UI compares.

    The metadata name the params keys and code files of the stage (rl_assets.core.stage_table: the declared
    project code and the user's own modules, e.g. reward modules) and its raw inputs: the stage's DVC deps.
    The code version hashes that code's content and the params' effective values, so the UI shows the asset
    stale exactly when `dvc status` shows its stage changed. `outputs`: what it writes besides its table or
    folder (raw_data's images), DVC outs too.
    """
    from rl_assets.core.stage_table import stage_code, stage_params, stage_version

    code = [path for path in stage_code(stage, params) if not Path(path).is_absolute()]  # DVC deps live in the project
    metadata = {"rl_assets/params": written_keys(stage_params(stage, params)), "rl_assets/code": code}
    if inputs:
        metadata["rl_assets/inputs"] = inputs
    if outputs:
        metadata["rl_assets/outputs"] = outputs
    return {"metadata": metadata, "code_version": stage_version(stage, params)}
