"""rewards/text.py: format regex, required tags, length and repetition penalties, table-driven."""

from __future__ import annotations

import pytest

from rl_assets.rewards.text import format_regex, length_penalty, repetition_penalty, required_tags


@pytest.mark.parametrize("completion,options,expected", [
    ("<think>x</think><answer>4</answer>", {"pattern": r"<think>.*?</think>\s*<answer>.*?</answer>"}, 1.0),
    ("  <think>x</think><answer>4</answer>\n", {"pattern": r"<think>.*?</think>\s*<answer>.*?</answer>"}, 1.0),
    ("<think>x\ny</think><answer>4</answer>", {"pattern": r"<think>.*?</think>\s*<answer>.*?</answer>"}, 1.0),
    ("<answer>4</answer>", {"pattern": r"<think>.*?</think>\s*<answer>.*?</answer>"}, 0.0),
    ("so the answer is 4", {"pattern": r"answer is \d+"}, 0.0),
    ("so the answer is 4", {"pattern": r"answer is \d+", "search": True}, 1.0),
    ("", {"pattern": r".*"}, 1.0),
])
def test_format_regex(completion, options, expected):
    assert format_regex([completion], **options) == [expected]


@pytest.mark.parametrize("completion,tags,expected", [
    ("<think>a</think><answer>b</answer>", ("think", "answer"), 1.0),
    ("<answer>b</answer><think>a</think>", ("think", "answer"), 1.0),  # order between tags is format_regex's job
    ("<think>a</think>", ("think", "answer"), 0.5),
    ("<think>a</think><think>b</think>", ("think",), 0.0),  # exactly once
    ("</answer>b<answer>", ("answer",), 0.0),
    ("<answer>b", ("answer",), 0.0),
    ("plain", ("a", "b", "c"), 0.0),
    ("<code>x</code>", ("code",), 1.0),
])
def test_required_tags(completion, tags, expected):
    assert required_tags([completion], tags=tags) == [expected]


@pytest.mark.parametrize("length,expected", [(0, 0.0), (10, 0.0), (15, -0.25), (30, -1.0), (100, -1.0)])
def test_length_penalty_in_tokens_and_chars(length, expected):
    assert length_penalty(["x"], completion_ids=[[1] * length], target=10, max_length=30) == [expected]
    assert length_penalty(["x" * length], target=10, max_length=30, unit="chars") == [expected]


def test_length_penalty_errors():
    with pytest.raises(ValueError, match="must exceed target"):
        length_penalty(["x"], target=5, max_length=5, unit="chars")
    with pytest.raises(ValueError, match="needs the completion_ids column"):
        length_penalty(["x"], target=1, max_length=5)


@pytest.mark.parametrize("completion,options,expected", [
    ("the cat sat on the mat", {}, 0.0),
    ("go go go go go", {"ngram_size": 1}, -0.8),
    ("go go go go go", {"ngram_size": 1, "max_penalty": -0.5}, -0.4),
    ("a b c a b c", {"ngram_size": 3}, -0.25),
    ("short", {"ngram_size": 3}, 0.0),
    ("aaaa", {"ngram_size": 2, "unit": "chars"}, -2 / 3),
    ("", {"unit": "chars"}, 0.0),
])
def test_repetition_penalty(completion, options, expected):
    assert repetition_penalty([completion], **options) == [pytest.approx(expected)]


def test_repetition_penalty_refuses_a_positive_penalty():
    with pytest.raises(ValueError, match="max_penalty must be <= 0"):
        repetition_penalty(["a"], max_penalty=1.0)
