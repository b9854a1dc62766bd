"""DVC records the Dagster graph: `dvc.yaml` is generated from the asset graph, one stage per asset.

Each stage's command materializes that asset through Dagster, so `dvc repro`, the UI and a schedule
run the same code. When an asset is materialized outside `dvc repro` (UI, `make run`), the asset
itself runs `dvc commit` for its stage so that `dvc status` stays clean. DVC lives in its own tool
environment (its hydra dependency pins an antlr runtime that breaks Dagster's selection parser),
so it is always called as a command, never imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from rl_assets.paths import EVALUATION_METRICS, EVALUATION_PLOT, dvc_stage_name, output_path
from rl_assets.tracking import ROUND_PLOTS

PYTHON = ".venv/bin/python"


def dvc_executable() -> str | None:
    """$RL_ASSETS_DVC, the project's `.venv-dvc/bin/dvc`, or `dvc` on PATH."""
    candidates = [os.environ.get("RL_ASSETS_DVC"), ".venv-dvc/bin/dvc", shutil.which("dvc")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def record_in_dvc(context, key: str) -> None:
    """Commit the stage of `key` to dvc.lock after a materialization DVC did not drive."""
    if os.environ.get("DVC_STAGE") or os.environ.get("RL_ASSETS_DVC_COMMIT", "1") == "0":
        return  # dvc repro is running this stage and records it itself
    if not Path("dvc.yaml").is_file():
        return
    stage = dvc_stage_name(key)
    if stage not in (yaml.safe_load(Path("dvc.yaml").read_text()) or {}).get("stages", {}):
        context.log.warning(f"dvc.yaml has no stage {stage!r}; run `rl-assets dvc-sync` so DVC tracks this asset")
        return
    dvc = dvc_executable()
    if dvc is None:
        context.log.warning("dvc not found (make setup installs it in .venv-dvc); dvc.lock not updated")
        return
    done = subprocess.run([dvc, "commit", "--force", "--quiet", stage], capture_output=True, text=True)
    if done.returncode:
        context.log.warning(f"dvc commit {stage} failed: {done.stderr.strip() or done.stdout.strip()}")


def stage_spec(key: str, upstream: list[str], params_sections: list[str], code: list[str], extra_deps: list[str]) -> dict:
    """One DVC stage: materialize `key` through Dagster; deps are upstream outputs, code and inputs."""
    outs = [output_path(key).as_posix()]
    stage = {
        "cmd": f"{PYTHON} -m pipelines materialize {key}",
        "deps": sorted(set(code + extra_deps)) + [output_path(u).as_posix() for u in upstream],
        "params": params_sections,
        "outs": outs,
    }
    if key == "evaluation":
        stage["metrics"] = [{EVALUATION_METRICS.as_posix(): {"cache": False}}]
        stage["plots"] = [{EVALUATION_PLOT.as_posix(): {"cache": False}}, {ROUND_PLOTS.as_posix(): {"cache": False, "x": "round", "y": "value"}}]
    return stage


def dvc_yaml_text(asset_graph) -> str:
    """The full dvc.yaml for an asset graph whose nodes carry `rl_assets/params` and `rl_assets/code`."""
    stages = {}
    for asset_key in asset_graph.toposorted_asset_keys:
        node = asset_graph.get(asset_key)
        key = asset_key.to_user_string()
        meta = {name: getattr(value, "value", value) for name, value in node.metadata.items()}
        if "rl_assets/params" not in meta:
            continue  # not a reproducible output (promoted_model), so not a DVC stage
        stages[dvc_stage_name(key)] = stage_spec(
            key,
            upstream=sorted(parent.to_user_string() for parent in node.parent_keys),
            params_sections=list(meta["rl_assets/params"]),
            code=list(meta["rl_assets/code"]),
            extra_deps=list(meta.get("rl_assets/inputs", [])),
        )
    header = "# Generated from the Dagster asset graph by `rl-assets dvc-sync`; do not edit by hand.\n"
    return header + yaml.safe_dump({"stages": stages}, sort_keys=False, width=120)
