"""sft.py: our `sft` section mapped onto TRL's SFTConfig, and a short warm start on the sft split."""

from __future__ import annotations

import pytest
import torch

from rl_assets.core.config import SFTParams
from rl_assets.train.sft import sft_config, warm_start
from rl_assets.core.tokenizer import build_tiny_tokenizer

from rl_assets_support import new_tiny_model, prompts_table


def test_sft_config_maps_our_section(tmp_path):
    config = sft_config(SFTParams(learning_rate=1e-3, max_steps=40, batch_size=8), str(tmp_path), seed=5, use_cpu=True)
    assert (config.learning_rate, config.max_steps, config.per_device_train_batch_size) == (1e-3, 40, 8)
    assert (config.seed, config.data_seed, config.use_cpu, config.bf16) == (5, 5, True, False)
    assert config.warmup_steps == 2 and config.logging_steps == 4
    assert config.completion_only_loss is True and config.save_strategy == "no"


def test_warm_start_trains_on_sft_rows_only():
    problems = [(f"{a}+1=", str(a + 1)) for a in range(12)]
    prompts = prompts_table(problems, [["sft", "rl", "eval", "sft"][a % 4] for a in range(12)])  # 6 sft rows
    model = new_tiny_model(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = warm_start(model, build_tiny_tokenizer(), prompts, SFTParams(max_steps=2, batch_size=4, learning_rate=1e-2), seed=0)
    assert metrics["sft_examples"] == 6 and metrics["sft_steps"] == 2
    assert metrics["sft_loss_first"] is not None and metrics["sft_loss_first"] > 0
    assert not model.training
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_warm_start_without_sft_rows():
    prompts = prompts_table([("1+1=", "2"), ("1+2=", "3")], ["rl", "eval"])
    with pytest.raises(ValueError, match="no 'sft' split rows"):
        warm_start(new_tiny_model(0), build_tiny_tokenizer(), prompts, SFTParams(max_steps=1), seed=0)


def test_sft_examples_are_the_generation_prompt_ids_then_the_answer_and_eos():
    from rl_assets.data.prompts import encode_prompts
    from rl_assets.train.sft import sft_examples

    tokenizer = build_tiny_tokenizer()
    examples = sft_examples(tokenizer, ["1+1=", "<s>3*4="], ["2", "12"])  # the second starts with the BOS text, like a chat template
    prompt_ids = encode_prompts(tokenizer, ["1+1=", "<s>3*4="])
    assert prompt_ids[1][:2] != [tokenizer.bos_token_id] * 2  # one BOS, not two
    for ids, mask, prompt, answer in zip(examples["input_ids"], examples["completion_mask"], prompt_ids, ["2", "12"]):
        assert ids[: len(prompt)] == prompt and ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[len(prompt) : -1]) == answer
        assert mask == [0] * len(prompt) + [1] * (len(answer) + 1)


def test_demonstration_episodes_train_on_the_policy_turns_and_not_on_the_tool_result():
    from rl_assets.rollout.environments import load_environment
    from rl_assets.train.sft import demonstration_examples

    tokenizer = build_tiny_tokenizer()
    rows = [{"prompt_id": "p", "prompt": "12*34=", "problem": "12*34", "answer": "408"}]
    examples = demonstration_examples(tokenizer, rows, ["<call calculator>{problem}</call>", "{answer}"],
                                      load_environment("tools", {"tools": ["calculator"]}), "tools")
    ids, mask = examples["input_ids"][0], examples["completion_mask"][0]
    assert tokenizer.decode(ids) == "<s>12*34=<call calculator>12*34</call><result>408</result>408</s>"  # the calculator's real answer
    trained = tokenizer.decode([token for token, keep in zip(ids, mask) if keep])
    assert trained == "<call calculator>12*34</call>408</s>"


def test_a_demonstration_the_environment_cuts_short_or_that_names_a_missing_column_is_refused():
    from rl_assets.rollout.environments import load_environment
    from rl_assets.train.sft import demonstration_examples

    tokenizer, tools = build_tiny_tokenizer(), load_environment("tools", {"tools": ["calculator"]})
    rows = [{"prompt_id": "p", "prompt": "12*34=", "problem": "12*34", "answer": "408"}]
    with pytest.raises(ValueError, match=r"environment 'tools' ended the episode after turn 1 of 2 for prompt_id='p' \('408'\)"):
        demonstration_examples(tokenizer, rows, ["{answer}", "{answer}"], tools, "tools")  # no call: the tool environment is done
    with pytest.raises(ValueError, match=r"sft.demonstration\[0\]: '<call calculator>\{question\}</call>' names 'question'"):
        demonstration_examples(tokenizer, rows, ["<call calculator>{question}</call>", "{answer}"], tools, "tools")
