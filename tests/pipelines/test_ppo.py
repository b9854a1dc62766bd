"""PPO with a value model through the whole micro pipeline: the rNN/critic assets, their lineage and metadata, the round graph."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from conftest import copy_project, python
from rl_assets.core.checkpoints import checkpoint_id, read_lineage

pytestmark = pytest.mark.e2e

PPO = {"algorithm": "ppo", "minibatch_size": 8, "ppo": {"critic_learning_rate": 1.0e-3, "lam": 0.9}}


@pytest.fixture(scope="module")
def ppo_run(micro_template, tmp_path_factory):
    """A micro project trained two rounds with PPO (one sample per prompt: a value model needs no group), through `rl-assets run`."""
    project = copy_project(micro_template, tmp_path_factory.mktemp("ppo") / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rounds"] = 2
    params["rollouts"]["samples_per_prompt"] = 1
    params["train"].update(PPO)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    done = python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    return project, done.stdout + done.stderr


def test_each_round_writes_a_value_model_that_continues_the_last(ppo_run):
    project, _ = ppo_run
    r00, r01, r02 = (project / f"data/r0{n}/checkpoint" for n in range(3))
    critics = [project / f"data/r0{n}/critic" for n in (1, 2)]
    cards = [read_lineage(c) for c in critics]
    assert all(card["kind"] == "critic" for card in cards)
    assert cards[0]["parent"] == checkpoint_id(r00)  # round 1's value model starts from r00's body
    assert cards[1]["parent"] == cards[0]["checkpoint_id"]
    config = json.loads((critics[0] / "config.json").read_text())
    assert config["id2label"] == {"0": "value"} and config["architectures"][0].endswith("ForTokenClassification")
    for card in cards:
        metrics = card["metrics"]
        assert metrics["steps"] >= 1 and math.isfinite(metrics["value_loss"]) and 0 <= metrics["value_clip_fraction"] <= 1
        assert {"explained_variance", "value_mean", "return_mean"} <= set(metrics)
    assert cards[0]["metrics"]["value_mean"] == 0.0  # a zero head: round 1's advantages are the returns
    # each policy round took its advantages from the value model before it: r00's body in round 1, r01/critic in round 2
    assert read_lineage(r01)["trained_on"]["critic"] == checkpoint_id(r00)
    assert read_lineage(r02)["trained_on"]["critic"] == cards[0]["checkpoint_id"]
    assert read_lineage(r02)["metrics"]["steps"] >= 1


def test_a_critic_loads_as_a_transformers_token_classifier(ppo_run):
    import torch
    from transformers import AutoModelForTokenClassification

    project, _ = ppo_run
    model = AutoModelForTokenClassification.from_pretrained(project / "data/r02/critic")
    with torch.no_grad():
        values = model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits
    assert values.shape == (1, 4, 1) and values.abs().sum() > 0  # trained away from the zero head


def test_a_second_run_has_nothing_to_do(ppo_run):
    project, _ = ppo_run
    done = python(["-m", "pipelines", "run"], project, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    assert "nothing to do" in (done.stdout + done.stderr).lower()
