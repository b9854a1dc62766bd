"""paths.py: one name per asset across the asset key, the data path and the DVC stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_assets.paths import checkpoint_key, dvc_stage_name, output_path, round_prefix


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
    assert output_path(key) == Path(path)
    assert output_path(key, Path("/project")) == Path("/project") / path


def test_dvc_stage_name():
    assert dvc_stage_name("r01/rollouts") == "r01-rollouts"
    assert dvc_stage_name("prompts") == "prompts"
