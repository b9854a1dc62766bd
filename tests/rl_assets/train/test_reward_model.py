"""reward_model.py (training with TRL's RewardTrainer) and rewards/reward_model.py (scoring with any
sequence-classification folder): one tiny model trained once for the module."""

from __future__ import annotations

import json

import pytest

from rl_assets.core.config import RewardModelParams, RewardsParams, TinyModelParams
from rl_assets.train.reward_model import read_preferences, train_reward_model
from rl_assets.rewards import reward_model, score_rollouts

from rl_assets_support import rollouts_table

TINY = TinyModelParams(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
# Bare answers are preferred over hedged ones: learnable by a 1-layer model in a few dozen steps.
PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": f"maybe {a + b + a % 3}?"} for a in range(8) for b in range(8)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reward_model")
    data = folder / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    params = RewardModelParams(preference_data=str(data), tiny=TINY, max_steps=30, batch_size=16, learning_rate=1e-2)
    metrics = train_reward_model(params, seed=0, output=folder / "model")
    return folder / "model", metrics


@pytest.mark.parametrize("lines,message", [
    (['{"chosen": "a"}'], ":1: a pair is"),
    (['{"chosen": "a", "rejected": "b"}', "not json"], ":2: not JSON"),
    (['{"chosen": "a", "rejected": 3}'], ":1: a pair is"),
    (['{"chosen": "a", "rejected": "b", "score": 1}'], ":1: a pair is"),
    (["", "  "], ": no preference pairs"),
])
def test_read_preferences_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"^{path}{message}"):
        read_preferences(path)


def test_read_preferences_with_and_without_prompt(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"chosen": "a", "rejected": "b"}\n\n{"prompt": "q", "chosen": "c", "rejected": "d"}\n')
    assert read_preferences(path) == [{"chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "c", "rejected": "d"}]


def test_training_learns_the_preferences(trained):
    folder, metrics = trained
    assert metrics["pairs"] == len(PAIRS) and metrics["steps"] == 30
    assert metrics["loss_last"] < metrics["loss_first"]
    assert metrics["pair_accuracy"] >= 0.95 > metrics["pair_accuracy_before"]
    card = json.loads((folder / "lineage.json").read_text())
    assert card["algorithm"] == "reward_model" and card["parent"] == "tiny" and card["metrics"]["pair_accuracy"] == metrics["pair_accuracy"]


def test_the_folder_loads_as_a_plain_sequence_classifier(trained):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(trained[0])
    assert model.config.num_labels == 1


def test_scores_prefer_chosen_and_follow_temperature_and_batching(trained):
    folder = str(trained[0])
    prompts = [p["prompt"] for p in PAIRS]
    chosen = reward_model([p["chosen"] for p in PAIRS], prompt=prompts, path=folder)
    rejected = reward_model([p["rejected"] for p in PAIRS], prompt=prompts, path=folder)
    assert sum(c > r for c, r in zip(chosen, rejected)) / len(PAIRS) == pytest.approx(trained[1]["pair_accuracy"])
    one_by_one = reward_model([p["chosen"] for p in PAIRS], prompt=prompts, path=folder, batch_size=1)
    assert one_by_one == pytest.approx(chosen, abs=1e-5)  # padding in a batch does not change a score
    halved = reward_model([p["chosen"] for p in PAIRS], prompt=prompts, path=folder, temperature=2.0)
    assert halved == pytest.approx([c / 2 for c in chosen])
    as_in_trl = reward_model(completions=[p["chosen"] for p in PAIRS], prompts=prompts, completion_ids=[[]] * len(PAIRS), path=folder)
    assert as_in_trl == pytest.approx(chosen)  # GRPOTrainer's keywords: prompts, completions, completion_ids
    bound = sorted(abs(c) for c in chosen)[len(chosen) // 2]  # the median magnitude: some scores lie beyond it
    clipped = reward_model([p["chosen"] for p in PAIRS], prompt=prompts, path=folder, clip=bound)
    assert clipped == pytest.approx([min(max(c, -bound), bound) for c in chosen]) and clipped != pytest.approx(chosen)


@pytest.mark.parametrize("options,error,message", [
    ({"path": "does/not/exist"}, FileNotFoundError, "no reward model folder"),
    ({"temperature": 0.0}, ValueError, "temperature must be > 0"),
    ({"clip": 0.0}, ValueError, "clip must be > 0"),
])
def test_scoring_errors(trained, options, error, message):
    with pytest.raises(error, match=message):
        reward_model(["1"], prompt=["1+0="], **{"path": str(trained[0]), **options})


def test_score_rollouts_with_the_reward_model_and_its_options(trained):
    table = rollouts_table([{"prompt_id": "p", "sample_idx": i, "prompt": "3+4=", "completion": c} for i, c in enumerate(["7", "9"])])
    params = RewardsParams(functions=[{"name": "reward_model", "options": {"path": str(trained[0]), "temperature": 0.5}}])
    scores = score_rollouts(table, params, "h")["score_reward_model"].to_pylist()
    assert scores == pytest.approx(reward_model(["7", "9"], prompt=["3+4="] * 2, path=str(trained[0]), temperature=0.5))
    assert scores[0] > scores[1]
