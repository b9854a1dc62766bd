"""LoRA through PEFT: adapters trained on the stored table, saved per round as adapters or merged, loadable by transformers."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_assets.checkpoints import save_checkpoint
from rl_assets.config import LoraParams, TrainParams
from rl_assets.models import build_tiny_tokenizer, load_trainable_policy
from rl_assets.schemas import rewards_schema
from rl_assets.train import train_on_rollouts

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
