"""evaluation.py: held-out prompts, the greedy and sampled rows; and the text report a run ends with (reports.summary_text)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rl_assets.core.config import EvaluationParams, RewardFunctionParams, RewardsParams
from rl_assets.eval.evaluation import correctness_function, eval_prompts, evaluate_checkpoint
from rl_assets.core.paths import output_path
from rl_assets.eval.reports import summary_text
from rl_assets.rollout.generation import Completions
from rl_assets.core.schemas import EVALUATION, write_table
from rl_assets.core.tokenizer import build_tiny_tokenizer

from rl_assets_support import prompts_table, shared_tiny_model

PROBLEMS = [(f"{a}+1=", str(a + 1)) for a in range(6)]
SPLITS = ["eval", "rl", "eval", "eval", "sft", "eval"]


def test_eval_prompts_takes_eval_rows_up_to_the_limit():
    held_out = eval_prompts(prompts_table(PROBLEMS, SPLITS), EvaluationParams(max_prompts=3))
    assert held_out["problem"].to_pylist() == ["0+1=", "2+1=", "3+1="]


def test_eval_prompts_without_eval_rows():
    with pytest.raises(ValueError, match="no eval split rows"):
        eval_prompts(prompts_table(PROBLEMS, ["rl", "sft"] * 3), EvaluationParams())


ARITHMETIC = RewardsParams(functions=[RewardFunctionParams(name="arithmetic_answer")])


def test_evaluate_checkpoint_rows():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    held_out = eval_prompts(prompts_table(PROBLEMS, SPLITS), EvaluationParams(max_prompts=4))
    params = EvaluationParams(samples_per_prompt=2, max_new_tokens=3, temperature=0.8)
    greedy, sampled = evaluate_checkpoint(tiny_model, tokenizer, held_out, params, seed=0, rewards=ARITHMETIC)
    assert (greedy["mode"], greedy["n_samples"], greedy["temperature"]) == ("greedy", 1, 0.0)
    assert (sampled["mode"], sampled["n_samples"], sampled["temperature"]) == ("sampled", 2, 0.8)
    for row in (greedy, sampled):
        assert row["n_prompts"] == 4 and 0.0 <= row["accuracy"] <= row["pass_at_k"] <= 1.0
        assert row["correctness"] == "arithmetic_answer"
        assert 1 <= row["mean_completion_tokens"] <= 3
        assert [e[0] for e in row["examples"]] == held_out["prompt"].to_pylist()


def _scripted_generate(texts: list[str]):
    """A stand-in for `generate` that returns these completions in order, so the scores are known."""
    def fake(model, tokenizer, prompts, samples, **kwargs):
        chosen = texts[: len(prompts) * samples] if samples > 1 else texts[: len(prompts) * 2 : 2]
        return Completions([[1]] * len(chosen), [[5, 2]] * len(chosen), chosen, [False] * len(chosen))
    return fake


def test_accuracy_is_the_configured_reward_not_the_first_number(monkeypatch):
    """GSM8K-style: the answer comes last; a first-number rule would call every completion here wrong (or right by luck)."""
    held_out = eval_prompts(prompts_table([("Tom has 3 apples and buys 4. How many?", "7"), ("2 times 6?", "12")], ["eval", "eval"]),
                            EvaluationParams())
    texts = ["3 + 4 = 7. #### 7", "He has 3, then 9. #### 9", "2 * 6 = 12 \\boxed{12}", "6 doubled is \\boxed{12}"]
    monkeypatch.setattr("rl_assets.eval.evaluation.generate", _scripted_generate(texts))
    rewards = RewardsParams(functions=[RewardFunctionParams(name="format_regex", weight=0.5, options={"pattern": ".*boxed.*"}),
                                       RewardFunctionParams(name="math_answer", weight=1.0)])
    _, sampled = evaluate_checkpoint(None, None, held_out, EvaluationParams(samples_per_prompt=2, correctness="math_answer"), 0, rewards)
    assert sampled["accuracy"] == 0.75 and sampled["pass_at_k"] == 1.0 and sampled["correctness"] == "math_answer"
    assert sampled["reward_mean"] == pytest.approx((1 + 0 + 1.5 + 1.5) / 4)
    assert sampled["correct_per_prompt"] == [1, 2]  # what the paired standard error is computed from
    _, by_default = evaluate_checkpoint(None, None, held_out, EvaluationParams(samples_per_prompt=2), 0, rewards)
    assert by_default["correctness"] == "format_regex" and by_default["accuracy"] == 0.5  # the first function, unless told


def test_correctness_must_name_a_reward_function():
    from rl_assets.core.config import ParamsError
    from rl_assets.core.params_file import parse_params
    from rl_assets.run.preflight import check_user_code

    raw = {"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "rewards": {"functions": [{"name": "math_answer"}]},
           "evaluation": {"correctness": "math_anwser"}}
    with pytest.raises(ParamsError, match="evaluation.correctness: 'math_anwser' is not one of the reward functions \\['math_answer'\\]"):
        check_user_code(parse_params(raw))  # the preflight's check, after the reward functions load
    with pytest.raises(ValueError, match="evaluation.correctness: 'math_anwser' is not one of"):  # a run the preflight did not see
        correctness_function(parse_params(raw).evaluation, parse_params(raw).rewards)


def test_summary_text(tmp_path):
    rows = [{"checkpoint": c, "checkpoint_id": i, "mode": m, "accuracy": a, "reward_mean": a, "pass_at_k": min(1.0, 2 * a),
             "correctness": "arithmetic_answer", "n_prompts": 8, "n_samples": n,
             "mean_completion_tokens": 2.0, "temperature": t, "seed": 0}
            for c, i, base in [("r00/checkpoint", "aaaaaaaaaaaaaaaa", 0.25), ("r01/checkpoint", "bbbbbbbbbbbbbbbb", 0.5)]
            for m, a, n, t in [("greedy", base, 1, 0.0), ("sampled", base / 2, 4, 1.0)]]
    write_table(pa.Table.from_pylist(rows, schema=EVALUATION), output_path("evaluation", tmp_path), EVALUATION, "evaluation")
    lines = summary_text(tmp_path).splitlines()
    assert lines[0] == "held-out accuracy by arithmetic_answer (greedy; sampled at T=1.0, 4 samples/prompt, 8 prompts; gain vs r00 ± paired SE)"
    assert lines[1].split()[-2:] == ["pass@4", "reward"]
    assert lines[2].split() == ["r00/checkpoint", "aaaaaaaaaaaa", "0.250", "0.125", "+0.0p", "0.250", "0.125"]
    assert lines[3].split() == ["r01/checkpoint", "bbbbbbbbbbbb", "0.500", "0.250", "+12.5p", "0.500", "0.250"]


def test_greedy_is_optional(monkeypatch):
    held_out = eval_prompts(prompts_table([("2 times 6?", "12")], ["eval"]), EvaluationParams())
    calls = []
    scripted = _scripted_generate(["12", "13"])
    monkeypatch.setattr("rl_assets.eval.evaluation.generate", lambda *a, **k: calls.append(k["greedy"]) or scripted(*a, **k))
    rows = evaluate_checkpoint(None, None, held_out, EvaluationParams(samples_per_prompt=2, greedy=False), 0, ARITHMETIC)
    assert [r["mode"] for r in rows] == ["sampled"] and calls == [False]  # no greedy pass is generated at all
    assert rows[0]["correct_per_prompt"] == [1] and rows[0]["accuracy"] == 0.5


def test_paired_standard_error_is_smaller_than_unpaired():
    """Prompts that are hard for both checkpoints cancel: the paired SE is what a 150-prompt set can resolve."""
    from rl_assets.eval.stats import paired_difference

    first = [0, 0, 4, 4, 1, 3] * 25  # 150 prompts, 4 samples each
    later = [1, 0, 4, 4, 2, 4] * 25
    gain, se = paired_difference(first, later, 4)
    assert gain == pytest.approx(3 / 24)
    unpaired = sum(((x / 4 - sum(v) / len(v) / 4) ** 2 for v in (first, later) for x in v)) / (len(first) - 1) / len(first)
    assert se < unpaired ** 0.5 / 3
    with pytest.raises(ValueError, match="same prompts: 150 against 149"):
        paired_difference(first, later[:-1], 4)


def test_summary_text_with_gain_and_no_greedy(tmp_path):
    rows = [{"checkpoint": c, "checkpoint_id": c[:3] * 4, "mode": "sampled", "accuracy": a, "reward_mean": a, "pass_at_k": a,
             "correctness": "math_answer", "n_prompts": 150, "n_samples": 2, "mean_completion_tokens": 6.0, "temperature": 0.7, "seed": 0,
             "gain": g, "gain_se": se} for c, a, g, se in [("r00/checkpoint", 0.3, 0.0, None), ("r01/checkpoint", 0.45, 0.15, 0.032)]]
    write_table(pa.Table.from_pylist(rows, schema=EVALUATION), output_path("evaluation", tmp_path), EVALUATION, "evaluation")
    lines = summary_text(tmp_path).splitlines()
    assert lines[0] == "held-out accuracy by math_answer (sampled at T=0.7, 2 samples/prompt, 150 prompts; gain vs r00 ± paired SE)"
    assert lines[2].split() == ["r00/checkpoint", "r00r00r00r00", "-", "0.300", "+0.0p", "0.300", "0.300"]
    assert lines[3].split() == ["r01/checkpoint", "r01r01r01r01", "-", "0.450", "+15.0", "±", "3.2p", "0.450", "0.450"]


def test_an_edited_reward_module_is_another_evaluation(tmp_path, monkeypatch):
    """The cached result of r00 must not outlive the reward code that scored it: the key covers the user's module."""
    from rl_assets.core.params_file import parse_params
    from rl_assets.eval.evaluation import evaluation_key

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def exact(completions, answer, **kwargs):\n    return [float(c == a) for c, a in zip(completions, answer)]\n")
    prompts = output_path("prompts", tmp_path / "data")
    prompts.parent.mkdir(parents=True)
    prompts.write_bytes(b"the same held-out prompts")
    raw = {"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "rewards": {"functions": [{"name": "my_rewards:exact"}]}}
    params = parse_params(raw)
    before = evaluation_key(params, tmp_path / "data")
    assert evaluation_key(params, tmp_path / "data") == before  # nothing changed: the result is reused
    (tmp_path / "my_rewards.py").write_text("def exact(completions, answer, **kwargs):\n    return [float(a in c) for c, a in zip(completions, answer)]\n")
    assert evaluation_key(params, tmp_path / "data") != before


def test_stored_completions_of_modes_typed_apart_read_back_as_they_were(tmp_path):
    """Greedy episodes without a failed tool call type `error` as null, sampled ones with one as string: both are kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rl_assets.eval.evaluation import completions_table, stored_completions

    greedy = pa.table({"completion": ["4"], "tool_calls": [[{"name": "calculator", "error": None}]], "image_ids": [[]]})
    sampled = pa.table({"completion": ["4", "x"], "tool_calls": [[], [{"name": "calculator", "error": "bad"}]], "image_ids": [[], ["a"]]})
    pq.write_table(completions_table({"greedy": greedy, "sampled": sampled}), tmp_path / "c.parquet")
    back = stored_completions(tmp_path / "c.parquet")
    assert list(back) == ["greedy", "sampled"]
    assert back["greedy"].to_pylist() == greedy.to_pylist() and back["sampled"].to_pylist() == sampled.to_pylist()
