"""episodes.py: multi-turn episodes with a scripted policy (exact turns), and training that sees the policy's tokens only."""

from __future__ import annotations

import copy
import json
import types

import pyarrow as pa
import pytest
import torch

from rl_assets.core.config import RolloutsParams, TrainParams
from rl_assets.rollout.environments import GuessTheNumber, ToolEnvironment, load_environment
from rl_assets.rollout.episodes import EnvironmentFailed, sample_episodes
from rl_assets.rollout.sampling import sample_rollouts
from rl_assets.core.tokenizer import build_tiny_tokenizer
from rl_assets.train.policy_gradient import policy_masks, train_on_rollouts

from rl_assets_support import prompts_table, shared_tiny_model

TOKENIZER = build_tiny_tokenizer()
EOS = TOKENIZER.eos_token_id


class ScriptedPolicy(torch.nn.Module):
    """Writes `script[turn]` (then EOS) whatever it is asked: a policy whose turns a test knows in advance.

    Each generate call is one turn of every episode in the batch; what comes after a turn's end is
    junk that the sampler must cut off (as a real model keeps writing until every row stops).
    """

    def __init__(self, script: list[str]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.script, self.turn = script, 0
        self.config = types.SimpleNamespace(get_text_config=lambda: types.SimpleNamespace(max_position_embeddings=256))
        self.generation_config = None

    def generate(self, input_ids, attention_mask, generation_config, stopping_criteria=None):
        text = self.script[min(self.turn, len(self.script) - 1)]
        self.turn += 1
        new = TOKENIZER(text, add_special_tokens=False)["input_ids"] + [EOS] + TOKENIZER("junk", add_special_tokens=False)["input_ids"]
        new = new[: generation_config.max_new_tokens]
        return torch.cat([input_ids, torch.tensor([new] * input_ids.shape[0])], dim=1)


def episodes(script: list[str], environment: str = "tools", options: dict | None = None, **limits):
    rows = prompts_table([("12*34", "408")]).to_pylist()
    options = {"tools": ["calculator"]} if options is None else options
    settings = {"max_new_tokens": 40, "max_turns": 4, "max_tokens": 64, **limits}
    return sample_episodes(ScriptedPolicy(script), TOKENIZER, rows, 1, load_environment(environment, options), environment, greedy=True,
                           temperature=1.0, top_p=1.0, batch_size=8, seed=0, eos_ids=[EOS], **settings)


def test_a_tool_episode_keeps_every_token_and_marks_the_tools_own():
    out = episodes(["<call calculator>12*34</call>", "408"])
    text = TOKENIZER.decode(out.completion_ids[0])
    assert text == "<call calculator>12*34</call><result>408</result>408</s>"  # the junk after each turn's end is gone
    mask = out.completion_mask[0]
    result = len("<call calculator>12*34</call>")
    assert mask == [1] * result + [0] * len("<result>408</result>") + [1] * 4  # 4, 0, 8, EOS
    assert [t["role"] for t in out.turns[0]] == ["assistant", "environment", "assistant"]
    assert [(t["start"], t["end"]) for t in out.turns[0]] == [(0, result), (result, result + 20), (result + 20, len(mask))]
    assert out.num_turns == [2] and out.truncated == [False]
    assert json.loads(out.environment_rewards[0]) == {"tool_calls": 1.0, "tool_errors": 0.0}
    assert out.tool_calls[0] == [{"turn": 1, "name": "calculator", "arguments": '{"expression": "12*34"}', "output": "408", "error": None}]


def test_a_malformed_call_is_a_tool_error_and_the_episode_goes_on():
    out = episodes(["<call calculator>12*</call>", "<call nosuch>1</call>", "7"])
    calls = out.tool_calls[0]
    assert [c["name"] for c in calls] == ["calculator", "nosuch"] and all(c["error"] for c in calls)
    assert json.loads(out.environment_rewards[0]) == {"tool_calls": 2.0, "tool_errors": 2.0}
    assert "<result>error: " in TOKENIZER.decode(out.completion_ids[0]) and out.num_turns == [3]


class Raises:
    def reset(self, row):
        return row["prompt"]

    def step(self, text):
        raise KeyError("score")


def test_an_environment_that_raises_names_the_environment_and_the_episode(monkeypatch):
    rows = prompts_table([("12*34", "408")]).to_pylist()
    with pytest.raises(EnvironmentFailed, match=r"environment 'my_env:Raises' failed on episode prompt_id='.+' sample 0 turn 1: KeyError: 'score'"):
        sample_episodes(ScriptedPolicy(["1"]), TOKENIZER, rows, 1, Raises, "my_env:Raises", greedy=True, temperature=1.0, top_p=1.0,
                        max_new_tokens=8, max_turns=2, max_tokens=16, batch_size=8, seed=0, eos_ids=[EOS])


def test_a_game_keeps_its_state_across_turns_and_an_unfinished_episode_is_truncated():
    won = episodes(["500", "400", "408"], "guess_the_number", {"high": 500}, max_turns=4)  # the row's answer, 408, is the secret
    assert TOKENIZER.decode(won.completion_ids[0]) == "500</s>lower400</s>higher408</s>"
    assert won.truncated == [False] and won.num_turns == [3] and json.loads(won.environment_rewards[0]) == {"solved": 1.0, "turns": 3.0}
    lost = episodes(["50"], "guess_the_number", {"high": 500}, max_turns=3)
    assert lost.truncated == [True] and lost.num_turns == [3] and json.loads(lost.environment_rewards[0]) == {"solved": 0.0, "turns": 3.0}


def test_the_token_budget_truncates_an_episode_mid_turn():
    out = episodes(["<call calculator>12*34</call>"], max_tokens=10)
    assert out.truncated == [True] and sum(out.completion_mask[0]) == 10 and out.tool_calls == [[]]


def test_rollouts_of_episodes_store_log_probs_for_policy_tokens_only():
    model = copy.deepcopy(shared_tiny_model())
    params = RolloutsParams(prompts_per_round=2, samples_per_prompt=2, max_new_tokens=8, max_episode_tokens=16, tools=["calculator"])
    table = sample_rollouts(model, TOKENIZER, prompts_table([("1*2", "2"), ("3*4", "12")]), params, round_number=1, seed=0,
                            policy_id="p", prompts_hash="h")
    for row in table.to_pylist():
        assert len(row["logprobs"]) == len(row["completion_ids"]) == len(row["completion_mask"])
        assert all(value == 0.0 for value, keep in zip(row["logprobs"], row["completion_mask"]) if not keep)
        assert row["environment"] == "tools" and row["num_turns"] >= 1


def _episode_table() -> pa.Table:
    """Two groups of two episodes each; in every episode the calculator's 20 result tokens sit between two policy turns."""
    call, result, answer = (TOKENIZER(t, add_special_tokens=False)["input_ids"] for t in ("<call calculator>2*3</call>", "<result>6</result>", "6"))
    rows = []
    for prompt_index, prompt in enumerate(["2*3=", "3*2="]):
        for sample in range(2):
            ids = call + result + answer + [EOS] * (sample + 1)
            mask = [1] * len(call) + [0] * len(result) + [1] * (len(answer) + sample + 1)
            rows.append({"round": 1, "prompt_id": f"p{prompt_index}", "sample_idx": sample, "prompt": prompt, "answer": "6",
                         "prompt_ids": TOKENIZER(prompt)["input_ids"], "completion_ids": ids, "completion_mask": mask,
                         "logprobs": [-1.0 if keep else 0.0 for keep in mask], "sampler_logprobs": None, "truncated": False})
    return pa.Table.from_pylist(rows)


def _trained(table: pa.Table) -> dict[str, torch.Tensor]:
    rewards = pa.table({"prompt_id": table["prompt_id"], "sample_idx": table["sample_idx"], "reward": [1.0, 0.0, 0.0, 1.0]})
    params = TrainParams(learning_rate=1e-2, epochs=1, minibatch_size=4, beta=0.04, mixed_precision="no")
    model = copy.deepcopy(shared_tiny_model())
    trained, *_ = train_on_rollouts(model, table, rewards, params, group_size=2, temperature=1.0, pad_id=TOKENIZER.pad_token_id, seed=0,
                                    max_new_tokens=16, ref_model=copy.deepcopy(shared_tiny_model()), progress=False)
    return {name: value.detach().clone() for name, value in trained.state_dict().items()}


def test_tool_tokens_carry_no_loss_and_no_kl():
    """What is stored for the tool's tokens cannot change the update; what is stored for the policy's does (the test can fail)."""
    table = _episode_table()
    before = _trained(table)
    logprobs = table["logprobs"].to_pylist()
    masks = policy_masks(table)
    garbage = [[value if keep else 9.0 for value, keep in zip(row, mask)] for row, mask in zip(logprobs, masks)]
    after = _trained(table.set_column(table.column_names.index("logprobs"), "logprobs", pa.array(garbage)))
    assert all(torch.equal(before[name], after[name]) for name in before)
    moved = [[value - 0.5 if keep else value for value, keep in zip(row, mask)] for row, mask in zip(logprobs, masks)]
    changed = _trained(table.set_column(table.column_names.index("logprobs"), "logprobs", pa.array(moved)))
    assert any(not torch.equal(before[name], changed[name]) for name in before)


def test_a_single_completion_is_all_policy_tokens():
    table = pa.table({"completion_ids": [[5, 6, EOS]], "completion_mask": pa.array([None], pa.list_(pa.int8()))})
    assert policy_masks(table) == [[1, 1, 1]]


def test_tool_environment_ends_a_turn_at_its_call():
    assert ToolEnvironment(["calculator"]).stop_strings == ("</call>",)
    assert ToolEnvironment(["calculator"], format="hermes").stop_strings == ("</tool_call>",)
    assert not hasattr(GuessTheNumber(), "stop_strings")


def test_with_a_chat_template_an_observation_is_a_tool_turn_of_that_template():
    from real_models import build_bpe_tokenizer

    from rl_assets.rollout.episodes import observation_ids

    tokenizer = build_bpe_tokenizer("qwen2")  # Qwen2.5's ChatML: a turn ends with <|im_end|>, which is also EOS
    after_a_call = tokenizer.decode(observation_ids(tokenizer, "<result>6</result>", False, "<|im_end|>"))
    assert after_a_call == "<|im_end|>\n<|im_start|>tool\n<result>6</result><|im_end|>\n<|im_start|>assistant\n"
    after_eos = tokenizer.decode(observation_ids(tokenizer, "lower", True, "<|im_end|>"))
    assert after_eos == "\n<|im_start|>tool\nlower<|im_end|>\n<|im_start|>assistant\n"  # the policy closed its turn itself
    assert TOKENIZER.decode(observation_ids(TOKENIZER, "lower", True, "</s>")) == "lower"  # no template: the text as it is
