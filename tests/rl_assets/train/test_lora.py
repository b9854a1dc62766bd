"""LoRA through PEFT: adapters trained on the stored table, saved per round as adapters or merged, loadable by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_assets.core.checkpoints import checkpoint_id, read_lineage, save_checkpoint
from rl_assets.core.config import LoraParams, TrainParams
from rl_assets.core.policy import load_policy, load_trainable_policy
from rl_assets.core.schemas import rewards_schema
from rl_assets.core.tokenizer import build_tiny_tokenizer
from rl_assets.train.policy_gradient import train_on_rollouts

from rl_assets_support import new_tiny_model, rollouts_table

pytest.importorskip("peft")

LORA = LoraParams(enabled=True, r=4, alpha=8, dropout=0.0)


@pytest.fixture()
def base(tmp_path):
    path = tmp_path / "r00"
    save_checkpoint(new_tiny_model(0), build_tiny_tokenizer(), path, {"round": 0})
    return path


def scored_rollouts():
    rows = [{"prompt_id": "p", "sample_idx": i, "completion_ids": ids, "logprobs": [-2.0] * len(ids)}
            for i, ids in enumerate([[6, 2], [7, 2], [8, 9, 2], [6, 6, 2]])]
    rollouts = rollouts_table(rows)
    rewards = pa.table({"round": [1] * 4, "prompt_id": ["p"] * 4, "sample_idx": [0, 1, 2, 3], "policy_id": ["x"] * 4,
                        "reward": [1.0, 0.0, 0.0, 1.0], "reward_config_hash": ["c"] * 4, "rollouts_hash": ["h"] * 4}, schema=rewards_schema([]))
    return rollouts, rewards


def train_lora(model):
    params = TrainParams(learning_rate=5e-2, epochs=2, minibatch_size=4, lora=LORA)
    return train_on_rollouts(model, *scored_rollouts(), params, group_size=4, temperature=1.0, pad_id=0, seed=0, max_new_tokens=4,
                             progress=False)


def test_only_adapters_train_and_they_save_as_a_loadable_adapter_folder(base, tmp_path):
    model, tokenizer = load_trainable_policy(base, LORA, base)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    model, metrics, _, _ = train_lora(model)
    assert metrics["steps"] == 2
    assert all(torch.equal(frozen_before[n], p) for n, p in model.named_parameters() if not p.requires_grad)

    save_checkpoint(model, tokenizer, tmp_path / "r01", {"round": 1}, lora=LORA)
    assert (tmp_path / "r01" / "adapter_config.json").is_file() and not (tmp_path / "r01" / "model.safetensors").exists()
    ids = torch.tensor([[1, 10, 11, 12]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "r01")  # transformers loads base + adapters through peft
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)

    # the next round keeps training the same adapters on the r00 weights
    again, _ = load_trainable_policy(tmp_path / "r01", LORA, base)
    with torch.no_grad():
        assert torch.allclose(again(input_ids=ids).logits, expected, atol=1e-5)
    assert any(p.requires_grad for p in again.parameters())


def test_merge_saves_full_weights_with_the_adapted_outputs(base, tmp_path):
    model, tokenizer = load_trainable_policy(base, LORA, base)
    model, _, _, _ = train_lora(model)
    ids = torch.tensor([[1, 10, 11, 12]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    merged = LORA.model_copy(update={"merge": True})
    save_checkpoint(model, tokenizer, tmp_path / "r01", {"round": 1}, lora=merged)
    assert (tmp_path / "r01" / "model.safetensors").is_file() and not (tmp_path / "r01" / "adapter_config.json").exists()
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "r01")
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)


def test_qlora_needs_a_gpu_and_cannot_merge(base):
    with pytest.raises(ValueError, match="load_in_4bit needs a CUDA device"):
        load_trainable_policy(base, LORA.model_copy(update={"load_in_4bit": True}), base, "cpu")
    with pytest.raises(ValueError, match="load_in_4bit cannot merge adapters"):
        LoraParams(enabled=True, load_in_4bit=True, merge=True)


def perturb_adapters(model, seed: int = 1):
    """Non-zero adapters, as after training (fresh LoRA B matrices are zero: base + adapters == base)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


@pytest.fixture()
def relative_adapters(tmp_path, monkeypatch):
    """A project whose r01 holds adapters trained (from the project root, as run_train does) on the relative data/r00/checkpoint."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    r00, r01 = project / "data/r00/checkpoint", project / "data/r01/checkpoint"
    save_checkpoint(new_tiny_model(0), build_tiny_tokenizer(), r00, {"round": 0})
    model, tokenizer = load_trainable_policy("data/r00/checkpoint", LORA, "data/r00/checkpoint")
    perturb_adapters(model)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([[1, 10, 11, 12]])).logits
    save_checkpoint(model, tokenizer, "data/r01/checkpoint", {"round": 1}, lora=LORA)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return r00, r01, expected


def test_adapters_name_their_base_by_absolute_path_and_id_and_load_from_any_directory(relative_adapters):
    r00, r01, expected = relative_adapters
    config = json.loads((r01 / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(r00.resolve()) and Path(config["base_model_name_or_path"]).is_absolute()
    assert read_lineage(r01)["lora_base"] == {"path": str(r00.resolve()), "checkpoint_id": checkpoint_id(r00)}
    ids = torch.tensor([[1, 10, 11, 12]])
    with torch.no_grad():  # the working directory is no longer the project root
        sampled, _ = load_policy(r01)  # rollouts, evaluation and `rl-assets generate` load it this way
        assert torch.allclose(sampled(input_ids=ids).logits, expected, atol=1e-5)
        again, _ = load_trainable_policy(r01, LORA, r00)
        assert torch.allclose(again(input_ids=ids).logits, expected, atol=1e-5)
        assert torch.allclose(AutoModelForCausalLM.from_pretrained(r01)(input_ids=ids).logits, expected, atol=1e-5)


def test_adapters_refuse_a_base_that_changed_underneath_them(relative_adapters):
    r00, r01, _ = relative_adapters
    trained_on = checkpoint_id(r00)
    replaced = save_checkpoint(new_tiny_model(1), build_tiny_tokenizer(), r00, {"round": 0})  # the next run retrained r00
    assert replaced != trained_on
    for load in (lambda: load_policy(r01), lambda: load_trainable_policy(r01, LORA, r00)):
        with pytest.raises(ValueError, match="LoRA base changed") as error:
            load()
        assert trained_on in str(error.value) and replaced in str(error.value) and str(r00.resolve()) in str(error.value)


def test_by_default_the_adapters_train_on_the_policy_that_sampled(base):
    """No adapter dropout unless asked: in train mode the log-probs are those of sampling (the first step's ratio is 1)."""
    from rl_assets.core.logprobs import completion_logprobs

    model, _ = load_trainable_policy(base, LoraParams(enabled=True, r=4, alpha=8), base)
    for module in model.modules():  # non-zero adapters, so a dropped input would show
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.5)
    prompts, completions = [[1, 10, 11]] * 2, [[12, 13, 14, 2]] * 2
    model.eval()
    with torch.no_grad():
        sampled, _ = completion_logprobs(model, prompts, completions, pad_id=0)
    model.train()
    trained, _ = completion_logprobs(model, prompts, completions, pad_id=0)
    assert torch.equal(trained.detach(), sampled)
    with_dropout, _ = load_trainable_policy(base, LoraParams(enabled=True, r=4, alpha=8, dropout=0.5), base)  # what the test would catch
    assert any(isinstance(m, torch.nn.Dropout) for m in with_dropout.modules())
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
