"""paths.py: one name per asset across the asset key, the data path and the DVC stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_assets.core.paths import checkpoint_key, data_dir, data_dir_of, dvc_stage_name, output_path, round_prefix


@pytest.mark.parametrize("number,prefix", [(0, "r00"), (3, "r03"), (12, "r12"), (99, "r99")])
def test_round_prefix(number, prefix):
    assert round_prefix(number) == prefix
    assert checkpoint_key(number) == f"{prefix}/checkpoint"


@pytest.mark.parametrize("key,path", [
    ("raw_data", "data/raw_data.parquet"),
    ("prompts", "data/prompts.parquet"),
    ("r01/rollouts", "data/r01/rollouts.parquet"),
    ("r01/rewards", "data/r01/rewards.parquet"),
    ("r01/checkpoint", "data/r01/checkpoint"),
])
def test_output_path(key, path):
    assert output_path(key, data_dir("default")) == Path(path)
    assert output_path(key, data_dir("default", Path("/project"))) == Path("/project") / path
    other = output_path(key, data_dir("examples-gsm8k-params", Path("/project")))  # any other experiment: its own folder
    assert other == Path("/project/data/experiments/examples-gsm8k-params") / Path(path).relative_to("data")


def test_each_checkpoint_names_its_data_folder():
    assert data_dir_of(output_path("r02/checkpoint", data_dir("x"))) == data_dir("x")
    assert data_dir_of(output_path("r00/checkpoint", data_dir("default"))) == Path("data")
    assert data_dir_of(Path("models/experiments/x/promoted")) is None


def test_dvc_stage_name():
    assert dvc_stage_name("r01/rollouts") == "r01-rollouts"
    assert dvc_stage_name("prompts") == "prompts"
