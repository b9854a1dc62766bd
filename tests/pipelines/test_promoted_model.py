"""The promoted_model asset (a Pipes child running rl_assets.eval.promotion) and the promoted warm start in DVC."""

from __future__ import annotations

import json

from dagster import PipesSubprocessClient, materialize

from conftest import REPO, import_pipelines, python
from ops_support import make_fake_project
from rl_assets.core.checkpoints import read_lineage


def test_promoted_model_asset_promotes_the_best_checkpoint(tmp_path, monkeypatch):
    compute = import_pipelines("pipelines.definitions.compute")
    from pipelines.launch.params import ParamsResource

    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.6, 2: 0.5})
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the child imports this checkout's code from the fake project
    params = ParamsResource(path="params.yaml")
    result = materialize(compute.compute_assets(params.load()), selection=["promoted_model"],
                         resources={"pipes": PipesSubprocessClient(), "params": params})
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    assert metadata["promoted"] is True and metadata["source"] == "r01/checkpoint"
    assert metadata["checkpoint_id"] == read_lineage(root / "data/r01/checkpoint")["checkpoint_id"]
    assert event.materialization.tags["dagster/data_version"] == read_lineage(root / "models/promoted")["checkpoint_id"]
    assert json.loads((root / "models/promoted/model_card.json").read_text())["source"] == "r01/checkpoint"


def test_a_promoted_warm_start_makes_the_promoted_model_an_input_of_the_r00_stage():
    code = ("from pipelines.definitions.code_location import defs; from pipelines.records.dvc import dvc_yaml_text; import yaml; "
            "print(yaml.safe_load(dvc_yaml_text(defs().resolve_asset_graph()))['stages']['r00-checkpoint'])")
    base = python(["-c", code], REPO, timeout=120).stdout
    promoted = python(["-c", code], REPO, timeout=120, RL_ASSETS_SET="promotion.warm_start=promoted").stdout
    assert "models/promoted" not in base and "promotion.warm_start" not in base
    assert "'models/promoted'" in promoted and "'promotion.warm_start'" in promoted
