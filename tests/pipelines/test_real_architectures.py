"""The whole micro pipeline (`python -m pipelines run`) on real-shaped models instead of `tiny`.

For each architecture a locally built Qwen2 / Llama / GPT-2 folder (tests/real_models.py: byte-level
BPE tokenizer, chat template, several end-of-turn ids, deliberately odd generation_config defaults)
is saved inside the micro project and named by a relative `model.name_or_path`; Qwen2 and Llama
prompts go through their chat templates. The stored rollouts must feed one BOS, cut completions at
the first end id of any kind, and every checkpoint must load back with the Auto classes.
"""

from __future__ import annotations

import time

import pytest
import yaml

from conftest import MICRO_OUTPUTS, python
from real_models import ARCHS, LENGTH_REWARD, TOKENIZER_STYLE, end_token_ids, expected_prompt_ids, leading_count, save_real_model
from rl_assets.core.schemas import read_table

pytestmark = pytest.mark.e2e

# The last end id of the generation config (Qwen2 <|endoftext|>, Llama <|end_of_text|>, GPT-2's only one)
# made a frequent sample (real_models.boost_token): a random model would emit it once in ~1500 tokens,
# and then no run would show whether completions stop on it. The SFT warm start would undo the boost
# within its 5 steps at the micro learning rate (it is the one wrong prediction every gradient pushes
# down), so it runs at SFT_LEARNING_RATE here: the TRL code path on the real tokenizer, barely a change.
END_BOOST = 1.6
SFT_LEARNING_RATE = 1e-5
MAX_PROMPT_TOKENS = 96  # a Llama 3 chat prompt of the micro problems is ~40-55 tokens in the test BPE


@pytest.mark.parametrize("arch", ARCHS)
def test_micro_pipeline_on_a_real_architecture(micro_copy, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    project = micro_copy
    base = save_real_model(project / "models_base" / arch, arch, seed=0, end_boost=END_BOOST)
    chat = arch != "gpt2"
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["model"] = {"name_or_path": f"models_base/{arch}"}
    params["prompts"].update(chat_template=chat, max_prompt_tokens=MAX_PROMPT_TOKENS)
    params["sft"]["learning_rate"] = SFT_LEARNING_RATE
    with (project / "micro_rewards.py").open("a") as module:
        module.write(LENGTH_REWARD)
    params["rewards"]["functions"].append({"name": "micro_rewards:text_length", "weight": 0.5})
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    started = time.perf_counter()
    python(["-m", "pipelines", "run"], project, timeout=900, RL_ASSETS_DVC_COMMIT="0")  # DVC recording is test_dvc's business
    print(f"{arch}: pipeline ran in {time.perf_counter() - started:.0f} s")

    base_tokenizer = AutoTokenizer.from_pretrained(base)
    end_ids = end_token_ids(base_tokenizer, TOKENIZER_STYLE[arch])

    # every problem survived the length filter, chat-wrapped when asked for
    raw = read_table(project / MICRO_OUTPUTS["raw_data"], "raw_data")
    prompts = read_table(project / MICRO_OUTPUTS["prompts"], "prompts")
    assert prompts.num_rows == len(set(zip(raw["prompt"].to_pylist(), raw["answer"].to_pylist()))) > 0
    assert max(prompts["n_tokens"].to_pylist()) <= MAX_PROMPT_TOKENS
    if chat:
        assert all(p.startswith(("<|im_start|>", "<|begin_of_text|>")) for p in prompts["prompt"].to_pylist())

    # the rollouts: one BOS at most, completions cut at the first end id of either kind
    tokenizer = AutoTokenizer.from_pretrained(project / MICRO_OUTPUTS["r00/checkpoint"])
    assert tokenizer.chat_template == base_tokenizer.chat_template
    rollouts = read_table(project / MICRO_OUTPUTS["r01/rollouts"], "rollouts").to_pylist()
    assert rollouts
    for row in rollouts:
        assert leading_count(row["prompt_ids"], tokenizer.bos_token_id) <= 1, row["prompt_ids"][:4]
        if arch == "llama":
            assert leading_count(row["prompt_ids"], tokenizer.bos_token_id) == 1
        assert row["prompt_ids"] == expected_prompt_ids(tokenizer, row["prompt"])
        ids = row["completion_ids"]
        assert sum(t in end_ids for t in ids) <= 1 and not any(t in end_ids for t in ids[:-1]), ids
        assert row["truncated"] == (not ids or ids[-1] not in end_ids)
        assert len(row["logprobs"]) == len(ids)
        assert "<|" not in row["completion"]
    assert any(row["completion_ids"][-1] == end_ids[-1] for row in rollouts), "no completion stopped on the boosted end id"

    assert (project / MICRO_OUTPUTS["evaluation"]).is_file()
    evaluation = read_table(project / MICRO_OUTPUTS["evaluation"], "evaluation")
    assert set(evaluation["checkpoint"].to_pylist()) == {"r00/checkpoint", "r01/checkpoint"}

    trained = AutoModelForCausalLM.from_pretrained(project / MICRO_OUTPUTS["r01/checkpoint"])
    assert trained.config.model_type == arch and trained.get_input_embeddings().weight.shape[0] == len(base_tokenizer)
    AutoTokenizer.from_pretrained(project / MICRO_OUTPUTS["r01/checkpoint"])
