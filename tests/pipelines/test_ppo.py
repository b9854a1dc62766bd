"""PPO with a value model through the whole micro pipeline: the rNN/critic assets, their lineage and metadata, the round graph."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dagster import AssetKey, DagsterInstance

from conftest import copy_project, python
from rl_assets.core.checkpoints import checkpoint_id, read_lineage
from rl_assets.core.paths import flow_order
from rl_assets.core.storage import content_hash

pytestmark = pytest.mark.e2e

PPO = {"algorithm": "ppo", "minibatch_size": 8, "ppo": {"critic_learning_rate": 1.0e-3, "lam": 0.9}}


ROUND_KEYS = [f"r{n:02d}/{name}" for n in (1, 2) for name in ("rollouts", "rewards", "checkpoint", "critic")]


def ppo_project(micro_template, folder):
    """The micro project with two PPO rounds (one sample per prompt: a value model needs no group)."""
    project = copy_project(micro_template, folder / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rounds"] = 2
    params["rollouts"]["samples_per_prompt"] = 1
    params["train"].update(PPO)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    return project


@pytest.fixture(scope="module")
def ppo_run(micro_template, tmp_path_factory):
    """Two PPO rounds through `rl-assets run`: one resident child writes every round's outputs."""
    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo"))
    done = python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    return project, done.stdout + done.stderr


def ids(project) -> dict[str, str]:
    return {key: checkpoint_id(project / "data" / key) if key.endswith(("checkpoint", "critic")) else content_hash(project / "data" / f"{key}.parquet")
            for key in ROUND_KEYS}


def test_one_output_at_a_time_equals_the_resident_run_and_the_resident_run_keeps_the_value_model(ppo_run, micro_template, tmp_path_factory):
    resident, _ = ppo_run
    single = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-single"))
    python(["-m", "pipelines", "materialize", "raw_data", "prompts", "r00/checkpoint"], single, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    for key in flow_order(ROUND_KEYS):  # each in its own child: every model from disk
        python(["-m", "pipelines", "materialize", key], single, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    assert ids(resident) == ids(single)
    with DagsterInstance.from_config(str(resident / ".dagster")) as instance:
        loads = {key: instance.get_latest_materialization_event(AssetKey(key.split("/"))).asset_materialization.metadata["models_loaded_from_disk"].value
                 for key in ROUND_KEYS if not key.endswith("rewards")}
    # round 1's policy step starts the value model from r00 (one load); from then on it stays in memory, trained in place.
    # Each policy step also loads r00 for its KL metric: with beta 0 the reference is not kept through the next sampling.
    assert loads == {"r01/rollouts": 0, "r01/checkpoint": 2, "r01/critic": 0, "r02/rollouts": 0, "r02/checkpoint": 1, "r02/critic": 0}


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


def test_generate_prints_each_tokens_probability_and_value_and_the_predicted_reward(ppo_run):
    project, _ = ppo_run
    done = python(["-m", "pipelines", "generate", "--checkpoint", "r02", "--values", "--max-new-tokens", "4", "3+4="], project, timeout=300)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert "r02/critic" in done.stderr  # the round's own value model
    assert len(row["tokens"]) == len(row["token_probabilities"]) == len(row["values"]) >= 1
    assert all(0 < p <= 1 for p in row["token_probabilities"]) and all(math.isfinite(v) for v in row["values"])
    assert row["predicted_reward"] == row["values"][0]
    missing = python(["-m", "pipelines", "generate", "--checkpoint", "r00", "--values", "3+4="], project, timeout=300, check=False)
    assert missing.returncode != 0 and "no value model" in missing.stderr and "r00/critic" in missing.stderr
