"""The in-process assets called directly: raw_data and prompts in a private micro project."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from dagster import DataVersion, MaterializeResult, build_asset_context

from conftest import DVC, copy_project, import_pipelines, micro_params
from rl_assets.core.schemas import read_table
from rl_assets.core.storage import file_hash

GENERATED = micro_params()["raw_data"]["sources"][0]["count"]
STATIC_ROWS = 60  # data/raw/arithmetic_extra.jsonl
SPLITS = ("sft", "rl", "eval")


@pytest.fixture(scope="module")
def materialized(micro_template, tmp_path_factory):
    """raw_data then prompts, called as plain functions with the project's params, cwd = a private copy."""
    assets = import_pipelines("pipelines.definitions.assets")
    from pipelines.launch.params import ParamsResource

    project = copy_project(micro_template, tmp_path_factory.mktemp("assets") / "project")
    params = ParamsResource(path=str(project / "params.yaml"))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.setenv("DAGSTER_HOME", str(project / ".dagster"))
        for name in ("DVC_STAGE", "RL_ASSETS_DVC_COMMIT", "RL_ASSETS_DVC"):
            patch.delenv(name, raising=False)
        results = {}
        for asset in assets.data_assets(params.load()):
            with build_asset_context() as context:
                results[asset.key.to_user_string()] = list(asset(context, params=params))[0]  # then its guards' results
    return project, results


def check_reported(result, path):
    assert isinstance(result, MaterializeResult)
    assert isinstance(result.data_version, DataVersion)
    assert result.data_version.value == file_hash(path)
    assert result.metadata["path"] == f"data/{path.name}"


def test_raw_data_merges_every_source(materialized):
    project, results = materialized
    path = project / "data" / "raw_data.parquet"
    table = read_table(path, "raw_data")
    result = results["raw_data"]
    check_reported(result, path)
    assert table.num_rows == GENERATED + STATIC_ROWS
    assert set(result.metadata) >= {"path", "rows", "rows_per_source"}
    assert result.metadata["rows"] == table.num_rows
    assert result.metadata["rows_per_source"] == {"generator:data/raw/math_problems.json": GENERATED,
                                                   "data/raw/arithmetic_extra.jsonl": STATIC_ROWS}
    hashes = dict(zip(table["source"].to_pylist(), table["source_hash"].to_pylist()))
    assert hashes["data/raw/arithmetic_extra.jsonl"] == file_hash(project / "data/raw/arithmetic_extra.jsonl")
    assert hashes["generator:data/raw/math_problems.json"] == file_hash(project / "data/raw/math_problems.json")


def test_prompts_dedupes_and_splits(materialized):
    project, results = materialized
    path = project / "data" / "prompts.parquet"
    table = read_table(path, "prompts")
    result = results["prompts"]
    check_reported(result, path)
    meta = result.metadata
    splits = Counter(table["split"].to_pylist())
    assert set(meta) >= {"path", "rows", "dropped_duplicates", "dropped_too_long"} | {f"split_{s}" for s in SPLITS}
    assert set(splits) <= set(SPLITS)
    assert meta["rows"] == table.num_rows > 0
    assert {s: meta[f"split_{s}"] for s in SPLITS} == {s: splits[s] for s in SPLITS}
    assert meta["split_eval"] > 0 and meta["split_rl"] > 0
    assert meta["rows"] + meta["dropped_duplicates"] + meta["dropped_too_long"] == GENERATED + STATIC_ROWS
    assert meta["dropped_duplicates"] > 0  # 120 draws from small ranges repeat some problems
    assert len(set(table["prompt_id"].to_pylist())) == table.num_rows


@pytest.mark.skipif(not DVC.exists(), reason=f"DVC is not installed at {DVC}")
def test_direct_materialization_commits_its_dvc_stage_with_the_same_hash(materialized):
    """Outside `dvc repro` an asset records its own stage, and DVC's md5 is the Dagster data version."""
    project, results = materialized
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert set(lock) == {"raw_data", "prompts"}
    for stage in ("raw_data", "prompts"):
        (out,) = lock[stage]["outs"]
        assert out["path"] == f"data/{stage}.parquet"
        assert out["md5"] == results[stage].data_version.value
