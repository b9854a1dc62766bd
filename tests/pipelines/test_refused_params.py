"""Params that cannot work are refused before anything is written (issue 25, problem 8)."""

from __future__ import annotations

import pytest

from conftest import python

pytestmark = pytest.mark.e2e


def test_a_group_algorithm_with_one_sample_per_prompt_writes_nothing(micro_copy):
    refused = python(["-m", "pipelines", "run", "--set", "rollouts.samples_per_prompt=1"], micro_copy, timeout=300, check=False)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "rollouts.samples_per_prompt: 1 gives each prompt a group of one" in refused.stderr
    assert not [p for p in (micro_copy / "data").iterdir() if p.name != "raw"]
