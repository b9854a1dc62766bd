"""models.py: the embedded tokenizer and model, and their reload through the Auto classes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_assets.core.config import ModelParams
from rl_assets.core.policy import load_base_model, load_policy, pick_device
from rl_assets.core.tokenizer import SPECIAL_TOKENS, TINY_CHARACTERS, build_tiny_tokenizer, load_tokenizer

from rl_assets_support import TINY, new_tiny_model, shared_tiny_model

TEXTS = ["12+7=", "3*4=12", "a b", "100-42=58\n"]


def test_tiny_tokenizer_round_trip_with_bos():
    tokenizer = build_tiny_tokenizer()
    ids = tokenizer("12+7=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 1 + len("12+7=")
    assert ids[1:] == [tokenizer.convert_tokens_to_ids(c) for c in "12+7="]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+7="
    for text in TEXTS:
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_tiny_tokenizer_vocabulary():
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(set(TINY_CHARACTERS))
    assert [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id] == [0, 1, 2, 3]
    assert tokenizer("é")["input_ids"] == [tokenizer.bos_token_id, tokenizer.unk_token_id]


def test_tiny_model_is_determined_by_the_seed():
    first, again, other = new_tiny_model(0), new_tiny_model(0), new_tiny_model(1)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))
    assert first.config.vocab_size == len(build_tiny_tokenizer()) and first.config.hidden_size == TINY.tiny.hidden_size


def test_save_and_reload_with_auto_classes(tmp_path):
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    reloaded_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    reloaded_model.eval()
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert reloaded_tokenizer(text)["input_ids"] == ids
        assert reloaded_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert (reloaded_tokenizer.pad_token_id, reloaded_tokenizer.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(tiny_model(**batch).logits, reloaded_model(**batch).logits)


def test_load_policy_returns_an_eval_model(tmp_path):
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, loaded_tokenizer = load_policy(tmp_path)
    assert not model.training and next(model.parameters()).device.type == "cpu"
    assert loaded_tokenizer("1+1=")["input_ids"] == tokenizer("1+1=")["input_ids"]


def test_load_base_model_tiny():
    model, tokenizer = load_base_model(TINY, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), new_tiny_model(0).state_dict().values()))
    assert tokenizer("1")["input_ids"] == build_tiny_tokenizer()("1")["input_ids"]
    assert len(load_tokenizer(ModelParams())) == len(tokenizer)


@pytest.mark.parametrize("requested", ["cpu", "cuda"])
def test_pick_device_keeps_an_explicit_choice(requested):
    assert pick_device(requested) == requested


def test_pick_device_auto():
    assert pick_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_trainable_policy_loads_fp32_master_weights_unless_pure_bf16_asks_for_bf16(tmp_path):
    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.core.config import LoraParams
    from rl_assets.core.policy import load_trainable_policy

    path = tmp_path / "ckpt"
    save_checkpoint(new_tiny_model(0).to(torch.bfloat16), build_tiny_tokenizer(), path, {"round": 0})  # a bf16 checkpoint, as hub models ship
    assert {p.dtype for p in load_trainable_policy(path, LoraParams(), path)[0].parameters()} == {torch.float32}
    assert {p.dtype for p in load_trainable_policy(path, LoraParams(), path, dtype=torch.bfloat16)[0].parameters()} == {torch.bfloat16}
