"""promotion.py: promote the best checkpoint that passes its guards only when it beats the promoted one; roll back."""

from __future__ import annotations

import json

import pytest
import yaml

from ops_support import GOOD_METRICS, make_fake_project
from rl_assets.eval import promotion
from rl_assets.core.checkpoints import read_lineage, weights_hash
from rl_assets.core.params_file import load_params


def promote_once(root, monkeypatch):
    monkeypatch.chdir(root)  # lineage traces and outputs are relative to the project
    return promotion.run_promotion(load_params(root / "params.yaml"), None, root, "cpu")[0]


def test_first_promotion_copies_the_best_checkpoint_with_a_card_and_history(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.6, 2: 0.5})
    metadata = promote_once(root, monkeypatch)
    best = read_lineage(root / "data/r01/checkpoint")["checkpoint_id"]
    promoted = root / "models/promoted"
    assert metadata["promoted"] and metadata["source"] == "r01/checkpoint" and metadata["checkpoint_id"] == best
    assert weights_hash(promoted) == best and read_lineage(promoted)["checkpoint_id"] == best  # loads like any checkpoint
    card = json.loads((promoted / "model_card.json").read_text())
    assert card["evaluation"]["sampled"] == 0.6 and card["metrics"] == GOOD_METRICS and card["previous"] is None
    assert card["rewards"]["functions"][0]["name"] == "arithmetic_answer"
    assert [r["path"] for r in card["data"]["raw"]] == ["data/raw/extra.jsonl"]
    assert "r01/checkpoint" in (promoted / "README.md").read_text()
    assert metadata["rounds"]["raw_value"].startswith("![metrics by round](data:image/png;base64,")
    assert [e["event"] for e in promotion.history(root / "models")] == ["promote"]
    assert weights_hash(root / "models/versions" / best) == best


def test_a_checkpoint_that_fails_a_guard_is_never_promoted(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.9}, metrics={2: {**GOOD_METRICS, "kl": 0.5}})
    metadata = promote_once(root, monkeypatch)
    assert metadata["source"] == "r01/checkpoint"
    assert "kl_within_limit" in metadata["candidates"]["raw_value"]


def test_only_a_better_model_replaces_the_promoted_one_and_rollback_restores_it(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    first = promote_once(root, monkeypatch)["checkpoint_id"]
    again = promote_once(root, monkeypatch)
    assert not again["promoted"] and "already" in again["reason"]

    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.45, 2: 0.5}, seed=1)  # retrained: new weights, no better
    kept = promote_once(root, monkeypatch)
    assert not kept["promoted"] and kept["checkpoint_id"] == first and kept["previous_sampled_accuracy"] == 0.5

    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.45, 2: 0.7}, seed=2)  # retrained and better
    better = promote_once(root, monkeypatch)
    assert better["promoted"] and better["checkpoint_id"] != first
    assert json.loads((root / "models/promoted/model_card.json").read_text())["previous"] == first

    event = promotion.rollback(root / "models")
    assert event == {"event": "rollback", "checkpoint_id": first, "replaced": better["checkpoint_id"], "experiment": "default"}
    assert weights_hash(root / "models/promoted") == first
    assert [e["event"] for e in promotion.history(root / "models")] == ["promote", "promote", "rollback"]
    with pytest.raises(ValueError, match="nothing to roll back to"):
        promotion.rollback(root / "models")


def write_experiment(root, name: str, **promotion_keys) -> None:
    """Make the project's params belong to experiment `name` (other data, in the issue's story)."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["experiment"] = name
    if promotion_keys:
        params["promotion"] = {**params.get("promotion", {}), **promotion_keys}
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def test_another_experiment_promotes_into_its_own_directory_and_leaves_the_default_one(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    first = promote_once(root, monkeypatch)["checkpoint_id"]
    make_fake_project(tmp_path, sampled={0: 0.1, 1: 0.2, 2: 0.3}, seed=1, experiment="word-problems")  # in its own data folder
    other = promote_once(root, monkeypatch)
    assert other["promoted"] and other["checkpoint_id"] != first
    assert weights_hash(root / "models/promoted") == first  # the default experiment's model is untouched
    own = root / "models/experiments/word-problems"
    assert weights_hash(own / "promoted") == other["checkpoint_id"]
    assert json.loads((own / "promoted/model_card.json").read_text())["experiment"] == "word-problems"
    assert [e["experiment"] for e in promotion.history(own)] == ["word-problems"]
    assert [e["experiment"] for e in promotion.history(root / "models")] == ["default"]
    card = json.loads((own / "promoted/model_card.json").read_text())
    assert card["data"]["prompts"]["path"] == "data/experiments/word-problems/prompts.parquet"


def test_a_model_of_another_experiment_is_never_promoted_over_in_a_shared_directory(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    first = promote_once(root, monkeypatch)["checkpoint_id"]
    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.9}, seed=1, experiment="word-problems")  # much better, but on other data
    write_experiment(root, "word-problems", directory="models")
    kept = promote_once(root, monkeypatch)
    assert not kept["promoted"] and kept["checkpoint_id"] == first
    assert "experiment 'default'" in kept["reason"] and "own promotion.directory" in kept["reason"]
    assert len(promotion.history(root / "models")) == 1


def test_rollback_never_restores_a_model_of_another_experiment_without_being_told(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    first = promote_once(root, monkeypatch)["checkpoint_id"]
    # the first model was promoted by another experiment (as before experiments were recorded, in the story)
    card_path = root / "models/versions" / first / "model_card.json"
    card_path.write_text(json.dumps({**json.loads(card_path.read_text()), "experiment": "arithmetic"}))
    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.45, 2: 0.7}, seed=2)
    better = promote_once(root, monkeypatch)["checkpoint_id"]
    with pytest.raises(ValueError, match=r"belongs to experiment 'arithmetic', not 'default'.*--allow-other-experiment"):
        promotion.rollback(root / "models", "default")
    assert weights_hash(root / "models/promoted") == better
    event = promotion.rollback(root / "models", "default", allow_other_experiment=True)
    assert event["restored_experiment"] == "arithmetic" and weights_hash(root / "models/promoted") == first


def test_a_promoted_model_from_another_evaluation_is_evaluated_again(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    promote_once(root, monkeypatch)
    (root / "params.yaml").write_text((root / "params.yaml").read_text().replace("samples_per_prompt: 2", "samples_per_prompt: 3"))
    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.6}, seed=1)
    (root / "params.yaml").write_text((root / "params.yaml").read_text().replace("samples_per_prompt: 2", "samples_per_prompt: 3"))
    evaluated = []
    monkeypatch.setattr(promotion, "_evaluate", lambda path, *args: evaluated.append(path) or 0.65)
    metadata = promote_once(root, monkeypatch)
    assert evaluated == [root / "models/promoted"]
    assert not metadata["promoted"] and metadata["previous_sampled_accuracy"] == 0.65


def test_nothing_to_promote_is_an_error_when_no_model_was_ever_promoted(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, metrics={n: {"loss": float("nan")} for n in range(3)})
    with pytest.raises(ValueError, match="no checkpoint passed its guards"):
        promote_once(root, monkeypatch)


def test_warm_start_path_only_when_asked_and_present(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path)
    params = load_params(root / "params.yaml", ["promotion.warm_start=promoted"])
    assert promotion.warm_start_path(params.promotion, root) is None
    promote_once(root, monkeypatch)
    assert promotion.warm_start_path(params.promotion, root) == root / "models/promoted"
    assert promotion.warm_start_path(load_params(root / "params.yaml").promotion, root) is None  # default: base model


def test_r00_starts_from_the_promoted_model_when_asked(tmp_path, monkeypatch):
    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.run.loaded import Loaded
    from rl_assets.run.stages import run_sft
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    from rl_assets_support import new_tiny_model

    root = make_fake_project(tmp_path)
    monkeypatch.chdir(root)
    promoted = root / "models/promoted"
    promoted_id = save_checkpoint(new_tiny_model(seed=3), build_tiny_tokenizer(), promoted, {"round": 2})
    (promoted / promotion.CARD).write_text(json.dumps({"checkpoint_id": promoted_id}))
    run_sft(load_params(root / "params.yaml", ["promotion.warm_start=promoted"]), 0, root, "cpu", Loaded())
    card = read_lineage(root / "data/r00/checkpoint")
    assert (card["checkpoint_id"], card["parent"], card["algorithm"]) == (promoted_id, promoted_id, "promoted")


def test_an_adapter_candidate_is_promoted_as_merged_weights_that_load_without_peft_or_r00(tmp_path, monkeypatch):
    import shutil
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    from ops_support import write_evaluation
    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.core.config import LoraParams
    from rl_assets.core.policy import load_trainable_policy
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    from rl_assets_support import new_tiny_model

    root = make_fake_project(tmp_path / "project", sampled={0: 0.3, 1: 0.6, 2: 0.5})
    monkeypatch.chdir(root)
    lora, r00, r01 = LoraParams(enabled=True, r=4, alpha=8, dropout=0.0), root / "data/r00/checkpoint", root / "data/r01/checkpoint"
    keep = lambda path: {k: v for k, v in read_lineage(path).items() if k != "checkpoint_id"}  # noqa: E731  the fake cards' lineage
    base_id = save_checkpoint(new_tiny_model(0), build_tiny_tokenizer(), r00, keep(r00))  # real weights in place of the fake ones
    model, tokenizer = load_trainable_policy("data/r00/checkpoint", lora, "data/r00/checkpoint")  # relative, as run_train passes it
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # trained adapters: base + adapters is not the base
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        ids = torch.tensor([[1, 10, 11, 12]])
        expected = model(input_ids=ids).logits
    adapters_id = save_checkpoint(model, tokenizer, "data/r01/checkpoint", {**keep(r01), "parent": base_id}, lora=lora)
    assert (r01 / "adapter_config.json").is_file()
    write_evaluation(root, {0: 0.3, 1: 0.6, 2: 0.5})

    metadata = promote_once(root, monkeypatch)
    promoted = root / "models/promoted"
    card = json.loads((promoted / "model_card.json").read_text())
    merged_id = weights_hash(promoted)
    assert metadata["promoted"] and metadata["source"] == "r01/checkpoint" and metadata["checkpoint_id"] == merged_id != adapters_id
    assert (promoted / "model.safetensors").is_file() and not (promoted / "adapter_config.json").exists()
    assert card["checkpoint_id"] == read_lineage(promoted)["checkpoint_id"] == merged_id  # loads like any checkpoint
    assert card["merged_from_adapters"] == {"checkpoint_id": adapters_id, "lora_base": {"path": str(r00.resolve()), "checkpoint_id": base_id}}
    assert read_lineage(promoted)["merged_from_adapters"] == card["merged_from_adapters"]
    assert weights_hash(root / "models/versions" / merged_id) == merged_id and promotion.promoted_stack(promotion.history(root / "models")) == [merged_id]
    assert "merged from LoRA adapters" in (promoted / "README.md").read_text()
    assert "already the promoted model" in promote_once(root, monkeypatch)["reason"]  # the same adapters are not promoted twice

    shutil.rmtree(root / "data/r00")  # the next run replaces r00; the promoted model must not need it
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` fails: plain transformers only
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(promoted)
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)
