"""Every train.algorithm runs as the round's training step on the micro pipeline's stored rollouts and rewards."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from conftest import copy_project, python
from rl_assets.core.checkpoints import read_lineage

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("algorithm,settings,expected", [
    ("rloo", [], "trained_rows"),  # a share of equal-reward groups may be 0: it depends on the samples
    ("dpo", ["train.dpo.min_margin=0.01", "train.dpo.batch_size=2", "train.dpo.loss_type=[sigmoid, sft]"], "pairs"),
    ("rft", ["train.rft.min_reward=0.1", "train.rft.batch_size=4"], "kept"),
])
def test_algorithm_trains_the_round_and_records_itself(pipeline_outputs, tmp_path, algorithm, settings, expected):
    project = copy_project(pipeline_outputs, tmp_path / "project")
    overrides = [f"train.algorithm={algorithm}", *settings]
    python(["-m", "rl_assets.run.step", "train", "--round", "1", *sum((["--set", o] for o in overrides), [])], project, timeout=600)
    card = read_lineage(project / "data/r01/checkpoint")
    assert card["algorithm"] == algorithm and card["train"]["algorithm"] == algorithm
    assert card["metrics"][expected] > 0 and card["metrics"]["steps"] > 0 and card["history"]
    parent = load_file(project / "data/r00/checkpoint/model.safetensors")
    trained = load_file(project / "data/r01/checkpoint/model.safetensors")
    assert any((parent[k] != trained[k]).any() for k in parent), "the step did not change the weights"
    AutoModelForCausalLM.from_pretrained(project / "data/r01/checkpoint")  # loads with nothing but transformers
